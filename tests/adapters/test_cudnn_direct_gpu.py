"""The direct TVM-FFI call of cuDNN's SM90 blk64 forward against cuDNN's own wrapper, on an H200.

Both run cuDNN's ``BlockSparseAttnForwardSm90Blk64`` on the same inputs, so out and lse must be
*bitwise* equal (compared as integers: -inf and signed zeros included), in both layouts, with
partial block sizes (sizes 0 and 1 among them) and without block sizes, with empty rows
(``allow_empty``) and without, B=2, q_len != kv_len, fp16 and bf16, head dims 64/96/128, the default
and an explicit softmax scale. One case is also checked against the fp32 reference with the
tolerances of tests/adapters/test_cudnn_gpu.py (their origin is stated there). The stream test
checks that the call runs on the caller's current stream; the host-time test prints the host
microseconds per call of the direct path (its predicate included) and of cuDNN's wrapper with the
GPU kept busy by a queued ``torch.cuda._sleep``, and asserts that the direct one is cheaper.

Run on the H200 (CuTe stack of shared/gpu/README.md plus nvidia-cudnn-frontend==1.32.0):
    PYTHONPATH=$PWD:$PYTHONPATH python3 -m pytest -q -rs -s tests/adapters/test_cudnn_direct_gpu.py
"""

import time

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU boxes too
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("the direct path is SM90 only", allow_module_level=True)

from fastvideo_cute.adapters import cudnn_bsa as C  # noqa: E402
from fastvideo_cute.adapters import cudnn_bsa_direct as D  # noqa: E402
from fastvideo_cute.adapters.cudnn_bsa_metadata import build_cudnn_metadata  # noqa: E402
from fastvideo_cute.metadata import map_to_index  # noqa: E402
from fastvideo_cute.validation import smallest_block  # noqa: E402

try:
    CD = C.load_cudnn()
except ImportError as exc:  # pragma: no cover - depends on the box
    pytest.skip(f"cuDNN BSA not importable: {str(exc).splitlines()[0]}", allow_module_level=True)

from tests.adapters.test_cudnn_gpu import LSE_TOL, OUT_TOL, _bhsd, _check, _empty_rows, _make, _reference  # noqa: E402

BLOCK = 64
_INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def _meta(q, k, block_map, sizes, layout, full):
    b, h = block_map.shape[:2]
    lay = "bshd" if layout == "bshd" else "bhsd"
    sq, skv = _bhsd(q, lay).shape[2], _bhsd(k, lay).shape[2]
    idx, num = map_to_index(block_map)
    return build_cudnn_metadata(idx, num, sizes, block_size=BLOCK, batch=b, heads=h, q_len=sq, kv_len=skv,
                                all_full=full, smallest=smallest_block(sizes, BLOCK))


def _wrapper(q, k, v, meta, layout, scale, allow_empty):
    res = CD.fwd(q, k, v, meta.q2k_block_index, None, meta.block_sizes, meta.q2k_block_nums,
                 sparse_block_size=meta.sparse_block, allow_empty_block_nums=allow_empty, softmax_scale=scale,
                 layout="bshd" if layout == "bshd" else "bhsd")
    return res["o_tensor"], res["lse_tensor"]


def _direct(q, k, v, meta, layout, scale, allow_empty):
    bshd = layout == "bshd"
    reason = D.direct_fwd_problems(q, k, v, bshd=bshd, sparse_block=meta.sparse_block)
    assert reason is None, f"the direct path refuses this call: {reason}"
    return D.cudnn_fwd_direct(q, k, v, meta.q2k_block_index, meta.q2k_block_nums, meta.block_sizes, bshd=bshd,
                              softmax_scale=scale, allow_empty=allow_empty)


def _bitwise(tag, got, want):
    assert got.shape == want.shape and got.dtype == want.dtype and got.stride() == want.stride(), \
        f"{tag}: {got.dtype} {tuple(got.shape)} {got.stride()} vs {want.dtype} {tuple(want.shape)} {want.stride()}"
    iv = _INT_VIEW[got.dtype]
    same = got.view(iv) == want.view(iv)
    assert bool(same.all()), f"{tag}: {int((~same).sum())} of {same.numel()} elements differ bitwise"


def _inputs(layout, *, full, allow_empty, d=128, dtype=torch.bfloat16, seed=0):
    q, k, v, block_map, sizes = _make(BLOCK, d=d, dtype=dtype, layout=layout, full=full, seed=seed)
    if not allow_empty:  # every row selects the full block 0: no empty row
        block_map[..., 0] = True
        assert int(sizes[0]) == BLOCK
    return q, k, v, block_map, sizes


CASES = [  # (layout, full, allow_empty, d, dtype, scale)
    ("bshd", False, True, 128, torch.bfloat16, None),
    ("bhsd", False, True, 128, torch.bfloat16, None),
    ("bshd", True, True, 128, torch.bfloat16, None),
    ("bhsd", True, False, 128, torch.bfloat16, 0.1),
    ("bshd", False, False, 128, torch.bfloat16, 0.1),
    ("bhsd_view", False, True, 128, torch.bfloat16, None),
    ("bshd", False, True, 64, torch.float16, None),
    ("bhsd", True, True, 96, torch.float16, 0.2),
]


@pytest.mark.parametrize("layout, full, allow_empty, d, dtype, scale", CASES)
def test_direct_equals_cudnns_wrapper_bitwise(layout, full, allow_empty, d, dtype, scale):
    q, k, v, block_map, sizes = _inputs(layout, full=full, allow_empty=allow_empty, d=d, dtype=dtype)
    meta = _meta(q, k, block_map, sizes, layout, full)
    assert (meta.block_sizes is None) == full
    out_w, lse_w = _wrapper(q, k, v, meta, layout, scale, allow_empty)
    out_d, lse_d = _direct(q, k, v, meta, layout, scale, allow_empty)
    torch.cuda.synchronize()
    empty = _empty_rows(block_map, sizes, BLOCK)
    print(f"[direct vs wrapper {layout} full={full} allow_empty={allow_empty} d={d} {dtype} scale={scale}] "
          f"empty rows: {int(empty.sum())}")
    assert bool(empty.any()) == allow_empty  # _make leaves row (0, 0, 0) empty; without allow_empty none is
    _bitwise("out", out_d, out_w)
    _bitwise("lse", lse_d, lse_w)
    assert torch.isfinite(out_d).all()


def test_direct_matches_the_fp32_reference():
    layout = "bshd"
    q, k, v, block_map, sizes = _inputs(layout, full=False, allow_empty=True)
    meta = _meta(q, k, block_map, sizes, layout, False)
    out, lse = _direct(q, k, v, meta, layout, None, True)
    ref_out, ref_lse, _ = _reference(q, k, v, block_map, sizes, BLOCK, layout)
    print("[direct vs fp32 reference]")
    _check("out", ref_out, out, OUT_TOL)
    empty = _empty_rows(block_map, sizes, BLOCK)
    assert empty.any() and (~empty).any()
    out_bhsd = _bhsd(out, layout)
    assert torch.equal(out_bhsd[empty], torch.zeros_like(out_bhsd[empty]))
    assert torch.isneginf(lse[empty]).all()
    lse_err = (lse[~empty] - ref_lse[~empty]).abs().max().item()
    print(f"  lse: max_abs={lse_err:.3e}")
    assert lse_err < LSE_TOL


def test_direct_runs_on_the_current_stream():
    """On a side stream, q is rewritten after a queued sleep and the call follows: had the kernel
    run on another stream, it would read q before the rewrite."""
    layout = "bshd"
    q, k, v, block_map, sizes = _inputs(layout, full=False, allow_empty=True, seed=3)
    meta = _meta(q, k, block_map, sizes, layout, False)
    out_w, lse_w = _wrapper(q, k, v, meta, layout, None, True)
    q_late = torch.zeros_like(q)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(int(2e8))  # ~0.1 s
        q_late.copy_(q)
        out_d, lse_d = _direct(q_late, k, v, meta, layout, None, True)
    side.synchronize()
    _bitwise("out", out_d, out_w)
    _bitwise("lse", lse_d, lse_w)


def _host_us(call, iters):
    """Host microseconds per call with the GPU busy (a ~1 s sleep queued ahead), after 3 warm calls."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    host = (time.perf_counter() - t0) * 1e6 / iters
    torch.cuda.synchronize()
    return host


def test_host_time_direct_vs_wrapper():
    layout, iters = "bshd", 50
    b, h, s = 1, 12, 4096
    g = torch.Generator(device="cpu").manual_seed(7)
    q, k, v = (torch.randn(b, s, h, 128, generator=g).to("cuda", torch.bfloat16) for _ in range(3))
    nb = s // BLOCK
    block_map = torch.rand(b, h, nb, nb, generator=g).to("cuda") < 0.125
    block_map[..., 0] = True
    sizes = torch.full((nb,), BLOCK, dtype=torch.int32, device="cuda")
    sizes[-1] = BLOCK - 20
    meta = _meta(q, k, block_map, sizes, layout, False)

    def direct():
        _direct(q, k, v, meta, layout, None, True)

    def wrapper():
        _wrapper(q, k, v, meta, layout, None, True)

    wrapper_us = _host_us(wrapper, iters)
    direct_us = _host_us(direct, iters)
    print(f"[host time per call, {iters} calls, GPU busy] direct (predicate + call): {direct_us:.1f} us, "
          f"cuDNN wrapper: {wrapper_us:.1f} us ({wrapper_us / direct_us:.1f}x)")
    assert direct_us < wrapper_us
