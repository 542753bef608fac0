"""Compile-only check of cuDNN BSA's kernels for sm_90a, sm_100a and sm_120a, on a CPU-only box.

Each arch runs in its own subprocess (``CUTE_DSL_ARCH`` is read when the CuTe DSL is imported),
with fake CUDA tensors under ``FakeTensorMode``. The adapter's own metadata builder makes the
lists (on CPU, from a real block map and ragged sizes), their shapes and strides are mirrored as
fake CUDA tensors, and the adapter's own launch functions (``cudnn_fwd_prebuilt`` /
``cudnn_bwd_prebuilt``) call cuDNN's public API, so what compiles is the configuration the
adapter runs: the sparse block (256 as 128), variable counts, ``allow_empty_block_nums``,
``block_sizes`` present (partial) or absent (all full), the layout, B > 1 and q_len != kv_len.

Everything cuDNN 1.32.0 asks the driver for on the way to a launch can be faked; this is where:

- torch side: ``torch.cuda.get_device_capability`` (api ``_device_arch``), ``current_device``,
  ``current_stream`` (the launch stream), ``torch.cuda.device`` (a context manager around every
  call), ``get_device_properties`` (SM count / L2 size heuristics), ``torch.cuda.nvtx.range``;
- ``cudnn.tensor_adapter.get_compute_capability`` (cudart ``cudaDeviceGetAttribute``), read by
  ``csrc/bwd/bucketed_k2q_csr.py::_device_capability`` for its compile key;
- CuTe DSL: ``cutlass.utils.HardwareInfo`` (SM count of the SM100 persistent schedulers) and
  ``cutlass.base_dsl.runtime.cuda.get_device_attribute(MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)``,
  which the DSL reads while building a kernel with ``min_blocks_per_mp > 1`` (SM90 blk64 forward);
- value operations fake tensors cannot run on a CPU build: ``_empty_bwd_workspace_with_zeroed_accum``
  (``.zero_()`` on a slice; replaced by an uninitialised allocation of the same shape), and the
  copies cuDNN makes of a rank-1 ``block_sizes`` (SM90 blk64 forward ``[None, None, :]``
  ``.expand(B, H, -1).contiguous()``, blk64 backward on every arch ``.unsqueeze(0).expand(B, -1)``
  ``.contiguous()``, SM90 blk128 backward ``[None, :].expand(B, -1)``): the fakes are given the
  tensors those lines produce, so the kernels compiled are the same;
- the launch: every ``compile_cache`` of ``cudnn.block_sparse_attention`` is swapped for a dict
  whose lookups return a recorder instead of the compiled function (compiling still stores the
  real one), so the host code runs to the launch and nothing reaches a driver.

Asserted per arch: every variant compiles (or reuses a kernel: cuDNN's compile keys keep strides
dynamic on sm_90a/sm_100a, so BHSD and BSHD share one kernel there and the logical-256 variants must
reuse the 128 ones; SM120's keys hold static shapes and strides, one compile per shape)
and reaches its launch; every CUBIN's PTX targets the arch; each (direction, physical tile) has an
attention kernel whose SASS has HGMMA (sm_90a) / UTCHMMA (sm_100a) / HMMA (sm_120a) when nvdisasm
is available (triton's copy); the outputs cuDNN allocates are shaped as the library's contract
(out contiguous in the call layout, lse fp32 ``[B, H, S_q]``, dq/dk/dv the caller's buffers).
The variants are those ``cudnn_support`` serves on the arch.

Run one arch by hand: ``python tests/adapters/test_cudnn_compile.py sm_100a --out /tmp/cudnnc``
(with cuDNN importable, e.g. ``PYTHONPATH=$PWD:/tmp/peers/cudnn``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ARCHS = {
    # CUTE_DSL_ARCH -> (compute capability, SM count, max smem per SM in bytes) of a target SKU
    "sm_90a": ((9, 0), 132, 233472),   # H100 / H200
    "sm_100a": ((10, 0), 148, 233472),  # B200
    "sm_120a": ((12, 0), 188, 102400),  # RTX PRO 6000 Blackwell
}
WANT_MMA = {"sm_90a": "HGMMA", "sm_100a": "UTCHMMA", "sm_120a": "HMMA"}
B, H, D = 2, 2, 128
# compile caches of cuDNN's helper kernels (k2q CSR builder, bwd pre/post-processing, split-KV combine)
_HELPER_CACHES = ("build_bucketed_k2q_csr_cutedsl", "_bwd_preprocess", "_bwd_postprocess_convert",
                  "_combine_blk64_kv_bucketed_partials")


# =============================================================================================
# pytest side
# =============================================================================================


def _have_cudnn() -> bool:
    try:
        return all(importlib.util.find_spec(m) is not None for m in ("cudnn", "cutlass", "tvm_ffi"))
    except (ImportError, ValueError):
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _have_cudnn(), reason="nvidia-cudnn-frontend / nvidia-cutlass-dsl not importable")
def test_cudnn_kernels_compile_for_sm90a_sm100a_sm120a(tmp_path):
    t0 = time.time()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUTE_DSL_")}
    env.pop("TRITON_INTERPRET", None)
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    (tmp_path / "dump").mkdir()
    env["CUTE_DSL_DUMP_DIR"] = str(tmp_path / "dump")  # the kept PTX/cubins go here, not into the cwd
    procs = {arch: subprocess.Popen([sys.executable, __file__, arch, "--out", str(tmp_path)], env=env, cwd=root,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for arch in ARCHS}
    results = {}
    for arch, proc in procs.items():
        out, _ = proc.communicate(timeout=1800)
        line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert proc.returncode == 0 and line, f"{arch} worker failed (rc={proc.returncode}):\n{out[-6000:]}"
        results[arch] = json.loads(line[-1][len("RESULT "):])
        print("\n".join(ln for ln in out.splitlines() if ln.startswith("[")))
    for arch, res in results.items():
        assert res["variants"], f"{arch}: no variant ran"
        kinds_with_mma = set()
        for name, var in res["variants"].items():
            tag = f"{arch} {name}"
            assert var["error"] is None, f"{tag}: {var['error']}"
            assert var["launched"], f"{tag}: the host code never reached a launch"
            assert var["contract_ok"], f"{tag}: outputs off the contract: {var['contract']}"
            assert all(t == arch for t in var["ptx_targets"]), f"{tag}: PTX targets {var['ptx_targets']}"
            if var["block"] == 256 and arch != "sm_120a":  # SM120 keys its kernels by static shapes
                assert not var["new_main_kernels"], f"{tag}: expected to reuse the 128-token kernel"
            if var["main_has_mma"]:
                kinds_with_mma.add((var["direction"], var["tile"]))
        kinds = {(var["direction"], var["tile"]) for var in res["variants"].values()}
        if res["nvdisasm"]:
            assert kinds_with_mma == kinds, f"{arch}: no {WANT_MMA[arch]} kernel for {sorted(kinds - kinds_with_mma)}"
    print(f"compile check: {time.time() - t0:.0f} s")


# =============================================================================================
# worker side: python tests/adapters/test_cudnn_compile.py <arch> --out DIR
# =============================================================================================


def _patch_environment(arch: str):
    """Set the target and fake every driver query (see the module docstring). Before any cutlass import."""
    cc, num_sms, smem = ARCHS[arch]
    os.environ["CUTE_DSL_ARCH"] = arch
    os.environ["CUTE_DSL_KEEP"] = "ptx,cubin"
    # cuDNN's own wrapper is what this check compiles: the direct SM90 blk64 forward (compiled by
    # tests/adapters/test_cudnn_direct.py) cannot take fake tensors
    os.environ["FASTVIDEO_VSA_CUDNN_DIRECT"] = "0"
    import torch

    class _Stream:
        cuda_stream = 0

    class _Props:
        multi_processor_count = num_sms
        L2_cache_size = 50 * 2**20
        name = f"fake {arch}"

    class _Device:
        def __init__(self, *args):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    torch.cuda.get_device_capability = lambda *a, **k: cc
    torch.cuda.current_device = lambda: 0
    torch.cuda.current_stream = lambda *a, **k: _Stream()
    torch.cuda.get_device_properties = lambda *a, **k: _Props()
    torch.cuda.device = _Device
    torch.cuda.nvtx.range = lambda *a, **k: contextlib.nullcontext()

    import cutlass.base_dsl.runtime.cuda as dsl_cuda
    import cutlass.utils.hardware_info as hw

    hw.HardwareInfo.__init__ = lambda self, device_id=0: setattr(self, "device_id", device_id)
    hw.HardwareInfo.get_device_multiprocessor_count = lambda self: num_sms
    hw.HardwareInfo.get_max_active_clusters = lambda self, cluster_size, stream=None: num_sms // cluster_size

    def device_attribute(attr, *args, **kwargs):
        if attr == dsl_cuda.cuda.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR:
            return smem
        raise RuntimeError(f"compile check: unexpected driver attribute query {attr}")

    dsl_cuda.get_device_attribute = device_attribute
    return cc


class _NoLaunch(dict):
    """A compile cache whose lookups return a recorder: ``cache[key](*args)`` launches nothing."""

    launches: list = []

    def __getitem__(self, key):
        fn = dict.__getitem__(self, key)

        def record(*args, **kwargs):
            _NoLaunch.launches.append(type(fn).__name__)

        return record


def _patch_cudnn(cc):
    import importlib

    import torch

    mods = [importlib.import_module(m) for m in (
        "cudnn.block_sparse_attention.api",
        "cudnn.block_sparse_attention._interface",
        "cudnn.block_sparse_attention.csrc.bwd.bucketed_k2q_csr",
        "cudnn.block_sparse_attention.csrc.bwd.bsa_bwd_prepost",  # imported lazily by the SM100 blk128 bwd
        "cudnn.block_sparse_attention.csrc.bwd.sm100_blk128.bsa_bwd_sm100",
    )]
    caches = {}
    for name, mod in list(sys.modules.items()):
        if not name.startswith("cudnn.block_sparse_attention"):
            continue
        for obj in list(vars(mod).values()):
            if callable(obj) and isinstance(getattr(obj, "compile_cache", None), dict) and obj.__name__ not in caches:
                obj.compile_cache = _NoLaunch()
                caches[obj.__name__] = obj
    csr, interface = mods[2], mods[1]
    csr._device_capability = lambda index: cc

    def workspace(**kw):
        def up(x, m):
            return -(-x // m) * m
        q_r, k_r = up(kw["seqlen_q"], kw["round_q_to"]), up(kw["seqlen_k"], kw["round_k_to"])
        d_r = up(kw["head_dim"], kw["round_d_to"])
        n = 2 * q_r + q_r * d_r + (2 * k_r * d_r if kw.get("include_dkv_accum", True) else 0)
        return torch.empty((kw["batch_size"], kw["num_heads"], n), dtype=torch.float32, device=kw["device"])

    interface._empty_bwd_workspace_with_zeroed_accum = workspace
    return caches


def _variants(arch: str):
    """(name, direction, logical block, partial?, layout, sq, skv, heads, dtype) per served configuration."""
    import torch

    from fastvideo_cute.adapters.cudnn_bsa_support import cudnn_support

    cc = ARCHS[arch][0]
    bf16 = torch.bfloat16
    cand = []
    for block in (64, 128, 256):
        cand += [(f"fwd{block}-partial-bshd", "fwd", block, True, "bshd", 3 * block, 5 * block, H, bf16),
                 (f"fwd{block}-full-bshd", "fwd", block, False, "bshd", 3 * block, 5 * block, H, bf16)]
    cand += [("fwd64-partial-bhsd", "fwd", 64, True, "bhsd", 192, 320, H, bf16),
             ("fwd128-partial-bhsd", "fwd", 128, True, "bhsd", 384, 640, H, bf16),
             ("fwd128-fp16-partial-bshd", "fwd", 128, True, "bshd", 384, 640, H, torch.float16)]
    for block in (64, 128, 256):
        cand += [(f"bwd{block}-partial-bshd", "bwd", block, True, "bshd", 3 * block, 5 * block, H, bf16),
                 (f"bwd{block}-full-bshd", "bwd", block, False, "bshd", 3 * block, 5 * block, H, bf16)]
    cand += [("fwd64-partial-bhsdview", "fwd", 64, True, "bhsd_view", 192, 320, H, bf16),
             ("fwd128-partial-bhsdview", "fwd", 128, True, "bhsd_view", 384, 640, H, bf16),
             ("bwd64-partial-bhsdview", "bwd", 64, True, "bhsd_view", 192, 320, H, bf16),
             ("bwd128-partial-bhsdview", "bwd", 128, True, "bhsd_view", 384, 640, H, bf16)]
    cand += [("bwd128-partial-bhsd", "bwd", 128, True, "bhsd", 384, 640, H, bf16),
             # B*H*KVb >= 1024: SM100's paired-KV blk64 backward (production sizes take it)
             ("bwd64-paired-bshd", "bwd", 64, True, "bshd", 8192, 8192, 4, bf16)]
    out = []
    for name, direction, block, partial, layout, sq, skv, heads, dtype in cand:
        ok, _ = cudnn_support(cc, dtype, D, block, direction == "bwd", q_len=sq, kv_len=skv, heads_q=heads,
                              heads_kv=heads, bshd=(layout == "bshd"), kv_all_full=not partial)
        if ok:
            out.append((name, direction, block, partial, layout, sq, skv, heads, dtype))
    return out


def _cpu_meta(block, sq, skv, heads, partial, seed):
    import torch

    from fastvideo_cute.adapters.cudnn_bsa_metadata import build_cudnn_metadata
    from fastvideo_cute.metadata import map_to_index

    g = torch.Generator().manual_seed(seed)
    qb, kvb = sq // block, skv // block
    block_map = torch.rand(B, heads, qb, kvb, generator=g) < 0.3
    block_map[0, 0, 0] = False
    sizes = torch.full((kvb,), block, dtype=torch.int32)
    if partial:
        sizes[1::3] = block // 3
        sizes[2::5] = 0
    idx, num = map_to_index(block_map)
    return build_cudnn_metadata(idx, num, sizes, block_size=block, batch=B, heads=heads, q_len=sq, kv_len=skv,
                                all_full=not partial)


def _fake_meta(meta, cc, direction, heads):
    """The CPU metadata as fake CUDA tensors; on SM90 the rank-1 sizes become what cuDNN's wrapper
    makes of them before compiling (see the module docstring)."""
    import torch

    from fastvideo_cute.adapters.cudnn_bsa_metadata import CudnnBlockSparseMeta

    def fake(t):
        return torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device="cuda")

    sizes = meta.block_sizes
    fsizes = None
    if sizes is not None:
        kvb = sizes.numel()
        i32 = dict(dtype=torch.int32, device="cuda")
        if cc[0] == 9 and direction == "fwd" and meta.sparse_block == 64:
            fsizes = torch.empty(B, heads, kvb, **i32)  # .expand(B, H, -1).contiguous()
        elif direction == "bwd" and meta.sparse_block == 64:
            fsizes = torch.empty(B, kvb, **i32)  # .unsqueeze(0).expand(B, -1).contiguous() (any arch)
        elif cc[0] == 9 and direction == "bwd":
            fsizes = torch.empty_strided((B, kvb), (0, 1), **i32)  # [None, :].expand(B, -1)
        else:
            fsizes = fake(sizes)
    return CudnnBlockSparseMeta(meta.sparse_block, fake(meta.q2k_block_index), fake(meta.q2k_block_nums), fsizes)


def _contiguous_strides(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


def _worker(arch: str, out_dir: Path) -> dict:
    out_dir = out_dir / arch
    out_dir.mkdir(parents=True, exist_ok=True)
    t_import = time.time()
    cc = _patch_environment(arch)
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    caches = _patch_cudnn(cc)
    from fastvideo_cute.adapters import cudnn_bsa as C

    import_s = time.time() - t_import
    nvdisasm = None
    for p in sys.path:
        cand = os.path.join(p, "triton", "backends", "nvidia", "bin", "nvdisasm")
        if os.path.isfile(cand):
            nvdisasm = cand
            break
    mma_re = re.compile(r"\b(UTCHMMA|HGMMA|HMMA|UTMALDG|UTMASTG)\b")
    want = WANT_MMA[arch]
    variants = {}
    for seed, (name, direction, block, partial, layout, sq, skv, heads, dtype) in enumerate(_variants(arch)):
        meta = _cpu_meta(block, sq, skv, heads, partial, seed)
        before = {n: set(dict.keys(c.compile_cache)) for n, c in caches.items()}
        n_launch = len(_NoLaunch.launches)
        bshd = layout == "bshd"
        res = {"seconds": 0.0, "error": None, "cubins": [], "ptx_targets": [], "sass": {}, "main_has_mma": False,
               "launched": False, "contract": {}, "contract_ok": False, "new_main_kernels": [],
               "block": block, "tile": meta.sparse_block, "direction": direction}
        t = time.time()
        try:
            with FakeTensorMode():
                qshape = (B, sq, heads, D) if bshd else (B, heads, sq, D)
                kshape = (B, skv, heads, D) if bshd else (B, heads, skv, D)
                if layout == "bhsd_view":  # [B, H, S, D] views of BSHD storage (strided, no copy)
                    q = torch.empty(B, sq, heads, D, dtype=dtype, device="cuda").transpose(1, 2)
                    k, v = (torch.empty(B, skv, heads, D, dtype=dtype, device="cuda").transpose(1, 2)
                            for _ in range(2))
                else:
                    q = torch.empty(qshape, dtype=dtype, device="cuda")
                    k, v = (torch.empty(kshape, dtype=dtype, device="cuda") for _ in range(2))
                fmeta = _fake_meta(meta, cc, direction, heads)
                if direction == "fwd":
                    o, lse = C.cudnn_fwd_prebuilt(q, k, v, fmeta, bshd=bshd, softmax_scale=D ** -0.5)
                    got = {"out": (tuple(o.shape), o.stride(), str(o.dtype)),
                           "lse": (tuple(lse.shape), lse.stride(), str(lse.dtype))}
                    want_c = {"out": (qshape, _contiguous_strides(qshape), str(dtype)),
                              "lse": ((B, heads, sq), (heads * sq, sq, 1), "torch.float32")}
                else:
                    o, do = (torch.empty(qshape, dtype=dtype, device="cuda") for _ in range(2))
                    lse = torch.empty(B, heads, sq, dtype=torch.float32, device="cuda")
                    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
                    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
                    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
                    gq, gk, gv = C.cudnn_bwd_prebuilt(do, q, k, v, o, lse, fmeta, bshd=bshd, softmax_scale=D ** -0.5,
                                                      dq=dq, dk=dk, dv=dv)
                    got = {n: (tuple(x.shape), x.stride(), str(x.dtype))
                           for n, x in (("dq", gq), ("dk", gk), ("dv", gv))}
                    want_c = {n: (tuple(x.shape), x.stride(), str(x.dtype))
                              for n, x in (("dq", dq), ("dk", dk), ("dv", dv))}
                res["contract"] = {"got": got, "want": want_c}
                res["contract_ok"] = got == want_c
        except Exception as exc:  # report, keep going
            res["error"] = f"{type(exc).__name__}: {exc}"
        res["seconds"] = time.time() - t
        res["launched"] = len(_NoLaunch.launches) > n_launch
        for cname, holder in caches.items():
            cache = holder.compile_cache
            for i, key in enumerate(k for k in dict.keys(cache) if k not in before[cname]):
                art = getattr(dict.__getitem__(cache, key), "artifacts", None)
                cubin = getattr(art, "CUBIN", None)
                if cubin is None:
                    continue
                if isinstance(cubin, str):  # with CUTE_DSL_DUMP_DIR set the DSL hands back the dumped file's path
                    cubin = Path(cubin).read_bytes()
                path = out_dir / f"{name}.{cname}.{i}.cubin"
                path.write_bytes(cubin)
                res["cubins"].append(path.name)
                ptx = str(getattr(art, "PTX", "") or "")
                if ptx and "\n" not in ptx and Path(ptx).is_file():  # a dumped file's path, not the text
                    ptx = Path(ptx).read_text()
                res["ptx_targets"] += [ln.split()[1].rstrip(",") for ln in ptx.splitlines() if ln.startswith(".target")]
                if nvdisasm:
                    sass = subprocess.run([nvdisasm, "-c", str(path)], capture_output=True, text=True).stdout
                    counts = {}
                    for m in mma_re.findall(sass):
                        counts[m] = counts.get(m, 0) + 1
                    res["sass"][path.name] = counts
                    if cname not in _HELPER_CACHES and counts.get(want, 0) > 0:
                        res["main_has_mma"] = True
                if cname not in _HELPER_CACHES:
                    res["new_main_kernels"].append(path.name)
        print(f"[{arch}] {name}: {res['seconds']:.1f}s err={res['error']} launched={res['launched']} "
              f"contract_ok={res['contract_ok']} cubins={len(res['cubins'])} sass={res['sass']}", flush=True)
        variants[name] = res
    return {"arch": arch, "import_seconds": import_s, "nvdisasm": nvdisasm is not None, "variants": variants}


if __name__ == "__main__":
    argv = sys.argv[1:]
    out = Path("/tmp/cudnn-compile")
    if "--out" in argv:
        i = argv.index("--out")
        out = Path(argv[i + 1])
        del argv[i:i + 2]
    arch_arg = argv[0] if argv else "sm_90a"
    t_all = time.time()
    result = _worker(arch_arg, out)
    result["total_seconds"] = time.time() - t_all
    print("RESULT " + json.dumps(result), flush=True)
