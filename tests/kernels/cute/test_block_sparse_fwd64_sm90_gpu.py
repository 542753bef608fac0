"""Our Hopper 64-token forward (``block_sparse_fwd64_sm90``) on an sm_90 GPU, against the fp32
reference (``fastvideo_cute.reference.block_sparse_attn_reference``).

Cases: BHSD and BSHD, B = 2, q_len != kv_len, ragged kv sizes (0, 17, 41: not multiples of the
16-key P V step, so the in-kernel zeroing runs; 16, 32: the skipped-step path), an empty kv block
selected by every row, a query tile with no entry (out 0, LSE -inf), NaN in padded K and Inf in
padded V (must not leak), a NaN in a visible q row (NaN out and LSE), a NaN in one visible key at each of
the 64 positions of a tile (NaN in exactly the rows that select it), fp16 and bf16, head_dim 64
and 128, with and without sizes; and a 65,536-token run-to-run check (bitwise equal). The fused-gate epilogue (``gate=``, ``out_c=``)
against ``gate_compose_reference`` of the reference branch (written before it ran on a GPU: the
first H200 run decides whether it holds; tolerance as the plain output's, the composition is
rounded once). A case with every kv tile a random size in [0, 64] refills the K/V slots with
tiles of every size one after another.

Every case runs on six builds (the ``variant`` fixture): the default (``lazy_rescale``: O is
rescaled only when a row's max passes its reference max by more than 2^8; ``lazy_vote``: a warp
whose lanes all keep their reference maxima skips the row-max shuffles and the rescale), Q's first
112 columns in registers (``q_regs=112``), the eager rescale of every step
(``lazy_rescale=False``, the build before 2026-12-03), and the lazy rescale without the vote
(``lazy_vote=False``, the default before 2026-12-03's second session), and ``partial_loads`` (a
partial kv tile's K and V loaded as 16-key pieces, only those holding a valid key; its first build
was exact on the H200 on 2026-12-02, this one is re-written on the current kernel), and the build
without ``narrow_tiles`` (``wide``; the default since 2026-12-03's sixth session runs the softmax
of a tile of at most 16 / 32 keys on the quarter / half of a thread's columns that hold them). And
``packed_steps`` (``packed``; written 2026-12-04 without a GPU: its first H200 run decides): the
lists packed by ``pack_steps`` so that every whole tile is a step and the 16-key pieces of the
partial tiles go four to a step from any tiles (ragged pieces: K masked per piece, V's padding rows
zeroed per piece); the random-sizes case packs pieces of every size. And ``l2_hints`` (``l2hints``; written
2026-12-07 without a GPU run): L2 cache policies on the TMA copies, which must change nothing. And
``rotate_walk`` (``rotate3``; written 2026-12-07 without a GPU run): each CTA's walk started at entry
``((i % 3) * count) // 3`` of its list and wrapped, so every case walks rotated lists (equal to rounding). And
``tile_prefetch`` (``prefetch3``; written 2026-12-08 without a GPU run): list entry j + 3's K and V tiles asked
into the L2 at step j (hints only: the same bits as the default). ``test_every_list_length`` walks lists of 0-8 entries with
and without the gate, so every ring phase of the K/V slots and of the gate's slot is reached. ``test_lazy_rescale_*`` build score sequences whose max climbs in steps below and
above the threshold, and one that only falls, so that both branches of the rescale run.

Tolerances: measured on the H200 (2026-12-01) max |out - ref| 1.3e-3 to 6.8e-3 (bf16 out: half an
ulp at |out| ~ 2 is 7.8e-3), max |lse - ref| 9.5e-7; asserted at 1.6e-2 (bf16) / 2e-3 (fp16) for
out and 1e-4 for the LSE.
"""

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs an sm_90 GPU", allow_module_level=True)
pytest.importorskip("cutlass")

from fastvideo_cute import reference  # noqa: E402
from fastvideo_cute.adapters.cute_sm90_fwd64 import sm90_fwd64, sm90_fwd64_problems  # noqa: E402
from fastvideo_cute.metadata import map_to_index  # noqa: E402

OUT_TOL = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3}

VARIANTS = {"default": None, "q112": {"q_regs": 112}, "eager": {"lazy_rescale": False},
            "novote": {"lazy_vote": False}, "partial": {"partial_loads": True},
            "wide": {"narrow_tiles": False}, "packed": {"packed_steps": True}, "l2hints": {"l2_hints": True},
            "rotate3": {"rotate_walk": 3}, "prefetch3": {"tile_prefetch": 3}}


@pytest.fixture(params=list(VARIANTS), ids=list(VARIANTS))
def variant(request):
    return VARIANTS[request.param]


def _case(bshd, B, H, SQ, SK, D, dtype, sizes_vals, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shp = (lambda s: (B, s, H, D)) if bshd else (lambda s: (B, H, s, D))
    q = torch.randn(shp(SQ), device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(shp(SK), device="cuda", dtype=dtype, generator=g) for _ in range(2))
    qb, kb = SQ // 64, SK // 64
    bm = torch.rand(B, H, qb, kb, device="cuda", generator=g) < 0.35
    sizes = torch.full((kb,), 64, dtype=torch.int32, device="cuda")
    for i, s in sizes_vals.items():
        sizes[i] = s
    bm[..., 2] = True  # an empty block (size 0 below) selected by every row
    bm[0, 0, 1] = False  # a query tile with no entry
    return q, k, v, bm, sizes


def _poison_padding(x, sizes, bshd, value):
    pad = (torch.arange(x.shape[1 if bshd else 2], device="cuda") % 64) >= sizes.repeat_interleave(64)
    if bshd:
        x[:, pad] = value
    else:
        x[:, :, pad] = value


def _run(q, k, v, bm, sizes, bshd, with_sizes=True, variant=None):
    assert sm90_fwd64_problems(q, k, v, bshd=bshd) is None
    idx, num = map_to_index(bm)
    return sm90_fwd64(q, k, v, idx.to(torch.int32).contiguous(), num.to(torch.int32).contiguous(),
                      sizes if with_sizes else None, bshd=bshd, variant=variant)


def _bhsd(x, bshd):
    return x.transpose(1, 2) if bshd else x


def _check_poisoned(q, k, v, bm, sizes, bshd, dtype, variant=None):
    """NaN K / Inf V padding, run, compare with the fp32 reference; returns (out BHSD fp32, lse)."""
    _poison_padding(k, sizes, bshd, float("nan"))
    _poison_padding(v, sizes, bshd, float("inf"))
    out, lse = _run(q, k, v, bm, sizes, bshd, variant=variant)
    ro, rl = reference.block_sparse_attn_reference(*(_bhsd(t, bshd).float() for t in (q, k, v)), bm, sizes, 64)
    o = _bhsd(out, bshd).float()
    assert torch.isfinite(o).all()
    assert (o - ro).abs().max() <= OUT_TOL[dtype]
    finite = torch.isfinite(rl)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(rl))
    assert (lse - rl)[finite].abs().max() <= 1e-4
    return o, lse


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", [(2, 3, 1024, 1024, 128), (1, 2, 512, 1280, 128), (2, 2, 768, 768, 64)],
                         ids=["B2-square", "q_ne_kv", "d64"])
def test_matches_reference_with_poisoned_padding(bshd, dtype, shape, variant):
    B, H, SQ, SK, D = shape
    if D == 64 and variant and variant.get("q_regs", 0) > D:
        variant = {**variant, "q_regs": 48}  # the same option at head_dim 64 (its limit is head_dim)
    q, k, v, bm, sizes = _case(bshd, B, H, SQ, SK, D, dtype, {2: 0, 5: 17, 6: 16, 7: 32, SK // 64 - 1: 41})
    o, lse = _check_poisoned(q, k, v, bm, sizes, bshd, dtype, variant)
    # the query tile with no entry: exactly 0 and -inf
    assert (o[0, 0, 64:128] == 0).all() and torch.isneginf(lse[0, 0, 64:128]).all()


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
def test_random_sizes_every_tile_poisoned(bshd, variant):
    """Every kv tile a random size in [0, 64] and about half of them selected per row, so the
    slots are refilled by tiles of every size one after another."""
    B, H, SQ, SK, D = 1, 2, 1024, 2048, 128
    q, k, v, bm, sizes = _case(bshd, B, H, SQ, SK, D, torch.bfloat16, {}, seed=7)
    g = torch.Generator(device="cuda").manual_seed(8)
    sizes.copy_(torch.randint(0, 65, sizes.shape, device="cuda", generator=g, dtype=torch.int32))
    bm |= torch.rand(bm.shape, device="cuda", generator=g) < 0.3
    bm[0, 0, 1] = False
    _check_poisoned(q, k, v, bm, sizes, bshd, torch.bfloat16, variant)


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
def test_without_sizes_every_block_full(bshd, variant):
    q, k, v, bm, sizes = _case(bshd, 1, 2, 512, 512, 128, torch.bfloat16, {})
    out, lse = _run(q, k, v, bm, sizes, bshd, with_sizes=False, variant=variant)
    ro, rl = reference.block_sparse_attn_reference(*(_bhsd(t, bshd).float() for t in (q, k, v)), bm, sizes, 64)
    assert (_bhsd(out, bshd).float() - ro).abs().max() <= OUT_TOL[torch.bfloat16]
    finite = torch.isfinite(rl)
    assert (lse - rl)[finite].abs().max() <= 1e-4


def test_nan_in_a_visible_query_row_propagates(variant):
    q, k, v, bm, sizes = _case(False, 1, 1, 256, 256, 128, torch.bfloat16, {})
    bm[0, 0, 0] = True
    q[0, 0, 3, 7] = float("nan")
    out, lse = _run(q, k, v, bm, sizes, False, variant=variant)
    assert torch.isnan(out[0, 0, 3]).all() and torch.isnan(lse[0, 0, 3])
    assert torch.isfinite(out[0, 0, 4]).all()


def test_nan_in_one_visible_key_propagates(variant):
    """A NaN in one valid key row, at each of the 64 key positions of a tile in turn (so in every
    column of every lane's score fragment): every query row that selects the tile is NaN, the
    others are not."""
    q, k, v, bm, sizes = _case(False, 1, 1, 256, 256, 128, torch.bfloat16, {})
    bm[0, 0, :, 1] = False
    bm[0, 0, 2, 1] = True  # only query tile 2 selects kv tile 1
    for t in range(64):
        kk = k.clone()
        kk[0, 0, 64 + t, t % 128] = float("nan")
        out, lse = _run(q, kk, v, bm, sizes, False, variant=variant)
        assert torch.isnan(out[0, 0, 128:192]).all() and torch.isnan(lse[0, 0, 128:192]).all(), t
        rows = torch.ones(256, dtype=torch.bool, device="cuda")
        rows[128:192] = False
        assert torch.isfinite(out[0, 0, rows]).all(), t


@pytest.mark.parametrize("gated", [False, True, "train"], ids=["plain", "gate", "train"])
def test_every_list_length(gated, variant):
    """Query tile i of head h selects i + h kv tiles (0-8, a random choice of the 12, one of them
    partial), so lists of every length up to 8 run: the first steps, the ring's wrap and, with the
    gate, its tile in the K slots after every possible number of K loads. ``train`` (the gate with
    ``out_s``, whose epilogue stages out_s in the gate's K slot): out_s is the plain call's out bit
    for bit, out the inference gate build's."""
    B, H, S, D = 1, 2, 768, 128
    q, k, v, bm, sizes = _case(False, B, H, S, S, D, torch.bfloat16, {4: 23}, seed=11)
    g = torch.Generator(device="cuda").manual_seed(12)
    bm.zero_()
    for h in range(H):
        for i in range(S // 64):
            n = min(i + h, 8)
            bm[0, h, i, torch.randperm(S // 64, device="cuda", generator=g)[:n]] = True
    _poison_padding(v, sizes, False, float("inf"))
    _poison_padding(k, sizes, False, float("nan"))
    idx, num = map_to_index(bm)
    idx, num = idx.to(torch.int32).contiguous(), num.to(torch.int32).contiguous()
    ro, rl = reference.block_sparse_attn_reference(q.float(), k.float(), v.float(), bm, sizes, 64)
    if gated:
        gate = torch.rand(q.shape, device="cuda", dtype=torch.bfloat16, generator=g)
        out_c = torch.randn(B, H, S // 64, D, device="cuda", dtype=torch.bfloat16, generator=g)
        out, lse = sm90_fwd64(q, k, v, idx, num, sizes, bshd=False, gate=gate, out_c=out_c, variant=variant)
        ro = reference.gate_compose_reference(ro, out_c, gate, 64)
        if gated == "train":
            out_s = torch.full_like(q, float("nan"))
            out_t, lse_t = sm90_fwd64(q, k, v, idx, num, sizes, bshd=False, gate=gate, out_c=out_c, variant=variant,
                                      out_s=out_s)
            plain, plain_lse = sm90_fwd64(q, k, v, idx, num, sizes, bshd=False, variant=variant)
            assert torch.equal(out_s, plain) and torch.equal(lse_t, plain_lse)
            assert torch.equal(out_t, out) and torch.equal(lse_t, lse)
    else:
        out, lse = sm90_fwd64(q, k, v, idx, num, sizes, bshd=False, variant=variant)
    assert torch.isfinite(out).all()
    assert (out.float() - ro).abs().max() <= OUT_TOL[torch.bfloat16]
    finite = torch.isfinite(rl)
    assert torch.equal(finite, torch.isfinite(lse))
    assert (lse - rl)[finite].abs().max() <= 1e-4


def test_65536_tokens_run_to_run_bitwise(variant):
    g = torch.Generator(device="cuda").manual_seed(3)
    B, H, S, D = 1, 4, 65536, 128
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    kb = S // 64
    scores = torch.rand(B, H, kb, kb, device="cuda", generator=g)
    bm = torch.zeros(B, H, kb, kb, dtype=torch.bool, device="cuda")
    bm.scatter_(-1, scores.topk(kb // 8, dim=-1).indices, True)
    sizes = torch.full((kb,), 64, dtype=torch.int32, device="cuda")
    a = _run(q, k, v, bm, sizes, True, variant=variant)
    b = _run(q, k, v, bm, sizes, True, variant=variant)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert torch.isfinite(a[0]).all()


@pytest.mark.parametrize("hint", [{"l2_hints": True}, {"tile_prefetch": 2}, {"tile_prefetch": 8}],
                         ids=["l2hints", "prefetch2", "prefetch8"])
def test_cache_hints_give_the_default_bits(hint):
    """L2 policies and tensor prefetches are hints: the same bits as the default build, on lists of 0 to
    width entries (a prefetch distance past the list's end issues none), padding poisoned."""
    q, k, v, bm, sizes = _case(True, 2, 2, 1024, 1024, 128, torch.bfloat16, {2: 0, 5: 17, 7: 32})
    _poison_padding(k, sizes, True, float("nan"))
    _poison_padding(v, sizes, True, float("inf"))
    bm[0, 1, :, 9:] = False  # short lists: 2 or 3 entries, shorter than the farthest prefetch
    want = _run(q, k, v, bm, sizes, True)
    got = _run(q, k, v, bm, sizes, True, variant=hint)
    assert torch.isfinite(got[0]).all()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
def test_fused_gate_matches_reference(bshd, variant):
    q, k, v, bm, sizes = _case(bshd, 2, 2, 512, 512, 128, torch.bfloat16, {2: 0, 5: 17, 7: 32})
    _poison_padding(v, sizes, bshd, float("inf"))
    g = torch.Generator(device="cuda").manual_seed(5)
    gate = torch.rand(q.shape, device="cuda", dtype=torch.bfloat16, generator=g)
    out_c = torch.randn(2, 2, 512 // 64, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    assert sm90_fwd64_problems(q, k, v, bshd=bshd) is None
    idx, num = map_to_index(bm)
    out, lse = sm90_fwd64(q, k, v, idx.to(torch.int32).contiguous(), num.to(torch.int32).contiguous(), sizes,
                          bshd=bshd, gate=gate, out_c=out_c, variant=variant)
    ro, rl = reference.block_sparse_attn_reference(*(_bhsd(t, bshd).float() for t in (q, k, v)), bm, sizes, 64)
    want = reference.gate_compose_reference(ro, out_c, _bhsd(gate, bshd), 64)
    got = _bhsd(out, bshd).float()
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() <= OUT_TOL[torch.bfloat16]
    finite = torch.isfinite(rl)
    assert (lse - rl)[finite].abs().max() <= 1e-4
    # the query tile with no entry: out_s is 0, so out = gate * out_c
    torch.testing.assert_close(got[0, 0, 64:128], want[0, 0, 64:128], atol=OUT_TOL[torch.bfloat16], rtol=0)


def _climbing_case(steps_log2, bshd, seed=0):
    """One 64-row query tile over len(steps_log2) kv tiles, all selected: tile j's scores (in log2
    units, ``s * scale * log2(e)``) are about ``steps_log2[j]`` plus noise of 0.5, so the running max
    moves by the differences (every row alike)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    D, n = 128, len(steps_log2)
    u = torch.randn(D, device="cuda", generator=g)
    u = u / u.norm() * D ** 0.5  # |u|^2 = D
    q = u.expand(64, D) + 0.01 * torch.randn(64, D, device="cuda", generator=g)
    per_unit = D ** 0.5 / 1.4426950408889634  # a q.k of this is 1 in log2 units at scale 1/sqrt(D)
    k = torch.cat([(a * per_unit / D) * u.expand(64, D) + 0.5 * per_unit / D ** 0.5
                   * torch.randn(64, D, device="cuda", generator=g) for a in steps_log2])
    v = torch.randn(64 * n, D, device="cuda", generator=g)
    to = (lambda x: x[None, :, None, :]) if bshd else (lambda x: x[None, None])
    q, k, v = (to(x).to(torch.bfloat16).contiguous() for x in (q, k, v))
    bm = torch.ones(1, 1, 1, n, dtype=torch.bool, device="cuda")
    sizes = torch.full((n,), 64, dtype=torch.int32, device="cuda")
    return q, k, v, bm, sizes


@pytest.mark.parametrize("steps", [[0, 3, 6, 9, 12, 15, 18, 21], [0, 7.5, 15, 7, 30, 31, 29, 40],
                                   [40, 30, 20, 10, 0, -10, -20, -30], [0, 0.5, 1, 20, 20.5, 9, 60, 61],
                                   [0, 200, 150, 400, 10, 420, 0, 0]],
                         ids=["climb3", "jumps", "falling", "mixed", "overflow"])
@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
def test_lazy_rescale_climbing_and_falling_max(steps, bshd, variant):
    """Maxima that climb below the 2^8 threshold (the reference max is kept and P exceeds 1), jump
    past it (a rescale mid-list; ``overflow``: by more than 2^128, where an exponent taken against
    the old reference would be inf), or only fall (no rescale after the first tile), against the fp32
    reference; the output stays finite and within the plain cases' tolerance."""
    q, k, v, bm, sizes = _climbing_case(steps, bshd)
    out, lse = _run(q, k, v, bm, sizes, bshd, variant=variant)
    ro, rl = reference.block_sparse_attn_reference(*(_bhsd(t, bshd).float() for t in (q, k, v)), bm, sizes, 64)
    o = _bhsd(out, bshd).float()
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    assert (o - ro).abs().max() <= OUT_TOL[torch.bfloat16]
    assert (lse - rl).abs().max() <= 1e-4 * max(1.0, float(rl.abs().max()))
