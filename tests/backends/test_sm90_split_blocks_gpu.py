"""On an H200 (sm_90): the sm90 backend serving 128- and 256-token blocks as the 64-token tiles
that cover them (``metadata.split_q2k``, the Triton split on CUDA), forced by
``FASTVIDEO_VSA_BACKEND=sm90``, inference calls.

Checked: the backend that ran (the dispatch counter); the output and LSE against the fp32
reference on ragged kv blocks (sizes 0, 1, 64, 65, block - 3 and full) with NaN in K's and V's
padding rows, B = 2, q_len != kv_len, a row with no block, both layouts, bf16 d128 and fp16 d64;
bit for bit the same output as the 64-token call on the expanded map with split sizes (the
tiles the split leaves out add nothing); ``video_sparse_attn`` with a gate fused, 128- and
256-token tiles, against the fp32 reference. With the backend's ``_PACK_PARTIAL`` on (the forward's
``packed_steps``): 64- and 128-token blocks of sizes 0-64 with poisoned padding, and gated
``video_sparse_attn`` on a 4x4x4-tiled grid with edge tiles, against the fp32 reference.

Tolerance: max |out - ref| / max |ref| < 1e-2, the bf16-vs-fp32-reference bound of
tests/test_gpu_mixed_backends.py; LSE within 2e-2 absolute where finite (bf16 scores).
"""

import pytest
import torch

import fastvideo_cute as fvc
from fastvideo_cute import ops
from fastvideo_cute.metadata import expand_block_map, split_block_sizes
from fastvideo_cute.reference import block_sparse_attn_reference, video_sparse_attn_reference

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):  # collected on CPU boxes too
    pytest.skip("needs an sm_90 GPU", allow_module_level=True)
pytest.importorskip("cutlass")

OUT_TOL, LSE_TOL = 1e-2, 2e-2
FNS = {(64, False): fvc.block_sparse_attn, (64, True): fvc.block_sparse_attn_bshd,
       (128, False): fvc.block_sparse_attn_128, (128, True): fvc.block_sparse_attn_128_bshd,
       (256, False): fvc.block_sparse_attn_256, (256, True): fvc.block_sparse_attn_256_bshd}


@pytest.fixture(autouse=True)
def _sm90(monkeypatch):
    for name in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_ROUTE_TABLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "sm90")


def _nerr(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-6)).item()


def _case(block, bshd, dtype, d, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, h, qb, kvb = 2, 2, 3, 6
    sizes = torch.tensor([block, 0, 1, 64, 65, block - 3], dtype=torch.int32, device="cuda")
    mk = lambda n: torch.randn(b, h, n * block, d, device="cuda", generator=g).to(dtype)  # noqa: E731
    q, k, v = mk(qb), mk(kvb), mk(kvb)
    pad = (torch.arange(kvb * block, device="cuda") % block) >= sizes.repeat_interleave(block)
    k[:, :, pad] = float("nan")
    v[:, :, pad] = float("inf")
    m = torch.rand(b, h, qb, kvb, device="cuda", generator=g) < 0.6
    m[..., 0] = True  # every row has a full block but one:
    m[1, 0, 2] = False  # a row with no block
    ref, ref_lse = block_sparse_attn_reference(q.float(), k.float(), v.float(), m, sizes, block)
    if bshd:
        q, k, v = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    return q, k, v, m, sizes, ref, ref_lse


def _run(block, bshd, q, k, v, m, sizes):
    before = ops.dispatch_counts.copy()
    with torch.no_grad():
        out, lse = FNS[(block, bshd)](q, k, v, m, sizes)
    ran = {key: n - before[key] for key, n in ops.dispatch_counts.items() if n != before[key]}
    assert ran == {("sm90", "fwd"): 1}, ran
    return out, lse


@pytest.mark.parametrize("block", [128, 256])
@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
@pytest.mark.parametrize("dtype,d", [(torch.bfloat16, 128), (torch.float16, 64)], ids=["bf16-d128", "fp16-d64"])
def test_split_blocks_match_reference_and_the_64_token_call(block, bshd, dtype, d):
    q, k, v, m, sizes, ref, ref_lse = _case(block, bshd, dtype, d, seed=block + d + bshd)
    out, lse = _run(block, bshd, q, k, v, m, sizes)
    tb = (lambda x: x.transpose(1, 2)) if bshd else (lambda x: x)
    fin = torch.isfinite(ref_lse)
    err = _nerr(tb(out), ref)
    lse_err = (lse[fin] - ref_lse[fin]).abs().max().item()
    print(f"\n[sm90 split block={block} bshd={bshd} {dtype} d{d}] out {err:.2e} lse {lse_err:.2e}")
    assert torch.isfinite(out).all()
    assert err < OUT_TOL and lse_err < LSE_TOL
    assert torch.equal(torch.isneginf(lse), ~fin)
    assert (tb(out)[1, 0, 2 * block:] == 0).all()  # the row with no block
    r = block // 64
    out64, lse64 = _run(64, bshd, q, k, v, expand_block_map(m, r, r), split_block_sizes(sizes, r, 64))
    assert torch.equal(out, out64), "the split call must equal the 64-token call on the expanded map"
    assert torch.equal(lse, lse64)


@pytest.mark.parametrize("tile", [(2, 8, 8), (4, 8, 8)], ids=["128", "256"])
def test_gated_vsa_on_split_tiles(tile):
    grid = (5, 14, 26)
    g = torch.Generator(device="cuda").manual_seed(3)
    n = grid[0] * grid[1] * grid[2]
    q, k, v, w = (fvc.to_tiles(torch.randn(1, 3, n, 128, device="cuda", generator=g).bfloat16(), grid, tile, dim=2)
                  for _ in range(4))
    sizes = fvc.variable_block_sizes(grid, tile, device="cuda")
    gate = torch.sigmoid(w.float()).bfloat16()
    before = ops.dispatch_counts.copy()
    with torch.no_grad():
        out = fvc.video_sparse_attn(q, k, v, sizes, sizes, 4, tile, compress_attn_weight=gate)
    ran = {key: c - before[key] for key, c in ops.dispatch_counts.items() if c != before[key]}
    assert ran == {("sm90", "fwd"): 1}, ran
    ref = video_sparse_attn_reference(q.float(), k.float(), v.float(), sizes, sizes, 4, tile,
                                      compress_attn_weight=gate.float())
    err = _nerr(out, ref)
    print(f"\n[sm90 split gated vsa tile={tile}] {err:.2e}")
    assert err < OUT_TOL


@pytest.fixture
def _packed(monkeypatch):
    """The backend's ``_PACK_PARTIAL`` on: calls with partial kv tiles run the forward's
    ``packed_steps`` (written 2026-12-04 without a GPU; these tests are its first run through the API)."""
    from fastvideo_cute.backends import sm90_backend

    monkeypatch.setattr(sm90_backend, "_PACK_PARTIAL", True)


@pytest.mark.parametrize("block", [64, 128])
def test_packed_partial_tiles_match_reference(block, _packed):
    g = torch.Generator(device="cuda").manual_seed(block)
    b, h, qb, kvb, d = 2, 2, 3, 9, 128
    sizes = torch.tensor([block, 0, 1, 8, 16, 17, 32, block - 3, 40], dtype=torch.int32, device="cuda")
    mk = lambda n: torch.randn(b, h, n * block, d, device="cuda", generator=g).bfloat16()  # noqa: E731
    q, k, v = mk(qb), mk(kvb), mk(kvb)
    pad = (torch.arange(kvb * block, device="cuda") % block) >= sizes.repeat_interleave(block)
    k[:, :, pad] = float("nan")
    v[:, :, pad] = float("inf")
    m = torch.rand(b, h, qb, kvb, device="cuda", generator=g) < 0.7
    m[1, 0, 2] = False  # a row with no block
    ref, ref_lse = block_sparse_attn_reference(q.float(), k.float(), v.float(), m, sizes, block)
    out, lse = _run(block, False, q, k, v, m, sizes)
    fin = torch.isfinite(ref_lse)
    assert torch.isfinite(out).all()
    assert _nerr(out, ref) < OUT_TOL and (lse[fin] - ref_lse[fin]).abs().max().item() < LSE_TOL
    assert torch.equal(torch.isneginf(lse), ~fin)
    assert (out[1, 0, 2 * block:] == 0).all()


def test_packed_gated_vsa_on_a_video_grid(_packed):
    """4x4x4 tiles on a 5 x 6 x 10 latent: edge tiles of 4-32 tokens, the case the option is for."""
    grid, tile = (5, 6, 10), (4, 4, 4)
    g = torch.Generator(device="cuda").manual_seed(5)
    n = grid[0] * grid[1] * grid[2]
    q, k, v, w = (fvc.to_tiles(torch.randn(1, 3, n, 128, device="cuda", generator=g).bfloat16(), grid, tile, dim=2)
                  for _ in range(4))
    sizes = fvc.variable_block_sizes(grid, tile, device="cuda")
    gate = torch.sigmoid(w.float()).bfloat16()
    before = ops.dispatch_counts.copy()
    with torch.no_grad():
        out = fvc.video_sparse_attn(q, k, v, sizes, sizes, 6, tile, compress_attn_weight=gate)
    ran = {key: c - before[key] for key, c in ops.dispatch_counts.items() if c != before[key]}
    assert ran == {("sm90", "fwd"): 1}, ran
    ref = video_sparse_attn_reference(q.float(), k.float(), v.float(), sizes, sizes, 6, tile,
                                      compress_attn_weight=gate.float())
    assert _nerr(out, ref) < OUT_TOL
