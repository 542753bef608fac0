"""Compile-only check of the FA4 route's kernels for sm_100a and sm_90a, on a CPU-only box.

Each arch compiles in its own subprocess (``CUTE_DSL_ARCH`` is read at import and FA4 caches its
arch), with the env set before anything imports cutlass, fake CUDA tensors under
``FakeTensorMode``, and the one monkeypatch the sm_100 forward needs (``HardwareInfo`` asks the
driver for the SM count). Recipe: shared/gpu/fa4-cross-compile. The adapter's own metadata
builder makes the lists (on CPU), whose shapes/strides are then mirrored as fake CUDA tensors,
and the adapter's own launch functions make the FA4 calls, so what compiles here is exactly the
configuration the route runs: the tile sizes, the Q-stage count, the sparse block sizes, the
aux-tensor mask_mod.

What it asserts, per arch:
- every variant produces a CUBIN, and its SASS has UTCHMMA (tcgen05, sm_100a) / HGMMA (wgmma,
  sm_90a) when nvdisasm is available (triton's bundled copy);
- the kernel objects FA4 built have the tiles the adapter plans (sm_100 128-token forward:
  ``q_stage == 1``; 256: ``q_stage == 2``; sm_90 backward ``tile_n == 128``...);
- the mask_mod compiles once: a second forward call with another length and another map adds
  no compile-cache entry, and the factory's mask_mod hashes like a fresh one (FA4's key);
- the ``max_seqlen_q`` of the single-Q-stage route stays a runtime argument (same PTX for two
  lengths) and the hard-coded sm_90 backward tile rule matches FA4's ``_tile_size_bwd_sm90``.

Run one arch by hand: ``python tests/adapters/test_fa4_compile.py sm_100 --out /tmp/fa4c``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ARCHS = {
    # FLASH_ATTENTION_ARCH, CUTE_DSL_ARCH, SM count of the target SKU (B200 / H100-H200)
    "sm_100": ("sm_100", "sm_100a", 148),
    "sm_90": ("sm_90", "sm_90a", 132),
}
WANT_MMA = {"sm_100": "UTCHMMA", "sm_90": "HGMMA"}
B, H, D = 1, 2, 128
SQ, SKV = 1024, 1536  # q_len != kv_len


# =============================================================================================
# pytest side
# =============================================================================================


def _have_fa4() -> bool:
    try:
        import importlib.util

        return all(importlib.util.find_spec(m) is not None for m in ("flash_attn.cute", "cutlass", "quack"))
    except (ImportError, ValueError):
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _have_fa4(), reason="flash-attn-4 / nvidia-cutlass-dsl / quack-kernels not installed")
def test_fa4_route_kernels_compile_for_sm100a_and_sm90a(tmp_path):
    t0 = time.time()
    procs = {}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUTE_DSL_", "FLASH_ATTENTION_"))}
    env.pop("TRITON_INTERPRET", None)
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    for arch in ARCHS:  # both archs at once: the box has 2 cores and each compile is single-threaded
        procs[arch] = subprocess.Popen(
            [sys.executable, __file__, arch, "--out", str(tmp_path / arch)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(root))
    results = {}
    for arch, p in procs.items():
        out, err = p.communicate(timeout=900)
        line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert p.returncode == 0 and line, f"{arch} worker failed (rc={p.returncode}):\n{out[-4000:]}\n{err[-4000:]}"
        results[arch] = json.loads(line[-1][len("RESULT "):])
    print(f"compile test wall time {time.time() - t0:.1f}s")

    for arch, res in results.items():
        print(arch, json.dumps({k: v for k, v in res.items() if k != "variants"}))
        for name, var in res["variants"].items():
            print(f"  {arch} {name}: {var['seconds']:.1f}s kernels={var['kernels']} sass={var['sass']}")
            assert var["error"] is None, f"{arch} {name}: {var['error']}"
            assert var["cubins"], f"{arch} {name}: no CUBIN produced"
            assert all(n > 0 for n in var["cubin_bytes"]), f"{arch} {name}: empty CUBIN"
            if res["nvdisasm"]:
                want = WANT_MMA[arch]
                assert var["sass"].get(want, 0) > 0, f"{arch} {name}: no {want} in the attention kernel SASS"
        assert res["mask_mod_compiles_once"], f"{arch}: a second call recompiled"
        assert res["mask_hash_stable"], f"{arch}: mask_mod hash differs from a fresh build"

    v100 = results["sm_100"]["variants"]
    assert v100["fwd128"]["kernels"][0]["q_stage"] == 1
    assert v100["fwd128"]["kernels"][0]["m_block_size"] == 128
    assert v100["fwd256"]["kernels"][0]["q_stage"] == 2
    for name in ("fwd128", "fwd256"):
        k = v100[name]["kernels"][0]
        assert (k["n_block_size"], k["q_subtile_factor"], k["kv_subtile_factor"]) == (128, 1, 1)
        assert k["has_mask_mod"] and k["has_aux_tensors"]
    for name, q_sub in (("bwd128", 1), ("bwd256", 2)):
        k = v100[name]["kernels"][0]
        assert (k["tile_m"], k["tile_n"], k["q_subtile_factor"], k["kv_subtile_factor"]) == (128, 128, q_sub, 1)
        assert k["use_2cta_instrs"] is False
    assert v100["fwd128-d64"]["kernels"][0]["q_stage"] == 1
    assert results["sm_100"]["single_q_stage_ptx_same_for_two_lengths"] is True

    v90 = results["sm_90"]["variants"]
    assert [(k["tile_m"], k["tile_n"]) for k in v90["fwd64"]["kernels"]] == [(64, 64)]
    assert v90["fwd128"]["kernels"][0]["q_subtile_factor"] == 1
    assert v90["fwd256"]["kernels"][0]["q_subtile_factor"] == 2
    for name in ("fwd128", "fwd256"):
        assert (v90[name]["kernels"][0]["tile_m"], v90[name]["kernels"][0]["tile_n"]) == (128, 128)
    for name, q_sub in (("bwd128", 2), ("bwd256", 4)):
        k = v90[name]["kernels"][0]
        assert (k["tile_m"], k["tile_n"], k["q_subtile_factor"]) == (64, 128, q_sub)
    k = v90["bwd128-d64"]["kernels"][0]  # head_dim <= 64: FA4 takes 128-row q tiles in the backward
    assert (k["tile_m"], k["tile_n"], k["q_subtile_factor"]) == (128, 128, 1)
    assert results["sm_90"]["sm90_bwd_tile_rule_matches_fa4"] is True


# =============================================================================================
# worker side (one process per arch)
# =============================================================================================

_RECORD_FIELDS = ("q_stage", "m_block_size", "n_block_size", "tile_m", "tile_n", "q_subtile_factor",
                  "kv_subtile_factor", "use_2cta_instrs", "cluster_size")


def _worker(arch: str, out_dir: Path) -> dict:
    fa_arch, dsl_arch, num_sms = ARCHS[arch]
    os.environ["FLASH_ATTENTION_ARCH"] = fa_arch
    os.environ["CUTE_DSL_ARCH"] = dsl_arch
    os.environ["FLASH_ATTENTION_NUM_SMS"] = str(num_sms)
    os.environ["CUTE_DSL_KEEP"] = "ptx,cubin"
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ["CUTE_DSL_DUMP_DIR"] = str(out_dir)  # kept PTX/cubins go here, not into the cwd
    os.environ.pop("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", None)

    t_import = time.time()
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import cutlass.utils.hardware_info as hw

    hw.HardwareInfo.__init__ = lambda self, device_id=0: setattr(self, "device_id", device_id)
    hw.HardwareInfo.get_device_multiprocessor_count = lambda self: num_sms
    hw.HardwareInfo.get_max_active_clusters = lambda self, cluster_size, stream=None: num_sms // cluster_size

    from fastvideo_cute.adapters import fa4 as A

    fa = A.load_fa4()
    iface = fa.interface
    import_s = time.time() - t_import

    # Record the kernel objects FA4 builds (their tile decisions), without changing them: wrap
    # each class's __init__ in place (the class itself, its name and attributes stay FA4's).
    records = []
    for cls_name in ("FlashAttentionForwardSm90", "FlashAttentionForwardSm100", "FlashAttentionBackwardSm90",
                     "FlashAttentionBackwardSm100"):
        cls = getattr(iface, cls_name)

        def make(init=cls.__init__, cls_name=cls_name):
            def recording_init(self, *args, **kwargs):
                init(self, *args, **kwargs)
                rec = {"cls": cls_name}
                for f in _RECORD_FIELDS:
                    if f in kwargs:
                        rec[f] = kwargs[f]
                rec["has_mask_mod"] = kwargs.get("mask_mod") is not None
                rec["has_aux_tensors"] = bool(kwargs.get("has_aux_tensors"))
                records.append(rec)
            return recording_init

        cls.__init__ = make()

    caches = {"fwd": fa.fwd.compile_cache, "bwd": fa.bwd.compile_cache}

    def fake_like(t):
        return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cuda")

    def fake_meta(meta):
        idx = meta.index
        return A.FA4Metadata(A.FA4SparseIndex(*(fake_like(x) for x in idx[:4]), idx.block_size),
                             fake_like(meta.kv_tile_sizes), meta.plan)

    def cpu_meta(block, sq, skv, plan, build, seed=0):
        g = torch.Generator().manual_seed(seed)
        qb, kvb = sq // block, skv // block
        block_map = torch.rand(B, H, qb, kvb, generator=g) < 0.5
        sizes = torch.full((kvb,), block, dtype=torch.int32)
        sizes[-1] = block // 3  # ragged tail: partial tiles exist
        return build(block_map, sizes, plan)

    nvdisasm = None
    for p in sys.path:
        cand = os.path.join(p, "triton", "backends", "nvidia", "bin", "nvdisasm")
        if os.path.isfile(cand):
            nvdisasm = cand
            break
    mma_re = re.compile(r"\b(UTCHMMA|HGMMA|HMMA|UTMALDG|LDTM)\b")

    def step(name, fn):
        before = {n: set(c.cache) for n, c in caches.items()}
        n_rec = len(records)
        t = time.time()
        err = None
        try:
            with FakeTensorMode():
                fn()
        except Exception as e:  # report, keep going
            err = f"{type(e).__name__}: {e}"
        res = {"seconds": time.time() - t, "error": err, "cubins": [], "cubin_bytes": [], "sass": {},
               "kernels": records[n_rec:], "new_keys": {}}
        for cname, cache in caches.items():
            new = [k for k in cache.cache if k not in before[cname]]
            res["new_keys"][cname] = len(new)
            for i, key in enumerate(new):
                cubin = cache.cache[key].artifacts.CUBIN
                path = out_dir / f"{name}.{cname}.{i}.{dsl_arch}.cubin"
                path.write_bytes(cubin)
                res["cubins"].append(path.name)
                res["cubin_bytes"].append(len(cubin))
                if nvdisasm:
                    sass = subprocess.run([nvdisasm, "-c", str(path)], capture_output=True, text=True).stdout
                    for m in mma_re.findall(sass):
                        res["sass"][m] = res["sass"].get(m, 0) + 1
        print(f"[{arch}] {name}: {res['seconds']:.1f}s err={err} kernels={res['kernels']} sass={res['sass']}",
              flush=True)
        return res

    major = 10 if arch == "sm_100" else 9
    variants, extra = {}, {}

    def fwd(block, sq=SQ, skv=SKV, seed=0, d=D):
        plan = A.fa4_fwd_plan((major, 0), block)
        meta = cpu_meta(block, sq, skv, plan, A.build_fwd_metadata, seed)

        def run():
            q = torch.empty(B, sq, H, d, dtype=torch.bfloat16, device="cuda")
            k, v = (torch.empty(B, skv, H, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
            out, lse = A.fa4_block_sparse_fwd_prebuilt(q, k, v, fake_meta(meta))
            assert tuple(out.shape) == (B, sq, H, d) and tuple(lse.shape) == (B, H, sq)
        return run

    def bwd(block, d=D):
        plan = A.fa4_bwd_plan((major, 0), block)
        meta = cpu_meta(block, SQ, SKV, plan, A.build_bwd_metadata)

        def run():
            q, out, dout = (torch.empty(B, SQ, H, d, dtype=torch.bfloat16, device="cuda") for _ in range(3))
            k, v = (torch.empty(B, SKV, H, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
            lse = torch.empty(B, H, SQ, dtype=torch.float32, device="cuda")
            dq, dk, dv = A.fa4_block_sparse_bwd_prebuilt(q, k, v, out, dout, lse, fake_meta(meta))
            assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
        return run

    fwd_blocks = (128, 256) if major == 10 else (64, 128, 256)
    for block in fwd_blocks:
        variants[f"fwd{block}"] = step(f"fwd{block}", fwd(block))
    for block in (128, 256):
        variants[f"bwd{block}"] = step(f"bwd{block}", bwd(block))
    # head_dim 64, the other head dim fa4_support accepts: one forward and one backward per arch.
    variants["fwd128-d64"] = step("fwd128-d64", fwd(128, d=64))
    variants["bwd128-d64"] = step("bwd128-d64", bwd(128, d=64))

    # Compiles once: same config, another length and another map -> no new compile-cache entry.
    again = step("fwd128-again", fwd(128, sq=2 * SQ, skv=SKV + 512, seed=7))
    extra["mask_mod_compiles_once"] = again["error"] is None and sum(again["new_keys"].values()) == 0
    from flash_attn.cute import utils as fa_utils
    fresh = fa.mask_mod.__wrapped__(128)  # a new function object, not the cached one
    extra["mask_hash_stable"] = (fresh is not fa.mask_mod(128)
                                 and fa_utils.hash_callable(fresh) == fa_utils.hash_callable(fa.mask_mod(128))
                                 and fa_utils.hash_callable(fa.mask_mod(64)) != fa_utils.hash_callable(fresh))

    if major == 10:
        # max_seqlen_q must stay a runtime kernel argument: drop the cached kernel, recompile the
        # single-Q-stage forward for another length, compare the PTX.
        fwd_cache = caches["fwd"].cache
        key_1 = [k for k in fwd_cache][0]  # fwd128 compiled first
        ptx_1 = str(fwd_cache[key_1].artifacts.PTX)
        fwd_cache.clear()
        other = step("fwd128-len4x", fwd(128, sq=4 * SQ, skv=4 * SKV))
        keys = list(fwd_cache)
        extra["single_q_stage_ptx_same_for_two_lengths"] = (
            other["error"] is None and len(keys) == 1 and keys[0] == key_1
            and str(fwd_cache[keys[0]].artifacts.PTX) == ptx_1)
    else:
        ok = True
        for d in (64, 128):
            for block in (128, 256):
                cfg = iface._tile_size_bwd_sm90(d, d, False, False, sparse_block_size_q=block)
                ok &= cfg.n_block_size == A.fa4_bwd_plan((9, 0), block).kv_tile
                ok &= cfg.m_block_size == A._sm90_bwd_tile_m(d, block) and block % cfg.m_block_size == 0
        extra["sm90_bwd_tile_rule_matches_fa4"] = bool(ok)

    return {"arch": arch, "import_seconds": import_s, "nvdisasm": nvdisasm is not None, "variants": variants,
            **extra}


if __name__ == "__main__":
    argv = sys.argv[1:]
    out = Path("/tmp/fa4-compile")
    if "--out" in argv:
        i = argv.index("--out")
        out = Path(argv[i + 1])
        del argv[i:i + 2]
    arch_arg = argv[0] if argv else "sm_100"
    t_all = time.time()
    result = _worker(arch_arg, out)
    result["total_seconds"] = time.time() - t_all
    print("RESULT " + json.dumps(result), flush=True)
