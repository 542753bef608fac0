"""The VSA glue's Triton kernels compile for sm_90 on this CPU-only box (Triton's own ptxas), with
the tiles they launch with.

Why: the interpreter (``TRITON_INTERPRET=1``, what the other CPU tests run) executes Python, so it
accepts code that the compiler rejects. It let a kernel through whose loop re-bound a ``_`` of
another type ("Loop-carried variable _ has initial type ..."), which failed only on the H200.
Compiling to a cubin here catches that class of error (~5-8 s per kernel on 2 cores). The
compile runs in a child process without ``TRITON_INTERPRET`` (the test session sets it, and then
``triton.jit`` makes interpreted functions that cannot be compiled).
"""

import inspect
import json
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from fastvideo_cute.kernels.triton import kv_range_lists as KR  # noqa: E402
from fastvideo_cute.kernels.triton import packed_steps as PS  # noqa: E402
from fastvideo_cute.kernels.triton import q_group_lists as QG  # noqa: E402
from fastvideo_cute.kernels.triton import vsa_coarse_bwd as CB  # noqa: E402
from fastvideo_cute.kernels.triton import vsa_coarse_fwd2 as CF2  # noqa: E402
from fastvideo_cute.kernels.triton import vsa_compress as C  # noqa: E402
from fastvideo_cute.kernels.triton import vsa_gate as G  # noqa: E402
from fastvideo_cute.kernels.triton import vsa_select as S  # noqa: E402
from fastvideo_cute.kernels.triton import vsa_topk_radix as TR  # noqa: E402

_INT_POINTERS = {"KV_SIZES", "IDX", "NUM", "Q_SIZES"}
_BF16_POINTERS = {"Q", "K", "V", "KO", "VO", "OS", "G", "OUT"}  # the glue's bf16 model tensors (OUT of the gate)
_FLOATS = {"sm_scale"}
_INTS = {"Qb", "KVb", "D", "NQT", "K", "R", "H", "NT", "W", "KVB", "GROUP", "GROUPS"}  # sizes (the other upper-case names are pointers)


def _signature(kernel, constexprs):
    sig = {}
    bf16 = kernel in (C._vsa_compress_fwd_kernel, G._vsa_gate_fwd_kernel)
    ints_only = kernel in (KR._kv_range_lists_kernel, QG._q_group_lists_kernel,  # every pointer int32
                           PS._packed_steps_kernel)
    for name, param in inspect.signature(kernel.fn).parameters.items():
        if "constexpr" in str(param.annotation):
            sig[name] = "constexpr"
        elif name in _FLOATS:
            sig[name] = "fp32"
        elif bf16 and name in _BF16_POINTERS:
            sig[name] = "*bf16"
        elif name.isupper() and name not in _INTS:
            sig[name] = "*i32" if name in _INT_POINTERS or ints_only else "*fp32"
        else:
            sig[name] = "i32"
    missing = [n for n, t in sig.items() if t == "constexpr" and n not in constexprs]
    assert not missing, missing
    return sig


def _tiles(cfg):
    bq, bkv, bd, warps = cfg[:4]
    return dict(BLOCK_Q=bq, BLOCK_KV=bkv, BLOCK_D=bd), warps


def _cases():
    for d in (64, 128, 256):
        for prec in ("tf32x3", "ieee"):
            for phase, kernel in (("a", CB._coarse_bwd_q_kernel), ("b", CB._coarse_bwd_kv_kernel),
                                  ("fused", CB._vsa_coarse_bwd_kernel)):
                tiles, warps = _tiles(CB.coarse_bwd_tiles(phase, d))
                precs = dict(GRAD_PRECISION=prec) if phase == "b" else dict(PRECISION=prec, GRAD_PRECISION=prec)
                yield f"bwd-{phase}-d{d}-{prec}", kernel, dict(tiles, **precs), warps
            tiles, warps = _tiles(S.coarse_fwd_tiles(d))
            yield (f"fwd-d{d}-{prec}", S._vsa_coarse_fwd_kernel,
                   dict(tiles, WRITE_SCORES=True, WRITE_OUT32=True, PRECISION=prec, SPLITS=1), warps)
    for phase, kernel in (("a", CB._coarse_bwd_q_kernel), ("b", CB._coarse_bwd_kv_kernel)):  # tf32 gradients
        tiles, warps = _tiles(CB.coarse_bwd_tiles(phase, 128))
        precs = dict(GRAD_PRECISION="tf32") if phase == "b" else dict(PRECISION="tf32x3", GRAD_PRECISION="tf32")
        yield f"bwd-{phase}-d128-gtf32", kernel, dict(tiles, **precs), warps
    yield "topk-2048", S._vsa_topk_kernel, dict(BLOCK_KV=2048, TAKE_ALL=False), 1
    # the tuning variants the glue benchmark sweeps (benchmarks/bench_glue.py)
    main, tail = S.topk_chunks(624)
    for rows, warps, early in ((1, 1, True), (4, 4, True), (2, 1, False)):
        yield (f"topk-rows{rows}w{warps}{'x' if early else ''}", S._vsa_topk_rows_kernel,
               dict(ROWS=rows, MAIN=main, TAIL=tail, EARLY_EXIT=early), warps)
    # vsa_topk_radix's variants: 624 columns (two chunks) and HunyuanVideo's 1800 (one chunk of 2048)
    for kvb in (624, 1800):
        main, tail = TR.radix_chunks(kvb)
        for warps in (1, 2):
            yield (f"topk-bisectw{warps}-{kvb}", TR._vsa_topk_bisect_kernel,
                   dict(MAIN=main, TAIL=tail, VSTEPS=TR.VALUE_STEPS, DIV4=True), warps)
        for warps, early in ((1, True), (4, False)):
            yield (f"topk-radixw{warps}{'x' if early else ''}-{kvb}", TR._vsa_topk_radix_kernel,
                   dict(MAIN=main, TAIL=tail, EARLY_EXIT=early, DIV4=True), warps)
    for bq, bkv, warps, splits in ((64, 32, 4, 2), (64, 64, 4, 1)):
        yield (f"fwd-{bq}x{bkv}w{warps}s{splits}-tf32x3", S._vsa_coarse_fwd_kernel,
               dict(BLOCK_Q=bq, BLOCK_KV=bkv, BLOCK_D=128, WRITE_SCORES=True, WRITE_OUT32=False,
                    PRECISION="tf32x3", SPLITS=splits), warps)
    yield ("combine-s2", S._vsa_coarse_combine_kernel,
           dict(BLOCK_Q=32, BLOCK_D=128, WRITE_OUT32=True, SPLITS=2), 4)
    # the two-phase coarse forward (vsa_coarse_fwd2.py) with its default tiles (num_stages: _STAGES)
    for d in (128, 256):
        (bq1, bkv1, bd1, w1, _), (bq2, bkv2, bd2, w2, _) = CF2.coarse_fwd2_tiles(d)
        for prec in ("tf32x3", "ieee"):
            yield (f"fwd2-p1-d{d}-{prec}", CF2._coarse_fwd2_scores_kernel,
                   dict(BLOCK_Q=bq1, BLOCK_KV=bkv1, BLOCK_D=bd1, PRECISION=prec), w1)
            yield (f"fwd2-p2-d{d}-{prec}", CF2._coarse_fwd2_out_kernel,
                   dict(BLOCK_Q=bq2, BLOCK_KV=bkv2, BLOCK_D=bd2, BLOCK_T=32, WRITE_OUT32=True, PRECISION=prec), w2)
    for mode in C.COMPRESS_MODES:
        yield (f"compress-{mode}", C._vsa_compress_fwd_kernel,
               dict(BLOCK=64, BLOCK_T=64, BLOCK_D=128, MODE=mode, EVICT="evict_first", WRITE_K=False,
                    WRITE_V=False), 4)
    # what video_sparse_attn runs for cuDNN / FA4 with partial tiles: the padding-zeroed K/V copies
    yield ("compress-split-write", C._vsa_compress_fwd_kernel,
           dict(BLOCK=64, BLOCK_T=32, BLOCK_D=128, MODE="split", EVICT="", WRITE_K=True, WRITE_V=True), 2)
    for nb in (1, 4):
        yield (f"gate-nb{nb}", G._vsa_gate_fwd_kernel,
               dict(BLOCK=64, BLOCK_T=64, BLOCK_D=128, HAS_GATE=True, NB=nb, EVICT="evict_first"), 8)
    # the sm90 forward's kv-range lists (Wan-14B: 180 entries per row -> 256 lanes; 2 and 3 ranges)
    for splits in (2, 3):
        yield f"kv-ranges-s{splits}", KR._kv_range_lists_kernel, dict(SPLITS=splits, ROWS=4, BLOCK_W=256), 4
    # the Hopper backward's q-group split (two groups of 512 at 65,536 tokens: 2 group lanes)
    yield "q-groups", QG._q_group_lists_kernel, dict(CHUNK=128, G=2), 4
    # the sm90 forward's packed step lists (Wan-14B: 180 entries per row -> 256 lanes), with tile sizes
    yield "packed-steps", PS._packed_steps_kernel, dict(HAS_SIZES=True, ROWS=4, BLOCK_W=256), 4


# d=128 with tf32x3 is what runs on the H200; the rest is breadth, kept to one precision per size
_PICK = {"bwd-a-d128-tf32x3", "bwd-b-d128-tf32x3", "bwd-fused-d128-tf32x3", "fwd-d128-tf32x3",
         "bwd-fused-d256-ieee", "bwd-b-d64-ieee", "topk-2048",
         "topk-rows1w1x", "topk-rows4w4x", "topk-rows2w1", "fwd-64x32w4s2-tf32x3", "fwd-64x64w4s1-tf32x3",
         "topk-bisectw1-624", "topk-bisectw1-1800", "topk-bisectw2-1800", "topk-radixw1x-624", "topk-radixw4-1800",
         "fwd2-p1-d128-tf32x3", "fwd2-p2-d128-tf32x3", "fwd2-p1-d256-ieee",
         "combine-s2", "compress-fused", "compress-split", "compress-preload", "compress-split-write", "gate-nb1", "gate-nb4",
         "kv-ranges-s2", "kv-ranges-s3", "q-groups", "packed-steps"}
CASES = [c for c in _cases() if c[0] in _PICK]
# num_stages of the cases launched with one (the rest: Triton's default)
_STAGES = {f"fwd2-{p}-d{d}-{prec}": cfg[4] for d in (128, 256) for p, cfg in zip(("p1", "p2"), CF2.coarse_fwd2_tiles(d))
           for prec in ("tf32x3", "ieee") if cfg[4] is not None}


def _compile(name):
    try:
        return _compile_one(name)
    except Exception as exc:  # noqa: BLE001 - reported per case by the test
        return {"error": f"{type(exc).__name__}: {str(exc)[-3000:]}"}


def _compile_one(name):
    kernel, constexprs, warps = next((k, c, w) for n, k, c, w in _cases() if n == name)
    src = ASTSource(kernel, _signature(kernel, constexprs), constexprs)
    options = {"num_warps": warps}
    if name == "fwd-64x64w4s1-tf32x3":
        options["num_stages"] = 1  # 64 x 64 with tf32x3 fits in shared memory with 1-2 stages only
    elif name in _STAGES:
        options["num_stages"] = _STAGES[name]
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    ptx = compiled.asm["ptx"]
    return {"cubin": len(compiled.asm["cubin"]), "mma": "mma" in ptx}


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import json, sys; from tests.kernels.triton import test_triton_compile_sm90 as T; "
            "print(json.dumps({n: T._compile(n) for n in sys.argv[1:]}))")
    run = subprocess.run([sys.executable, "-c", code, *[c[0] for c in CASES]], env=env, capture_output=True,
                         text=True, timeout=900, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                             os.path.dirname(os.path.abspath(__file__))))))
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_compiles_for_sm90(compiled, name):
    res = compiled[name]
    assert "error" not in res, res.get("error")
    assert res["cubin"] > 0
    if "tf32x3" in name:
        assert res["mma"], "tensor-core dots expected in the PTX"
