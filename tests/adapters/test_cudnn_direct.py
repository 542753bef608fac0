"""CPU checks of the direct TVM-FFI call of cuDNN's SM90 blk64 forward (adapters/cudnn_bsa_direct.py).

Fast: :func:`direct_problems`'s reasons on plain facts (arch, version, block, kv_splits, dtype,
head dims, MHA, q_len, empty, alignment), :func:`call_facts` on CPU tensors of both layouts, the
``FASTVIDEO_VSA_CUDNN_DIRECT`` switch, the predicate's constants against the kernel module's, and
the compile key against every configuration field.

Slow (one subprocess, ``CUTE_DSL_ARCH=sm_90a``, driver queries faked as in
tests/adapters/test_cudnn_compile.py, whose helpers it reuses): the direct kernel compiles for
sm_90a through ``jit.compile_kernel(need_cubin=True)`` in four configurations, each cubin has
HGMMA and TMA loads (triton's nvdisasm); against the kernel cuDNN's own wrapper compiles for the
same call (BHSD, B=2, q_len != kv_len): without block sizes the SASS is instruction for
instruction the same, with block sizes (rank 1 here, broadcast in our entry; a contiguous
``[B, H, KVb]`` copy in cuDNN's) every floating-point and tensor-core opcode count is the same
(only address arithmetic differs); and an exported kernel loads from the disk cache in a fresh
process. Correctness on a GPU: tests/adapters/test_cudnn_direct_gpu.py.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from fastvideo_cute.adapters import cudnn_bsa_direct as D
from fastvideo_cute.errors import EnvError

ROOT = Path(__file__).resolve().parents[2]


def _have_cudnn() -> bool:
    try:
        return all(importlib.util.find_spec(m) is not None for m in ("cudnn", "cutlass", "tvm_ffi"))
    except (ImportError, ValueError):
        return False


needs_cudnn = pytest.mark.skipif(not _have_cudnn(), reason="nvidia-cudnn-frontend / nvidia-cutlass-dsl not importable")


# =============================================================================================
# The predicate
# =============================================================================================


def _contiguous(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _facts(**over):
    shape = (2, 256, 4, 128)  # BSHD
    base = dict(capability=(9, 0), cudnn_version="1.32.0", dtype=torch.bfloat16, head_dim=128, value_dim=128,
                heads_q=4, heads_kv=4, q_len=256, sparse_block=64, kv_splits=1, empty=False,
                layouts=[(n, 4096 * (i + 1), 2, shape, _contiguous(shape)) for i, n in enumerate("qkv")])
    base.update(over)
    return D.DirectFacts(**base)


def test_the_h200_call_is_served():
    assert D.direct_problems(_facts()) is None
    for dtype in (torch.float16, torch.bfloat16):
        for d in (64, 96, 128):
            assert D.direct_problems(_facts(dtype=dtype, head_dim=d, value_dim=d)) is None


@pytest.mark.parametrize("over, words", [
    (dict(capability=None), "not a CUDA tensor"),
    (dict(capability=(10, 0)), "10.0"),
    (dict(capability=(8, 0)), "SM90 only"),
    (dict(capability=(12, 1)), "SM90 only"),
    (dict(cudnn_version="1.31.0"), "1.31.0"),
    (dict(cudnn_version=None), "not installed"),
    (dict(sparse_block=128), "blk64"),
    (dict(kv_splits=2), "kv_splits=2"),
    (dict(dtype=torch.float32), "fp16/bf16"),
    (dict(head_dim=256, value_dim=256), "head_dim 256"),
    (dict(value_dim=32), "value_dim 32"),
    (dict(heads_kv=2), "MHA"),
    (dict(q_len=96), "q_len 96"),
    (dict(empty=True), "empty"),
])
def test_refusals_name_their_reason(over, words):
    reason = D.direct_problems(_facts(**over))
    assert reason is not None and words in reason, reason
    assert "\n" not in reason


@pytest.mark.parametrize("layout, words", [
    (("k", 4096 + 64, 2, (2, 256, 4, 128), _contiguous((2, 256, 4, 128))), "k's base address is not 128-byte"),
    (("v", 4096, 2, (2, 256, 4, 128), (256 * 4 * 136, 4 * 136, 136, 1)), None),     # padded rows: 272 B, fine
    (("v", 4096, 2, (2, 256, 4, 128), (256 * 4 * 132, 4 * 132, 132, 1)), "stride 132"),  # 264 B
    (("q", 4096, 2, (1, 256, 4, 128), (7, 512, 128, 1)), "stride 7"),  # a size-1 mode's stride counts too
    (("q", 4096, 2, (2, 256, 4, 128), (131072, 512, 1, 4)), "non-unit last stride"),
])
def test_alignment(layout, words):
    layouts = [layout] + [(n, 4096, 2, (2, 256, 4, 128), _contiguous((2, 256, 4, 128))) for n in "kv" if n != layout[0]]
    reason = D.direct_problems(_facts(layouts=layouts))
    if words is None:
        assert reason is None, reason
    else:
        assert reason is not None and words in reason, reason


@pytest.mark.parametrize("bshd", [True, False])
def test_call_facts_read_the_layout(bshd):
    b, s, skv, h, d = 2, 192, 320, 3, 64
    qshape = (b, s, h, d) if bshd else (b, h, s, d)
    kshape = (b, skv, h, d) if bshd else (b, h, skv, d)
    q = torch.zeros(qshape, dtype=torch.float16)
    k = torch.zeros(kshape, dtype=torch.float16)
    f = D.call_facts(q, k, k, bshd=bshd, sparse_block=64, capability=(9, 0))
    assert (f.q_len, f.heads_q, f.heads_kv, f.head_dim, f.value_dim) == (s, h, h, d, d)
    assert f.dtype == torch.float16 and not f.empty and f.kv_splits == 1
    assert [lay[0] for lay in f.layouts] == ["q", "k", "v"] and f.layouts[0][3:] == (qshape, q.stride())
    # CPU tensors: the real entry point refuses them before anything else
    assert D.direct_fwd_problems(q, k, k, bshd=bshd, sparse_block=64) == "not a CUDA tensor"


def test_env_switch(monkeypatch):
    q = torch.zeros(1, 64, 1, 64, dtype=torch.float16)
    monkeypatch.delenv(D.DIRECT_ENV, raising=False)
    assert D.direct_enabled()
    for off in ("0", "off", "false"):
        monkeypatch.setenv(D.DIRECT_ENV, off)
        assert not D.direct_enabled()
        assert D.DIRECT_ENV in D.direct_fwd_problems(q, q, q, bshd=True, sparse_block=64)
    monkeypatch.setenv(D.DIRECT_ENV, "1")
    assert D.direct_enabled() and D.direct_fwd_problems(q, q, q, bshd=True, sparse_block=64) == "not a CUDA tensor"
    monkeypatch.setenv(D.DIRECT_ENV, "sometimes")
    with pytest.raises(EnvError, match=D.DIRECT_ENV):
        D.direct_fwd_problems(q, q, q, bshd=True, sparse_block=64)


def test_importing_the_host_path_imports_neither_cudnn_nor_the_dsl():
    code = ("import sys; import fastvideo_cute.adapters.cudnn_bsa_direct; "
            "print(sorted(m for m in sys.modules if m == 'cudnn' or m.startswith(('cudnn.', 'cutlass', 'triton', "
            "'tvm_ffi', 'fastvideo_cute.adapters.cudnn_bsa_direct_kernel'))))")
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# =============================================================================================
# The host path's tensors (a recorder stands in for the compiled entry: no DSL, no GPU)
# =============================================================================================


def _cudnn_views(q, k, v, out, lse, idx, num, bshd):
    """What cuDNN's wrapper hands its kernel (bsa_attn_fwd: BSHD -> ``transpose(1, 2)``;
    _bsa_attn_fwd_sm90_blk64: the permutes), re-derived here independently of the module."""
    if bshd:
        q, k, v, out = (t.transpose(1, 2) for t in (q, k, v, out))
    return (q.permute(2, 3, 1, 0), k.permute(2, 3, 1, 0), v.permute(3, 2, 1, 0), out.permute(2, 3, 1, 0),
            lse.permute(2, 1, 0), idx.permute(3, 2, 1, 0), num.permute(2, 1, 0))


@pytest.mark.parametrize("bshd", [True, False])
@pytest.mark.parametrize("with_sizes", [True, False])
def test_host_path_hands_the_kernel_cudnns_views(monkeypatch, bshd, with_sizes):
    b, h, sq, skv, d = 2, 3, 192, 320, 64
    q = torch.randn((b, sq, h, d) if bshd else (b, h, sq, d), dtype=torch.float16)
    k, v = (torch.randn((b, skv, h, d) if bshd else (b, h, skv, d), dtype=torch.float16) for _ in range(2))
    idx = torch.zeros(b, h, sq // 64, skv // 64, dtype=torch.int32)
    num = torch.ones(b, h, sq // 64, dtype=torch.int32)
    sizes = torch.full((skv // 64,), 64, dtype=torch.int32) if with_sizes else None
    calls = []
    key = (torch.float16, d, d, with_sizes, True)
    monkeypatch.setitem(D._COMPILED, key, lambda *args: calls.append(args))
    out, lse = D.cudnn_fwd_direct(q, k, v, idx, num, sizes, bshd=bshd, softmax_scale=None, allow_empty=True)
    (args,) = calls
    # the outputs as cuDNN's wrapper allocates them: out contiguous in the call layout, lse [B, H, S_q]
    assert out.shape == q.shape and out.is_contiguous() and out.dtype == q.dtype
    assert lse.shape == (b, h, sq) and lse.is_contiguous() and lse.dtype == torch.float32
    want = _cudnn_views(q, k, v, out, lse, idx, num, bshd)
    for i, (got, ref) in enumerate(zip(args[:7], want)):
        assert (got.shape, got.stride(), got.data_ptr()) == (ref.shape, ref.stride(), ref.data_ptr()), f"argument {i}"
    assert args[7] is sizes  # rank 1, as given (the entry broadcasts it)
    assert args[8] == 1.0 / math.sqrt(d)  # bsa_attn_fwd's default, to the bit
    assert len(args) == 9
    D.cudnn_fwd_direct(q, k, v, idx, num, sizes, bshd=bshd, softmax_scale=0.3, allow_empty=True)
    assert calls[-1][8] == 0.3


@needs_cudnn
@pytest.mark.parametrize("with_sizes", [True, False])
def test_fake_arguments_match_the_host_views(with_sizes):
    """The compiled entry's layouts (fake arguments) have the host views' unit-stride mode,
    rank and dtype, and no sizes slot when there are no block sizes."""
    import cutlass

    kernel = D.direct_kernel(torch.bfloat16, 128, 128, with_sizes, True)
    fake = kernel.fake_args()
    assert len(fake) == 10  # 7 tensors, the sizes slot, the scale, the stream
    unit_modes = [1, 1, 0, 1, 0, 0, 0]  # cuDNN's leading_dims for q, k, v, out, lse, idx, nums
    dtypes = [cutlass.BFloat16] * 4 + [cutlass.Float32, cutlass.Int32, cutlass.Int32]
    for i, (t, unit, dt) in enumerate(zip(fake[:7], unit_modes, dtypes)):
        assert t.element_type == dt, f"argument {i}"
        assert [j for j, st in enumerate(t.stride) if isinstance(st, int) and st == 1] == [unit], f"argument {i}"
    assert len(fake[0].shape) == 4 and len(fake[4].shape) == 3 and len(fake[5].shape) == 4 and len(fake[6].shape) == 3
    if with_sizes:
        assert fake[7].element_type == cutlass.Int32 and len(fake[7].shape) == 1 and fake[7].stride == (1,)
    else:
        assert fake[7] is None


# =============================================================================================
# The kernel's configuration and key (imports the CuTe DSL and cuDNN's kernel module, compiles nothing)
# =============================================================================================


@needs_cudnn
def test_predicate_constants_agree_with_the_kernel_module():
    from fastvideo_cute.adapters import cudnn_bsa_direct_kernel as K

    assert (D.BLOCK, D.HEAD_DIMS, D.BASE_ALIGN) == (K.BLOCK, K.HEAD_DIMS, K.BASE_ALIGN)
    assert tuple(sorted(D.DTYPES.values())) == tuple(sorted(K.DTYPE_NAMES))
    from cudnn.block_sparse_attention.csrc.fwd.sm90_blk64.bsa_fwd_sm90 import SM90_FWD_BLOCK_SIZE

    assert SM90_FWD_BLOCK_SIZE == D.BLOCK


@needs_cudnn
def test_compile_key_changes_with_every_config_field():
    from fastvideo_cute.adapters.cudnn_bsa_direct_kernel import CudnnFwdSm90Blk64

    base = dict(dtype="bfloat16", head_dim=128, value_dim=128, has_block_sizes=True, allow_empty_block_nums=True,
                cudnn_version="1.32.0", gqa_ratio=1)
    changed = dict(dtype="float16", head_dim=64, value_dim=96, has_block_sizes=False, allow_empty_block_nums=False,
                   cudnn_version="1.33.0", gqa_ratio=2)

    def make(**kw):
        args = {**base, **kw}
        return CudnnFwdSm90Blk64(args.pop("dtype"), args.pop("head_dim"), args.pop("value_dim"), **args)

    ref = make()
    keys = {ref.cache_key(D.ARCH)}
    for field, value in changed.items():
        kernel = make(**{field: value})
        assert kernel.config()[field] == value
        keys.add(kernel.cache_key(D.ARCH))
    assert len(keys) == 1 + len(changed), "some configuration field does not reach the compile key"
    assert ref.cache_key("sm_100a") != ref.cache_key(D.ARCH)
    assert make().cache_key(D.ARCH) == ref.cache_key(D.ARCH)  # and the key is stable
    # the host path's kernel carries the installed cuDNN version
    assert D.direct_kernel(torch.bfloat16, 128, 128, True, True).config()["cudnn_version"] == D._cudnn_version()


@needs_cudnn
@pytest.mark.parametrize("bad", [dict(dtype="float32"), dict(head_dim=80), dict(value_dim=256), dict(gqa_ratio=0)])
def test_kernel_refuses_a_bad_configuration(bad):
    from fastvideo_cute.adapters.cudnn_bsa_direct_kernel import CudnnFwdSm90Blk64

    args = {**dict(dtype="bfloat16", head_dim=128, value_dim=128, has_block_sizes=True, allow_empty_block_nums=True,
                   cudnn_version="1.32.0"), **bad}
    with pytest.raises(ValueError, match=next(iter(bad))):
        CudnnFwdSm90Blk64(args.pop("dtype"), args.pop("head_dim"), args.pop("value_dim"), **args)


# =============================================================================================
# The sm_90a compile (slow: one worker subprocess, plus one fresh process for the disk load)
# =============================================================================================

# (name, dtype, head_dim, has_block_sizes, allow_empty): what the direct path compiles
_VARIANTS = [
    ("bf16-d128-partial-empty", "bfloat16", 128, True, True),
    ("bf16-d128-full-empty", "bfloat16", 128, False, True),
    ("fp16-d64-full", "float16", 64, False, False),
    ("bf16-d96-partial", "bfloat16", 96, True, False),
]
# our variant -> cuDNN's wrapper compile of the same call, and what must agree
_VS_WRAPPER = {"bf16-d128-full-empty": ("full", "sass"), "bf16-d128-partial-empty": ("partial", "fp_ops")}
_OP = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
# floating-point, tensor-core and TMA opcodes (mnemonic prefixes): their counts must match cuDNN's
_FP_PREFIXES = ("HGMMA", "FFMA", "FMUL", "FADD", "MUFU", "FMNMX", "F2F", "F2FP", "UTMALDG", "UTMASTG", "STG", "LDG")


def _nvdisasm():
    for p in sys.path:
        cand = os.path.join(p, "triton", "backends", "nvidia", "bin", "nvdisasm")
        if os.path.isfile(cand):
            return cand
    return None


def _sass(nvdisasm, cubin: bytes, tmp: Path, name: str):
    path = tmp / f"{name}.cubin"
    path.write_bytes(cubin)
    text = subprocess.run([nvdisasm, "-c", str(path)], capture_output=True, text=True).stdout
    return [(m.group(1), m.group(2).strip()) for m in _OP.finditer(text)]


def _fp_counts(sass):
    return Counter(op for op, _ in sass if op.split(".")[0] in _FP_PREFIXES)


def _worker_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUTE_DSL_")}
    env.pop("TRITON_INTERPRET", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    (tmp_path / "dump").mkdir(exist_ok=True)
    env["CUTE_DSL_DUMP_DIR"] = str(tmp_path / "dump")
    return env


def _run_worker(mode, tmp_path):
    proc = subprocess.run([sys.executable, __file__, mode, str(tmp_path)], env=_worker_env(tmp_path), cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    out = proc.stdout + proc.stderr
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and line, f"{mode} worker failed (rc={proc.returncode}):\n{out[-6000:]}"
    return json.loads(line[-1][len("RESULT "):])


@pytest.mark.slow
@needs_cudnn
def test_direct_kernel_compiles_for_sm90a_as_cudnns_own(tmp_path):
    t0 = time.time()
    res = _run_worker("compile", tmp_path)
    nvdisasm = _nvdisasm()
    for name, *_ in _VARIANTS:
        var = res["direct"][name]
        print(f"[sm_90a direct {name}] {var['seconds']:.1f}s {var['cubin_bytes']} B")
        assert var["cubin_bytes"] > 0, f"{name}: no cubin"
        if nvdisasm is None:
            continue
        sass = _sass(nvdisasm, Path(var["cubin"]).read_bytes(), tmp_path, name)
        assert len(sass) > 500, f"{name}: only {len(sass)} SASS instructions parsed"
        ops = Counter(op for op, _ in sass)
        count = {pre: sum(n for op, n in ops.items() if op.startswith(pre)) for pre in ("HGMMA", "UTMALDG")}
        print(f"  {count}")
        assert any(op.startswith("HGMMA") for op in ops), f"{name}: no HGMMA in the SASS"
        assert any(op.startswith("UTMALDG") for op in ops), f"{name}: no TMA load in the SASS"
        if name in _VS_WRAPPER:
            which, how = _VS_WRAPPER[name]
            theirs = _sass(nvdisasm, Path(res["wrapper"][which]).read_bytes(), tmp_path, f"wrapper-{which}")
            if how == "sass":
                assert sass == theirs, \
                    f"{name}: SASS differs from cuDNN's wrapper kernel ({len(sass)} vs {len(theirs)} instructions)"
            else:
                mine, ref = _fp_counts(sass), _fp_counts(theirs)
                assert mine == ref, f"{name}: fp/MMA/TMA opcode counts differ: {mine - ref} / {ref - mine}"
    # the exported kernel loads in a fresh process, with no compile
    assert res["disk"]["how"] == "compiled"
    again = _run_worker("load", tmp_path)
    assert again["how"] == "disk", again
    print(f"compile check: {time.time() - t0:.0f} s")


# =============================================================================================
# worker side: python tests/adapters/test_cudnn_direct.py {compile|load} DIR
# =============================================================================================


def _disk_kernel():
    return D.direct_kernel(torch.float16, 64, 64, False, False)


def _worker_compile(out: Path) -> dict:
    from tests.adapters import test_cudnn_compile as T

    cc = T._patch_environment("sm_90a")  # CUTE_DSL_ARCH, the smem-per-SM query, torch.cuda.* fakes
    from torch._subclasses.fake_tensor import FakeTensorMode

    caches = T._patch_cudnn(cc)
    from fastvideo_cute.adapters import cudnn_bsa as C
    from fastvideo_cute.jit import CuteKernelCache, compile_kernel, cubin_of

    res = {"direct": {}, "wrapper": {}}
    # the disk entry first (a need_cubin compile would put the kernel in memory and skip the export)
    fn, how = compile_kernel(_disk_kernel(), D.ARCH, cache=CuteKernelCache(out / "cache"))
    res["disk"] = {"how": how}
    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16}
    for name, dtype, d, sizes, empty in _VARIANTS:
        t = time.time()
        fn, _ = compile_kernel(D.direct_kernel(dtypes[dtype], d, d, sizes, empty), D.ARCH, need_cubin=True)
        cubin = cubin_of(fn) or b""
        path = out / f"direct-{name}.cubin"
        path.write_bytes(cubin)
        res["direct"][name] = {"seconds": time.time() - t, "cubin": str(path), "cubin_bytes": len(cubin)}
    for which in ("full", "partial"):  # cuDNN's own compile of the call the first two variants serve
        meta = T._cpu_meta(64, 192, 320, 2, which == "partial", 0)
        before = {n: set(dict.keys(c.compile_cache)) for n, c in caches.items()}
        with FakeTensorMode():
            q = torch.empty(2, 2, 192, 128, dtype=torch.bfloat16, device="cuda")
            k, v = (torch.empty(2, 2, 320, 128, dtype=torch.bfloat16, device="cuda") for _ in range(2))
            C.cudnn_fwd_prebuilt(q, k, v, T._fake_meta(meta, cc, "fwd", 2), bshd=False, softmax_scale=0.125)
        new = [dict.__getitem__(c.compile_cache, key) for n, c in caches.items()
               for key in dict.keys(c.compile_cache) if key not in before[n]]
        assert len(new) == 1, f"expected one new cuDNN kernel for {which}, got {len(new)}"
        cubin = new[0].artifacts.CUBIN
        if isinstance(cubin, str):  # with CUTE_DSL_DUMP_DIR set the DSL hands back the dumped file's path
            cubin = Path(cubin).read_bytes()
        path = out / f"wrapper-{which}.cubin"
        path.write_bytes(cubin)
        res["wrapper"][which] = str(path)
    return res


def _worker_load(out: Path) -> dict:
    os.environ["CUTE_DSL_ARCH"] = "sm_90a"
    from fastvideo_cute.jit import CuteKernelCache, compile_kernel

    _, how = compile_kernel(_disk_kernel(), D.ARCH, cache=CuteKernelCache(out / "cache"))
    return {"how": how}


if __name__ == "__main__":
    mode, out_dir = sys.argv[1], Path(sys.argv[2])
    sys.path.insert(0, str(ROOT))
    result = _worker_compile(out_dir) if mode == "compile" else _worker_load(out_dir)
    print("RESULT " + json.dumps(result), flush=True)
