"""GPU parity tests of the CuTe DSL tcgen05 block-sparse forward (64-token blocks, sm_100).

:func:`fastvideo_cute.adapters.cute_sm100_fwd.sm100_block_sparse_fwd64` against
:func:`fastvideo_cute.reference.block_sparse_attn_reference` (fp32; every query row, padding rows
included, and the natural-log LSE) and against the Triton route (64-token blocks). Cases: tiny
protocols first (so a hang names its case), ragged ``kv_block_sizes``, zero-count rows and
size-0 blocks (out exactly 0, LSE -inf), NaN/Inf in padding K/V (must not leak), a NaN query
row (NaN out and LSE, other rows intact), and 65,536 tokens (sampled query blocks against a
per-block fp32 reference). So that a missed store cannot hide behind a recycled buffer, each call
first leaves a NaN block of the outputs' sizes in the caching allocator.

The kernel tests run only on a compute-capability 10.x GPU (B200/GB200: sm_100; B300: sm_103);
skipped elsewhere. The ``test_softmax_math_probe_*`` tests run the kernel's arch-independent
masking/softmax/LSE code (the shared ``common/softmax.py``) through its probe kernel
(``block_sparse_fwd64/softmax_probe.py``) on any CUDA GPU (sm_90 included), so that part is
verifiable on an H200.
Run: ``python -m pytest -q -m gpu tests/kernels/cute/test_block_sparse_fwd64_gpu.py``
(on a first run, wrap it in ``timeout -s KILL 600``: a protocol bug shows as a hang).
"""

import warnings

import pytest
import torch

from fastvideo_cute.adapters import cute_sm100_fwd as sm100
from fastvideo_cute.metadata import index_to_map
from fastvideo_cute.reference import block_sparse_attn_reference

BLOCK = 64
HEAD_DIM = 128
SCALE = HEAD_DIM ** -0.5


def _runnable() -> bool:
    if not torch.cuda.is_available():
        return False
    if torch.cuda.get_device_capability()[0] != 10:
        return False
    return sm100.cute_dsl_importable()


pytestmark = [pytest.mark.gpu]
needs_sm100 = pytest.mark.skipif(not _runnable(),
                                 reason="needs a compute-capability 10.x GPU (sm_100/sm_103) and the CuTe DSL")
needs_cuda = pytest.mark.skipif(not (torch.cuda.is_available() and sm100.cute_dsl_importable()),
                                reason="needs a CUDA GPU and the CuTe DSL")


@pytest.fixture(autouse=True)
def _quiet_unverified_warning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*UNVERIFIED on hardware.*")
        yield


def run(q, k, v, idx, num, vbs):
    ok, reason = sm100.sm100_fwd64_support(q, k, v, idx, num, vbs)
    assert ok, reason
    sentinel = (torch.full_like(q, float("nan")),
                torch.full(q.shape[:3], float("nan"), dtype=torch.float32, device=q.device))
    del sentinel
    out, lse = sm100.sm100_block_sparse_fwd64(q, k, v, idx, num, vbs)
    torch.cuda.synchronize()
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32
    return out, lse


def reference(q, k, v, idx, num, vbs):
    block_map = index_to_map(idx, num, vbs.numel())
    return block_sparse_attn_reference(q, k, v, block_map, vbs, block_size=BLOCK)


def triton_route(q, k, v, idx, num, vbs):
    from fastvideo_cute.backends import triton_backend

    block_map = index_to_map(idx, num, vbs.numel())
    return triton_backend.forward(q, k, v, block_map, vbs, block_size=BLOCK, bshd=False, need_backward=False,
                                  sm_scale=SCALE)


def assert_matches(out, lse, ref_out, ref_lse, atol=2e-2, lse_atol=2e-3):
    has = torch.isfinite(ref_lse)
    # Rows without a valid key: exactly 0 and -inf.
    assert torch.all(out[~has] == 0), "rows without a valid key must be exactly 0"
    assert torch.all(lse[~has] == float("-inf")), "rows without a valid key must have LSE -inf"
    assert torch.isfinite(out[has]).all(), "NaN/Inf leaked into a row with valid keys"
    torch.testing.assert_close(out.float()[has], ref_out.float()[has], atol=atol, rtol=2e-2)
    torch.testing.assert_close(lse[has], ref_lse.float()[has], atol=lse_atol, rtol=1e-4)


def make_case(num_blocks=8, topk=4, heads=2, batch=1, ragged=False, counts=None, empty_blocks=(), seed=0,
              pad_value=None):
    """q/k/v [B, H, S, 128], map_to_index-shaped lists, vbs. ``counts`` cycles over the (b, h, i)
    rows instead of ``topk``; ``empty_blocks`` get size 0; ``pad_value`` fills padding K/V."""
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
    if pad_value is not None:
        valid = (torch.arange(BLOCK, device="cuda")[None] < vbs[:, None]).reshape(-1)
        k[:, :, ~valid] = pad_value
        v[:, :, ~valid] = pad_value
    return q, k, v, idx.view(batch, heads, num_blocks, num_blocks), num.view(batch, heads, num_blocks), vbs


@needs_sm100
@pytest.mark.parametrize(
    "num_blocks,counts,sizes",
    [(1, [0], [64]), (1, [1], [64]), (1, [1], [30]), (1, [1], [0]), (2, [2, 2], [64, 64]),
     (2, [1, 2], [64, 17]), (4, [3, 1, 0, 4], [50, 64, 30, 64])],
)
def test_tiny_cases_first(num_blocks, counts, sizes):
    gen = torch.Generator(device="cuda").manual_seed(num_blocks)
    q, k, v = (torch.randn((1, 2, num_blocks * BLOCK, HEAD_DIM), device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))
    idx = torch.arange(num_blocks, device="cuda", dtype=torch.int32).repeat(1, 2, num_blocks, 1).contiguous()
    num = torch.tensor(counts, device="cuda", dtype=torch.int32).repeat(1, 2, 1).contiguous()
    vbs = torch.tensor(sizes, device="cuda", dtype=torch.int32)
    out, lse = run(q, k, v, idx, num, vbs)
    assert_matches(out, lse, *reference(q, k, v, idx, num, vbs))


@needs_sm100
@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("topk", [1, 3, 8])
def test_matches_reference_and_triton(ragged, topk):
    case = make_case(num_blocks=12, topk=topk, heads=3, batch=2, ragged=ragged, seed=topk)
    out, lse = run(*case)
    ref_out, ref_lse = reference(*case)
    assert_matches(out, lse, ref_out, ref_lse)
    tri_out, tri_lse = triton_route(*case)
    assert_matches(out, lse, tri_out.float(), tri_lse)


@needs_sm100
def test_zero_count_rows_and_empty_blocks():
    case = make_case(num_blocks=10, heads=2, ragged=True, counts=[0, 3, 0, 1, 10, 2], empty_blocks=(1, 4, 7), seed=3)
    out, lse = run(*case)
    ref_out, ref_lse = reference(*case)
    assert (~torch.isfinite(ref_lse)).any(), "the case must have rows without a valid key"
    assert_matches(out, lse, ref_out, ref_lse)


@needs_sm100
@pytest.mark.parametrize("pad_value", [float("nan"), float("inf"), float("-inf")])
def test_padding_nan_inf_does_not_leak(pad_value):
    case = make_case(num_blocks=8, topk=5, heads=2, ragged=True, seed=5, pad_value=pad_value)
    q, k, v, idx, num, vbs = case
    out, lse = run(*case)
    # The reference zeroes padding K/V before any arithmetic.
    assert_matches(out, lse, *reference(*case))


@needs_sm100
def test_nan_query_row_gives_nan_row_only():
    case = make_case(num_blocks=6, topk=3, heads=2, seed=7)
    q, k, v, idx, num, vbs = case
    q[0, 1, 3 * BLOCK + 5, 17] = float("nan")
    out, lse = run(q, k, v, idx, num, vbs)
    assert torch.isnan(out[0, 1, 3 * BLOCK + 5]).all()
    assert torch.isnan(lse[0, 1, 3 * BLOCK + 5])
    mask = torch.ones(q.shape[:3], dtype=torch.bool, device="cuda")
    mask[0, 1, 3 * BLOCK + 5] = False
    ref_out, ref_lse = reference(q, k, v, idx, num, vbs)
    assert torch.isfinite(out[mask]).all()
    torch.testing.assert_close(out.float()[mask], ref_out[mask], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse[mask], ref_lse[mask], atol=2e-3, rtol=1e-4)


@needs_sm100
def test_65536_tokens_sampled_rows():
    """65,536 tokens (1,024 blocks), ragged sizes, 32 blocks per row; sampled query blocks
    against an fp32 reference over their selected keys, and the whole output against Triton."""
    num_blocks, heads, topk = 1024, 2, 32
    gen = torch.Generator(device="cuda").manual_seed(11)
    seq = num_blocks * BLOCK
    q, k, v = (torch.randn((1, heads, seq, HEAD_DIM), device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))
    scores = torch.rand((1, heads, num_blocks, num_blocks), device="cuda", generator=gen)
    sel = scores.topk(topk, dim=-1).indices.sort(dim=-1).values.to(torch.int32)
    idx = torch.cat([sel, torch.full((1, heads, num_blocks, num_blocks - topk), -1, dtype=torch.int32,
                                     device="cuda")], dim=-1).contiguous()
    num = torch.full((1, heads, num_blocks), topk, dtype=torch.int32, device="cuda")
    num[0, 0, 5] = 0  # one empty row block
    vbs = torch.randint(1, BLOCK + 1, (num_blocks,), dtype=torch.int32, device="cuda", generator=gen)
    vbs[::7] = BLOCK
    out, lse = run(q, k, v, idx, num, vbs)
    assert torch.all(out[0, 0, 5 * BLOCK:6 * BLOCK] == 0)
    assert torch.all(lse[0, 0, 5 * BLOCK:6 * BLOCK] == float("-inf"))
    for h in range(heads):
        for i in (0, 1, 5, num_blocks // 2 - 1, (3 * num_blocks) // 4 + 9, num_blocks - 1):
            n = int(num[0, h, i])
            if n == 0:
                continue
            blocks = idx[0, h, i, :n].long()
            keys = (blocks[:, None] * BLOCK + torch.arange(BLOCK, device="cuda")[None]).reshape(-1)
            valid = (torch.arange(BLOCK, device="cuda")[None] < vbs[blocks][:, None]).reshape(-1)
            keys = keys[valid]
            qi = q[0, h, i * BLOCK:(i + 1) * BLOCK].float()
            s = qi @ k[0, h, keys].float().T * SCALE
            ref_lse = torch.logsumexp(s, dim=-1)
            ref_out = torch.softmax(s, dim=-1) @ v[0, h, keys].float()
            torch.testing.assert_close(out[0, h, i * BLOCK:(i + 1) * BLOCK].float(), ref_out, atol=2e-2, rtol=2e-2)
            torch.testing.assert_close(lse[0, h, i * BLOCK:(i + 1) * BLOCK], ref_lse, atol=2e-3, rtol=1e-4)
    tri_out, tri_lse = triton_route(q, k, v, idx, num, vbs)
    assert_matches(out, lse, tri_out.float(), tri_lse)


@needs_sm100
def test_deterministic():
    case = make_case(num_blocks=16, topk=6, heads=2, ragged=True, seed=13)
    out1, lse1 = run(*case)
    out2, lse2 = run(*case)
    assert torch.equal(out1, out2) and torch.equal(lse1, lse2)


# ---------------------------------------------------------------------------------------------
# The arch-independent masking / online softmax / LSE code, through its probe kernel (any GPU).


@pytest.fixture(scope="module")
def probe():
    from fastvideo_cute.kernels.cute.block_sparse_fwd64.softmax_probe import SoftmaxRowProbe

    major, minor = torch.cuda.get_device_capability()
    return SoftmaxRowProbe(SCALE).compile(f"sm_{major}{minor}a")


def _probe_reference(s, val, valid):
    keys = torch.arange(BLOCK, device=s.device)
    mask = (keys[None] < valid.clamp(0, BLOCK)[:, None].long()).reshape(-1)[None].expand_as(s)
    logits = torch.where(mask, s.double() * SCALE, torch.full_like(s, float("-inf"), dtype=torch.float64))
    lse = torch.logsumexp(logits, dim=-1)
    has = mask.any(dim=-1)
    probs = torch.softmax(torch.where(has[:, None], logits, torch.zeros_like(logits)), dim=-1)
    out = (probs * torch.where(mask, val.double(), torch.zeros_like(val, dtype=torch.float64))).sum(-1)
    out = torch.where(has, out, torch.zeros_like(out))
    return out.float(), lse.float()


@needs_cuda
@pytest.mark.parametrize("pad_value", [float("nan"), float("inf"), float("-inf")])
def test_softmax_math_probe_matches_torch(probe, pad_value):
    gen = torch.Generator(device="cuda").manual_seed(21)
    rows, blocks = 300, 7
    s = torch.randn((rows, blocks * BLOCK), device="cuda", generator=gen) * 8
    val = torch.randn((rows, blocks * BLOCK), device="cuda", generator=gen)
    valid = torch.tensor([64, 0, 17, 1, 64, 63, 40], dtype=torch.int32, device="cuda")
    keys = torch.arange(BLOCK, device="cuda")
    pad = ~(keys[None] < valid[:, None]).reshape(-1)
    s[:, pad] = pad_value
    val[:, pad] = pad_value
    s[7, 3] = float("nan")  # a NaN in a valid key of row 7: NaN out and LSE for that row only
    out = torch.full((rows,), 123.0, device="cuda")
    lse = torch.full((rows,), 123.0, device="cuda")
    probe(s, val, valid, out, lse)
    torch.cuda.synchronize()
    ref_out, ref_lse = _probe_reference(s, val, valid)
    assert torch.isnan(out[7]) and torch.isnan(lse[7])
    keep = torch.ones(rows, dtype=torch.bool, device="cuda")
    keep[7] = False
    assert torch.isfinite(out[keep]).all() and torch.isfinite(lse[keep]).all()
    torch.testing.assert_close(out[keep], ref_out[keep], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lse[keep], ref_lse[keep], atol=1e-4, rtol=1e-5)


@needs_cuda
def test_softmax_math_probe_rows_without_keys(probe):
    rows, blocks = 40, 3
    s = torch.full((rows, blocks * BLOCK), float("nan"), device="cuda")
    val = torch.full((rows, blocks * BLOCK), float("nan"), device="cuda")
    valid = torch.zeros(blocks, dtype=torch.int32, device="cuda")
    out = torch.full((rows,), 123.0, device="cuda")
    lse = torch.full((rows,), 123.0, device="cuda")
    probe(s, val, valid, out, lse)
    torch.cuda.synchronize()
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))
