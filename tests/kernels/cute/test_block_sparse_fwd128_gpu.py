"""GPU acceptance tests of the CuTe DSL mma.sync + TMA block-sparse forward (128-token blocks).

Seed 004's acceptance tests, ported to :func:`fastvideo_cute.adapters.cute_sm120.sm120_block_sparse_fwd`
and compared against :func:`fastvideo_cute.reference.block_sparse_attn_reference` (fp32). The kernel
also zeroes the *query* rows at or past their block's size (the reference computes them), so the
comparison covers the rows that are valid and have a valid key; every other row must be exactly 0.
So that a missed store cannot hide behind a recycled zero buffer, each call first leaves a NaN block
of the output's size in the caching allocator.

Runs on sm_90 (H200: the verification target), sm_120 and sm_121 (GB10: the kernel's target).
Run: ``python -m pytest -q -m gpu tests/kernels/cute/test_block_sparse_fwd128_gpu.py``
"""

import os

import pytest
import torch

from fastvideo_cute.adapters import cute_sm120 as sm120
from fastvideo_cute.metadata import index_to_map, map_to_index
from fastvideo_cute.reference import block_sparse_attn_reference

BLOCK = 128
HEAD_DIM = 128


def _runnable() -> bool:
    if not torch.cuda.is_available():
        return False
    if sm120.sm120_arch(torch.device("cuda")) is None:
        return False
    return sm120.cute_dsl_importable()


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _runnable(), reason="needs an sm_90/sm_120/sm_121 GPU and the CuTe DSL"),
]


# The modes under test: both by default; FASTVIDEO_CUTE_SM120_TEST_VARIANTS=w4r3 picks some (run a new mode
# under `timeout -s KILL`: a protocol bug hangs the GPU, as a two-group variant once did).
_DEFAULT_VARIANTS = ",".join(sm120.VARIANTS)
_TEST_VARIANTS = [v for v in os.environ.get("FASTVIDEO_CUTE_SM120_TEST_VARIANTS", _DEFAULT_VARIANTS).split(",") if v]


@pytest.fixture(autouse=True, params=_TEST_VARIANTS)
def variant(request, monkeypatch):
    """Every test runs on each mode under test (see _TEST_VARIANTS)."""
    monkeypatch.setenv("FASTVIDEO_CUTE_SM120_KERNEL", request.param)
    return request.param


@pytest.mark.parametrize(
    "num_blocks,counts,sizes",
    [(1, [0], [128]), (1, [1], [64]), (1, [1], [128]), (2, [2, 2], [128, 128]), (4, [3, 1, 0, 4], [100, 128, 30, 128])],
)
def test_tiny_cases_first(num_blocks, counts, sizes):
    """The smallest protocols first (no chunk, one chunk, two, refills), so a hang names its case."""
    gen = torch.Generator(device="cuda").manual_seed(num_blocks)
    q, k, v = (torch.randn((1, 2, num_blocks * BLOCK, HEAD_DIM), device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))
    idx = torch.arange(num_blocks, device="cuda", dtype=torch.int32).repeat(1, 2, num_blocks, 1).contiguous()
    num = torch.tensor(counts, device="cuda", dtype=torch.int32).repeat(1, 2, 1).contiguous()
    vbs = torch.tensor(sizes, device="cuda", dtype=torch.int32)
    check((q, k, v, idx, num, vbs))


def make_case(num_blocks=8, topk=4, heads=4, batch=1, ragged=False, counts=None, empty_blocks=(), seed=0):
    """q/k/v [B, H, S, 128] (padding rows zero), map_to_index-shaped lists, vbs.

    ``counts`` cycles over the (b, h, i) rows instead of ``topk``; ``empty_blocks`` get size 0.
    """
    gen = torch.Generator(device="cuda").manual_seed(seed)
    seq = num_blocks * BLOCK
    q, k, v = (torch.randn((batch, heads, seq, HEAD_DIM), device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))
    rows = batch * heads * num_blocks
    idx = torch.full((rows, num_blocks), -1, dtype=torch.int32, device="cuda")
    num = torch.empty(rows, dtype=torch.int32, device="cuda")
    for r in range(rows):
        n = min(num_blocks, topk if counts is None else int(counts[r % len(counts)]))
        idx[r, :n] = torch.randperm(num_blocks, device="cuda", generator=gen)[:n].sort().values.to(torch.int32)
        num[r] = n
    if ragged:
        vbs = torch.randint(1, BLOCK + 1, (num_blocks,), dtype=torch.int32, device="cuda", generator=gen)
    else:
        vbs = torch.full((num_blocks,), BLOCK, dtype=torch.int32, device="cuda")
    for b in empty_blocks:
        vbs[b] = 0
    valid = (torch.arange(BLOCK, device="cuda")[None] < vbs[:, None]).reshape(-1)
    for t in (q, k, v):
        t[:, :, ~valid] = 0
    return q, k, v, idx.view(batch, heads, num_blocks, num_blocks), num.view(batch, heads, num_blocks), vbs


def reference(q, k, v, idx, num, vbs):
    """fp32 reference and the mask of rows that must match it (valid row with a valid key)."""
    block_map = index_to_map(idx, num, vbs.numel())
    out, lse = block_sparse_attn_reference(q, k, v, block_map, vbs, block_size=(BLOCK, BLOCK))
    q_valid = (torch.arange(BLOCK, device=q.device)[None] < vbs[:, None]).reshape(-1)
    has = torch.isfinite(lse) & q_valid.view(1, 1, -1)
    return out, has


def run_with_nan_pool(q, k, v, idx, num, vbs, out=None):
    sentinel = torch.full_like(q, float("nan"))
    del sentinel
    out = sm120.sm120_block_sparse_fwd(q, k, v, idx, num, vbs, out=out)
    torch.cuda.synchronize()
    return out


def check(case, atol=2e-2):
    q, k, v, idx, num, vbs = case
    ok, reason = sm120.sm120_fwd_support(q, k, v, idx, num, vbs)
    assert ok, reason
    out = run_with_nan_pool(q, k, v, idx, num, vbs)
    ref, has = reference(q, k, v, idx, num, vbs)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    assert torch.isfinite(out).all(), "the kernel left elements unwritten (or produced non-finite values)"
    assert (out[~has] == 0).all(), "rows without a key (padding rows, empty selections) must be exactly zero"
    torch.testing.assert_close(out.float()[has], ref[has], atol=atol, rtol=2e-2)
    return out


def test_forward_matches_reference():
    check(make_case())


def test_forward_matches_reference_ragged():
    """variable_block_sizes as FastVideo passes it: padded keys masked, padded rows zero."""
    check(make_case(ragged=True, seed=1))


def test_lists_from_map_to_index():
    """The real call path: a random block map through map_to_index (the -1 filler is never read)."""
    q, k, v, _, _, vbs = make_case(num_blocks=10, ragged=True, heads=3, seed=2)
    gen = torch.Generator(device="cuda").manual_seed(3)
    block_map = torch.rand((1, 3, 10, 10), device="cuda", generator=gen) < 0.35
    idx, num = map_to_index(block_map)
    check((q, k, v, idx, num, vbs))


@pytest.mark.parametrize("topk", [1, 2, 3, 5, 7, 8])
def test_any_selection_size(topk):
    check(make_case(ragged=True, topk=topk, seed=topk))


@pytest.mark.parametrize("num_blocks", [1, 3, 7, 9])
def test_odd_block_counts(num_blocks):
    check(make_case(num_blocks=num_blocks, topk=max(1, num_blocks // 2), ragged=True, seed=num_blocks))


def test_zero_count_rows_and_non_uniform_counts():
    check(make_case(num_blocks=8, counts=(0, 3, 0, 8, 1, 5), ragged=True, seed=7))


def test_selected_blocks_without_valid_keys():
    """A selected block of size 0 contributes nothing; a row left without keys is zero."""
    check(make_case(num_blocks=8, topk=3, ragged=True, empty_blocks=(2, 5), seed=11))


def test_every_selected_block_empty():
    """Selections that consist only of size-0 blocks: the whole tile is zero."""
    q, k, v, idx, num, vbs = make_case(num_blocks=6, topk=2, ragged=True, seed=12)
    idx[..., 0] = 1
    idx[..., 1] = 4
    num.fill_(2)
    vbs[1] = 0
    vbs[4] = 0
    out = check((q, k, v, idx, num, vbs))
    assert (out == 0).all()


def test_out_of_range_indices_count_as_empty():
    q, k, v, idx, num, vbs = make_case(num_blocks=5, topk=3, ragged=True, seed=13)
    expected, has = reference(q, k, v, idx, num, vbs)
    bad = idx.clone()
    bad[..., 3] = 99  # within each row's count of 4: outside [0, T), so an empty tile
    bad[0, 0, 0, 3] = -7
    out = run_with_nan_pool(q, k, v, bad, num + 1, vbs)
    assert (out[~has] == 0).all()
    torch.testing.assert_close(out.float()[has], expected[has], atol=2e-2, rtol=2e-2)


def test_batch_and_heads():
    check(make_case(num_blocks=6, topk=3, heads=3, batch=2, ragged=True, seed=13))


def test_many_waves():
    """More CTAs than SMs and long selections: the phased walk starts mid-selection and wraps."""
    check(make_case(num_blocks=64, topk=24, heads=8, ragged=True, seed=17))


def test_walks_longer_than_a_warp():
    """Selections of more than 32 and 64 entries (w4r3 reads the walk 32 entries at a time, one
    per lane, and refills every 32), phased (2 * count <= tiles) and walked from the
    front, beside zero counts, ragged sizes and selected blocks of size 0."""
    check(make_case(num_blocks=136, counts=(33, 64, 65, 68, 0, 97, 31, 32, 130), heads=2, ragged=True,
                    empty_blocks=(3, 77), seed=37))


def test_long_selections_walk_from_the_front():
    """Selections of more than half of the tiles (the walk starts at entry 0)."""
    check(make_case(num_blocks=12, topk=10, heads=4, ragged=True, seed=18))


def test_row_max_growing_and_shrinking_along_the_walk():
    """Key blocks of very different scales: row maxima jump by far more than the lazy-rescale
    threshold (2**8, ~63 raw score units here) in both directions along the walk."""
    q, k, v, idx, num, vbs = make_case(num_blocks=8, topk=6, heads=2, seed=31)
    scale = (1.0 + 2.0 * torch.arange(8, device="cuda", dtype=torch.float32)).repeat_interleave(BLOCK)
    k = (k.float() * scale.view(1, 1, -1, 1)).to(torch.bfloat16)
    check((q, k, v, idx, num, vbs))


def test_deterministic():
    case = make_case(num_blocks=16, topk=6, heads=4, ragged=True, seed=19)
    first = sm120.sm120_block_sparse_fwd(*case)
    second = sm120.sm120_block_sparse_fwd(*case)
    assert torch.equal(first, second)


def test_out_argument_is_written_whole():
    case = make_case(num_blocks=4, topk=2, ragged=True, seed=20)
    out = torch.full_like(case[0], float("nan"))
    got = run_with_nan_pool(*case, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("fill", [float("nan"), float("inf")])
def test_padding_holding_nan_or_inf_does_not_leak(fill):
    """Padding rows of q, k and v may hold anything: 0 * NaN must not reach a valid row."""
    q, k, v, idx, num, vbs = make_case(num_blocks=6, topk=3, ragged=True, seed=23)
    assert (vbs % 64 != 0).any(), "the case must have partial 64-key chunks"
    expected, has = reference(q, k, v, idx, num, vbs)
    valid = (torch.arange(BLOCK, device="cuda")[None] < vbs[:, None]).reshape(-1)
    for t in (q, k, v):
        t[:, :, ~valid] = fill
    out = run_with_nan_pool(q, k, v, idx, num, vbs)
    assert torch.isfinite(out).all()
    assert (out[~has] == 0).all()
    torch.testing.assert_close(out.float()[has], expected[has], atol=2e-2, rtol=2e-2)


def test_nan_in_a_valid_query_row_reaches_its_output_row():
    """Like the other routes, a NaN input row gives a NaN output row instead of a silent zero."""
    q, k, v, idx, num, vbs = make_case(num_blocks=4, topk=2, seed=29)
    expected, has = reference(q, k, v, idx, num, vbs)
    q[0, 0, 5] = float("nan")
    out = run_with_nan_pool(q, k, v, idx, num, vbs)
    assert torch.isnan(out[0, 0, 5]).all()
    rest = has.clone()
    rest[0, 0, 5] = False
    assert torch.isfinite(out[rest]).all() and (out[~has] == 0).all()
    torch.testing.assert_close(out.float()[rest], expected[rest], atol=2e-2, rtol=2e-2)


def test_launch_limits(monkeypatch):
    """Sizes one launch cannot cover: the support predicate refuses them before any launch."""
    assert sm120.sm120_within_launch_limits(1, 65535, 2 * BLOCK, 2, 2)
    assert not sm120.sm120_within_launch_limits(2, 32768, 2 * BLOCK, 2, 2)
    assert not sm120.sm120_within_launch_limits(1, 2, 2**30, 2**23, 1)
    assert not sm120.sm120_within_launch_limits(1, 1, 2**16 * BLOCK, 2**16, 2**16)
    q, k, v, idx, num, vbs = make_case(num_blocks=2, topk=1, heads=4)
    assert sm120.sm120_fwd_support(q, k, v, idx, num, vbs)[0]
    monkeypatch.setattr(sm120, "LIMITS", sm120.LIMITS._replace(max_batch_heads=3))
    ok, reason = sm120.sm120_fwd_support(q, k, v, idx, num, vbs)
    assert not ok and "launch limits" in reason
    with pytest.raises(ValueError, match="launch limits"):
        sm120.sm120_block_sparse_fwd(q, k, v, idx, num, vbs)


def test_support_rejects_what_it_cannot_run():
    q, k, v, idx, num, vbs = make_case(num_blocks=2, topk=1)
    assert sm120.sm120_fwd_support(q, k, v, idx, num, vbs)[0]
    assert not sm120.sm120_fwd_support(q.half(), k.half(), v.half(), idx, num, vbs)[0]
    q64 = q[..., :64].contiguous()
    assert not sm120.sm120_fwd_support(q64, q64, q64, idx, num, vbs)[0]
    qt = q.transpose(1, 2)
    assert not sm120.sm120_fwd_support(qt, qt, qt, idx, num, vbs)[0]
    qs = q[:, :, :BLOCK].contiguous()
    assert not sm120.sm120_fwd_support(qs, qs, qs, idx, num, vbs)[0]
    assert not sm120.sm120_fwd_support(q, k, v, idx, num, vbs.float())[0]
    assert not sm120.sm120_fwd_support(q.cpu(), k.cpu(), v.cpu(), idx, num, vbs)[0]
