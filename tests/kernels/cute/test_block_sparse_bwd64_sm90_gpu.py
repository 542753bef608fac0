"""GPU tests of our Hopper 64-token VSA backward (``adapters/cute_sm90_bwd64``: the chain with the
wgmma main kernels ``block_sparse_bwd64_sm90``, one warpgroup, and ``block_sparse_bwd64_sm90_ws``,
warp-specialized, with its q groups), on a compute-capability 9.0 GPU (the H200).

The cases and tolerances of the tcgen05 chain's tests (tests/kernels/cute/test_block_sparse_bwd64_gpu.py,
whose helpers are reused: fp32 autograd reference, per tensor rel_max 1e-2 and mean |err| 1e-3):
ragged sizes with NaN K / Inf V in the padding, B = 2, top-k not a multiple of four, several
sequence lengths, kv blocks nobody selects and q blocks that select nothing, and 65,536 tokens
against the Triton backward with a run-to-run check (dk and dv bitwise; dq within summation-order
noise: its fp32 atomics have no fixed order). Outputs are pre-filled with NaN in the allocator so a
missed store cannot hide behind a recycled zero buffer.
"""

import math

import pytest
import torch

from fastvideo_cute.metadata import invert_indices

from test_block_sparse_bwd64_gpu import (BLOCK, check_close, make_case, reference, _poison_allocator,
                                          _triton_forward, SCALE)

A = pytest.importorskip("fastvideo_cute.adapters.cute_sm90_bwd64")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs a compute capability 9.0 GPU"),
]
pytest.importorskip("cutlass")


def _run(q, k, v, o, do, lse, idx, num, vbs, dq_reduce="atomic"):
    """``dq_reduce``: "atomic", "bulk", or "bulk-smemstats" (the bulk path with lse2/delta staged
    in shared memory) of the single-warpgroup main kernel, or "ws[:key=int,...]" (the warp-specialized
    one, configured)."""
    kidx, knum = invert_indices(idx, num, vbs.numel())
    for t in (q, q, q):
        _poison_allocator(t)
    if dq_reduce.startswith("ws"):  # "ws" or "ws:key=int,..." (BlockSparseBwd64Sm90Ws's configuration)
        cfg = dq_reduce.partition(":")[2]
        ws_config = {key: int(val) for key, val in (x.split("=") for x in cfg.split(",") if x)}
        return A.sm90_block_sparse_bwd64(q, k, v, o, do, lse, kidx, knum, vbs, main="ws", ws_config=ws_config)
    reduce, _, extra = dq_reduce.partition("-")
    return A.sm90_block_sparse_bwd64(q, k, v, o, do, lse, kidx, knum, vbs, dq_reduce=reduce,
                                     stats_in_smem=extra == "smemstats")


def _vs_reference(dq_reduce="atomic", **case):
    q, k, v, do, idx, num, vbs, pad = make_case(**case)
    o, lse, rdq, rdk, rdv = reference(q, k, v, do, idx, num, vbs)
    dq, dk, dv = _run(q, k, v, o, do, lse, idx, num, vbs, dq_reduce)
    torch.cuda.synchronize()
    for name, got, ref in (("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
        assert got.dtype == torch.bfloat16
        err = (got.float() - ref).abs()
        print(f"\n[{name}] rel_max {err.max().item() / ref.abs().max().item():.2e} mean {err.mean().item():.2e}")
        check_close(name, got, ref)
    assert (dk[..., pad, :] == 0).all() and (dv[..., pad, :] == 0).all(), "padded key rows"
    return (dq, dk, dv), lse


# the warp-specialized kernel: its default (K/V in registers; q groups of 384 blocks from 768 blocks
# on, so one group below 49,152 tokens), split into q groups of 3 blocks (uneven, several per list: fp32 dk/dv
# accumulation), and with its other options on / K, V from shared memory
WS_GROUPS = "ws:group_blocks=3,group_min_blocks=0"
WS_ALL = "ws:p_stages=2,q_stages=2,dq_stages=2,group_blocks=2,group_min_blocks=0"
WS_SMEM_KV = "ws:kv_regs=0"
# q groups with dK/dV added by per-element fp32 reductions instead of the default's one bulk
# reduce-add per warpgroup (bulk_dkv; its first GPU run, 2026-12-02: 13 passed)
WS_GROUPS_REDG = "ws:group_blocks=3,group_min_blocks=0,bulk_dkv=0"
# dQ = dS K of a partial kv tile issued only up to ceil16(size) (narrow_dq), alone and with q groups
WS_NARROW_DQ = "ws:narrow_dq=1"
WS_NARROW_DQ_GROUPS = "ws:narrow_dq=1,group_blocks=3,group_min_blocks=0"
# the route's configuration with deeper rings: Q/dO four deep, or P^T / the dQ staging tile double-buffered
WS_NARROW_DEEP = ["ws:narrow_dq=1,q_stages=4", "ws:narrow_dq=1,p_stages=2", "ws:narrow_dq=1,dq_stages=2"]
# dQ staged flat, in the accumulator's register order (conflict-free 128-bit stores), added by one
# bulk reduce-add per step into dq_accum tiles of that order and un-permuted by the postprocess
# (flat_dq; 2026-12-03, ninth session): on the route's configuration, with q groups, and with every
# ring double-buffered (the staging buffer alternating)
WS_FLAT = "ws:narrow_dq=1,p_stages=2,flat_dq=1"
WS_FLAT_GROUPS = WS_FLAT + ",group_blocks=3,group_min_blocks=0"
WS_FLAT_ALL = "ws:flat_dq=1,p_stages=2,q_stages=2,dq_stages=2,group_blocks=2,group_min_blocks=0"
# V's padded rows zeroed in shared memory and dS^T without the padded-key select (zero_pad_v), and
# dk/dv of a kv block split over q groups summed by the group that finishes last (ticket_dkv): q
# groups of 3 blocks give most lists three parts (the first, the middle and the last ticket's paths)
WS_ZV = WS_FLAT + ",zero_pad_v=1"
WS_TICKET = WS_FLAT + ",zero_pad_v=1,ticket_dkv=1"
WS_TICKET_GROUPS = WS_TICKET + ",group_blocks=3,group_min_blocks=0"
# the bf16 dk/dv rows by 32-bit pair stores, with one group and with q groups (the last ticket's rows)
WS_PAIRS = WS_TICKET + ",pair_stores=1"
WS_PAIRS_GROUPS = WS_TICKET_GROUPS + ",pair_stores=1"
# the bf16 dk/dv rows by stmatrix + TMA stores, one warp's 16 rows at a time
WS_TMA = WS_TICKET + ",tma_dkv=1"
WS_TMA_GROUPS = WS_TICKET_GROUPS + ",tma_dkv=1"
# the single-warpgroup kernel rebuilt (dq_reduce="flat", 2026-12-04): dQ with dK in one group, staged in
# register order into the step's Q/dO slots, two 16 KB bulk reductions; dS by stmatrix
FLAT = "flat"
MAINS = ["atomic", FLAT, "ws", WS_GROUPS, WS_ALL, WS_SMEM_KV, WS_GROUPS_REDG, WS_NARROW_DQ,
         WS_NARROW_DQ_GROUPS, *WS_NARROW_DEEP, WS_FLAT, WS_FLAT_GROUPS,
         WS_FLAT_ALL, WS_ZV, WS_TICKET, WS_TICKET_GROUPS, WS_PAIRS, WS_PAIRS_GROUPS,
         WS_TMA, WS_TMA_GROUPS]  # the single-warpgroup kernel and the WS one


def _route_config() -> str:
    """The configuration the sm90 backend's backward runs (``sm90_backend._BWD_WS_CONFIG``)."""
    from fastvideo_cute.backends.sm90_backend import _BWD_WS_CONFIG

    return "ws:" + ",".join(f"{key}={int(val)}" for key, val in _BWD_WS_CONFIG.items())


def test_the_route_runs_a_tested_configuration():
    assert _route_config() in MAINS


@pytest.mark.parametrize("main", MAINS)
def test_matches_reference_full_tiles(main):
    _vs_reference(dq_reduce=main, ragged=False)


@pytest.mark.parametrize("main", MAINS)
def test_batch_two_ragged_nan_padding(main):
    _vs_reference(dq_reduce=main, batch=2, ragged=True, seed=1)


@pytest.mark.parametrize("main", MAINS)
@pytest.mark.parametrize("topk", [1, 2, 3, 5, 7])
def test_topk_not_a_multiple_of_four(topk, main):
    _vs_reference(dq_reduce=main, topk=topk, ragged=True)


@pytest.mark.parametrize("main", MAINS)
@pytest.mark.parametrize("nb", [2, 4, 16])
def test_sequence_lengths(nb, main):
    _vs_reference(dq_reduce=main, nb=nb, topk=min(3, nb), ragged=True)


@pytest.mark.parametrize("dq_reduce", ["atomic", "bulk", "bulk-smemstats", FLAT, "ws", WS_GROUPS, WS_ALL, WS_GROUPS_REDG,
                                       WS_NARROW_DQ])
def test_bulk_dq_reduce_matches_reference(dq_reduce):
    """The main kernel's two dQ paths (fp32 atomics / the tile staged and bulk-reduced), B = 2,
    ragged NaN/Inf padding, top-k 5 (an odd list length: the staging slots alternate)."""
    _vs_reference(dq_reduce=dq_reduce, batch=2, topk=5, ragged=True, seed=3)


@pytest.mark.parametrize("dq_reduce", ["atomic", "bulk", "bulk-smemstats", FLAT, "ws", WS_GROUPS, WS_ALL, WS_GROUPS_REDG,
                                       WS_NARROW_DQ, WS_FLAT, WS_FLAT_GROUPS, WS_ZV, WS_TICKET_GROUPS, WS_PAIRS_GROUPS,
                                       WS_TMA_GROUPS])
def test_zero_count_kv_blocks_and_empty_q_blocks(dq_reduce):
    (dq, dk, dv), lse = _vs_reference(dq_reduce=dq_reduce, excluded=(2, 5), empty_q=(1,), ragged=True)
    for j in (2, 5):
        assert (dk[..., j * BLOCK:(j + 1) * BLOCK, :] == 0).all()
        assert (dv[..., j * BLOCK:(j + 1) * BLOCK, :] == 0).all()
    assert (dq[lse == -math.inf] == 0).all()


def test_bad_input_is_refused_before_launch():
    q, k, v, do, idx, num, vbs, _ = make_case(nb=4, topk=2)
    o, lse = _triton_forward(q, k, v, idx, num, vbs)
    kidx, knum = invert_indices(idx, num, vbs.numel())
    three = [t[:, :, :192].contiguous() for t in (q, k, v, o, do, lse)]  # 3 kv blocks: odd
    with pytest.raises(ValueError, match="even"):
        A.sm90_block_sparse_bwd64(*three, kidx[:, :, :3].contiguous(), knum[:, :, :3].contiguous(), vbs[:3])
    with pytest.raises(ValueError, match="contiguous"):
        A.sm90_block_sparse_bwd64(q.transpose(1, 2), k, v, o, do, lse, kidx, knum, vbs)
    # q_len != kv_len: the chain is square (one S for q and kv), refused by shape
    k2, v2 = (torch.cat([t, t], dim=2) for t in (k, v))
    with pytest.raises(ValueError, match="shape"):
        A.sm90_block_sparse_bwd64(q, k2, v2, o, do, lse, kidx, knum, vbs)
    with pytest.raises(ValueError, match="bfloat16|bf16"):
        A.sm90_block_sparse_bwd64(q.half(), k, v, o, do, lse, kidx, knum, vbs)


@pytest.mark.parametrize("dq_reduce", ["atomic", "bulk", "bulk-smemstats", FLAT, "ws", WS_GROUPS, WS_ALL, WS_GROUPS_REDG,
                                       WS_NARROW_DQ, "ws:narrow_dq=1,p_stages=2", WS_FLAT, WS_TICKET, WS_PAIRS,
                                       WS_TMA])
def test_65536_tokens_vs_triton_and_run_to_run(dq_reduce):
    """1,024 kv blocks (the work order's regime), 12.5 % density, 4 heads: against the Triton
    backward; two runs: dk, dv bitwise, dq within the seed's summation-order bound. The
    warp-specialized kernel splits these lists into q groups (1,024 blocks >= GROUP_MIN_BLOCKS), so
    each dk/dv element is a sum of fp32 partials in no fixed order: the two runs' bf16 values may
    then differ by one bf16 ulp (2^-7 relative at most), plus the fp32 summation noise of elements
    that cancel to near zero (1e-5 of the tensor's scale)."""
    _vs_triton_twice(dq_reduce, nb=1024, topk=128, heads=4, ragged=False)


def test_wan_grid_length_with_this_gpus_groups():
    """624 kv blocks (the Wan-1.3B 480p grid's sequence) with ragged sizes, top-k 78, on the route's
    configuration with no group keys, so the q groups of ``cute_sm90_bwd64_ws.default_groups`` for this
    GPU (two groups of 312 on an H100, one group on the H200): against the Triton backward and run to
    run, as at 65,536 tokens."""
    from fastvideo_cute.adapters.cute_sm90_bwd64_ws import default_groups, device_name

    print("groups:", default_groups(624, device_name(torch.cuda.current_device())))
    _vs_triton_twice(_route_config(), nb=624, topk=78, heads=2, ragged=True)


def _vs_triton_twice(dq_reduce, nb, topk, heads, ragged):
    from fastvideo_cute.kernels.triton.block_sparse_bwd import block_sparse_attn_bwd

    q, k, v, do, idx, num, vbs, _ = make_case(nb=nb, topk=topk, heads=heads, ragged=ragged, nan_padding=False)
    kidx, knum = invert_indices(idx, num, nb)
    o, lse = _triton_forward(q, k, v, idx, num, vbs)
    tdq, tdk, tdv = (torch.empty_like(q) for _ in range(3))
    block_sparse_attn_bwd(q, k, v, o, do, lse, idx, num, kidx, knum, vbs, tdq, tdk, tdv,
                          sm_scale=SCALE, q_block=BLOCK, kv_block=BLOCK)
    got = _run(q, k, v, o, do, lse, idx, num, vbs, dq_reduce)
    again = _run(q, k, v, o, do, lse, idx, num, vbs, dq_reduce)
    for name, g, r in zip(("dq", "dk", "dv"), got, (tdq, tdk, tdv)):
        check_close(f"{name} vs Triton", g, r, rel=2e-2, mean=2e-3)
    if dq_reduce.startswith("ws"):
        for name, g, r in (("dk", got[1], again[1]), ("dv", got[2], again[2])):
            g, r = g.float(), r.float()
            bound = 2**-7 * r.abs() + 1e-5 * r.abs().max()
            assert ((g - r).abs() <= bound).all(), f"{name} run to run: {(g - r).abs().max().item()}"
    else:
        assert torch.equal(got[1], again[1]) and torch.equal(got[2], again[2]), "dk/dv run to run"
    check_close("dq run to run", again[0], got[0], rel=2e-2, mean=1e-4)
