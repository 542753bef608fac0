# SPDX-License-Identifier: Apache-2.0
"""VSA block-sparse attention forward, 64-token blocks, on Hopper wgmma + TMA (CuTe DSL, sm_90a).

What it computes: for each (64-row query tile ``i``, head ``h``, batch ``b``) the tile's
``num[i, h, b]`` selected kv tiles ``idx[0:num, i, h, b]`` (the library's q2k lists; entries past
the count are never read), ``out = softmax(scale * q K^T) V`` over the leading ``valid[j]`` keys
of each selected tile ``j`` (``sizes[j]`` clamped to [0, 64], or, without sizes, the keys before
the end of the sequence), and the natural-log LSE. Keys at or past ``valid[j]`` are padding:
their scores are masked by a select and their V rows are zeroed in shared memory before the
P V product, so NaN/Inf there never reaches the output (0 * NaN would). A query tile with no
entry (or only empty tiles) gets out 0 and LSE -inf; a NaN in a visible row gives NaN out and
NaN LSE (the sum is tested with ``l == 0``). Every query row is computed (no query-side size).

How (one CTA per (query tile, head, batch), one warpgroup of 128 threads, no warp
specialisation; the latency is hidden by three CTAs per SM, ``min_blocks_per_mp=3``):
  - Q (64 x D) arrives once by TMA; K (64 x D) has one shared-memory slot, V two (a ring), each
    with a TMA transaction barrier; warp 0 issues every load;
  - step j: V[j]'s load is issued, S[j] = Q K[j]^T (wgmma, both operands from shared memory) is
    issued, O is rescaled by the previous step's ratio and O += P[j-1] V[j-1] (wgmma, P from
    registers) is issued behind it; when S[j] retires (``wait_group(1)``) K[j+1]'s load goes into
    the freed slot, the keys past ``valid[j]`` are masked, the online softmax of S[j] runs while
    P V[j-1] still computes, and after ``wait_group(0)`` S[j] becomes P[j] (bf16, in registers);
  - a partial tile (``valid < 64``) zeroes V's padding rows in shared memory before its P V
    (generic-proxy stores, ``fence.proxy.async`` and a CTA barrier: only on partial tiles);
  - the epilogue normalises O, writes the LSE, stages O in Q's buffer and stores it by TMA (rows
    past the sequence are clipped by the TMA unit);
  - ``fuse_gate`` (a configuration; verified on the H200): the epilogue returns
    ``out_s + gate * out_c`` (VSA's gate composition: the gate tile arrives by TMA in a K slot
    once the last S has retired, on that slot's barrier; out_c's row of the query tile is read per
    column; fp32, rounded once), so the composition needs no pass of its own;
  - ``store_out_s`` (with ``fuse_gate``; the training forward): the epilogue also stores ``out_s``
    (the sparse branch alone, which the backward needs), staged in the gate's K slot once every
    thread has read its gate values, by a second TMA store; ``out_s`` is the same bits as the
    unfused kernel's ``out``, so the gate needs no pass in training either;
  - ``lazy_rescale`` (the default): a row's reference max moves only when the row's max passes
    it by more than 2^8 (``RESCALE_THRESHOLD``), so after the first steps O is almost never
    rescaled; the rescale, when a row needs it, runs once P V[j-1] has retired (a conditional
    multiply of an accumulator beside a wgmma in flight makes ptxas serialise every wgmma of the
    kernel, C7515). Out and LSE are the same quantities for any reference max (P <= 2^8 instead of
    <= 1; bf16/fp16 keep their relative precision). 2-3 % faster than rescaling every step on the
    H200 (``benchmarks/results/fwd64_sm90_h200_v9.json``);
  - ``lazy_vote`` (the default with ``lazy_rescale``): each lane compares its own part of a row
    with the reference max first, and only a warp where some lane's part passed it (or a row still
    at -inf) reduces the row maxima over the 4 lanes of a row (two shuffle rounds), computes the
    ratios and rescales O; elsewhere those instructions are skipped with one warp vote. The same
    bits as without it (a row's max passes the threshold only if one of its lanes' parts does). A
    step was ~310 instructions per warp and the kernel is bound by that chain, not by L2 bytes
    (Nsight Compute, docs/hopper-64-token.md): 3-4.5 % faster on the H200
    (``benchmarks/results/fwd64_sm90_h200_v11.json``);
  - ``narrow_tiles`` (the default): a thread's columns of a row hold keys 8 (c // 2) + 2 (lane % 4)
    + c % 2, so a tile of at most 16 / 32 valid keys (the partial tiles of a video grid's edges)
    runs its softmax on the first quarter / half of them (the rest -> P = 0; the P V steps past
    ceil16(keys) are not issued either), one branch per tile, uniform over the warpgroup. The same
    bits as without it (the skipped terms were -inf for the max and 0 for the sum). 1.5 % faster on
    the Wan-1.3B grid, the same on full tiles (``benchmarks/results/fwd64_sm90_h200_v15.json``);
  - ``q_regs`` (a configuration): Q's first ``q_regs`` columns in registers (ldmatrix once, at
    step 0) and those k-steps of S as RS wgmma, so S reads only K from shared memory there. All
    128 columns need 4 registers more than the 168 of three CTAs per SM (ptxas then spills the
    first fragment and serialises the wgmmas); 112 fit (166 registers). Within +-1.5 % of the
    default on the H200 (``fwd64_sm90_h200_v9.json``), so it stays off;
  - ``partial_loads`` (a configuration, off): a partial kv tile's K and V come as 16-key x 64-column
    TMA pieces, only those holding a valid key (stale rows left in a K slot are masked by the key
    select; V's are never reached by the P V steps), with the q2k list read two entries ahead so
    each tile's size is known before its loads. Its first build (2026-12-02) was exact and 4-5 %
    slower at 32K tokens and on the Wan-1.3B grid, where the kernel is bound by its instruction
    chain; re-written for Wan-14B 720p, where one head's K/V (46 MB, 18 % of it padding rows)
    outgrow the L2, it is exact on the H200 and no faster there either (40.59 vs 40.63 ms end to
    end, ``benchmarks/results/ab_vsa_glue_h200_partial_14b.json``), so it stays off;
  - ``packed_steps`` (a configuration, off; written 2026-12-04 without a GPU, compile-checked only):
    the list is a *step* list (``idx`` ``(4 W, Qb, H, B)``: four int32 words a step, ``num`` the step
    count; the host's ``kernels/triton/packed_steps`` writes it from the q2k lists and the sizes,
    which the kernel then does not read). A step is a whole tile (one 64-key load, as the default),
    or up to four 16-key pieces of any tiles, each loaded by TMA into its place in the K / V slot
    (the partial tiles of a video grid's edges, 16 or 32 keys on Wan's 4x4x4 tiles, then share a
    step instead of taking one each). A ragged piece (fewer than 16 valid keys) is masked per piece
    (``common/softmax.mask_keys_pieces_mn``) and its V padding rows are zeroed as above; the pieces
    past the used ones are masked (K: stale rows) and their P V steps not issued (V). The sum runs
    in another order than the unpacked list's, so the output differs from it by rounding only;
 the kv-split forward of the ``sm90`` adapter): this launch's
    lists cover one kv range, and an earlier launch over the ranges before it left its normalised
    output in ``prev_o`` and its LSE in ``lse``; the epilogue merges the two by their LSEs before
    the gate (``out = (w_prev * prev_o + w * out) / (w_prev + w)``, ``w = exp(lse - max)``, the
    merged LSE written over ``lse``; empty on both sides: 0 and -inf; a NaN on either side: NaN),
    so one head's resident K/V is one range's;
  - ``probe_loads`` (a timing probe, never routed: its output is wrong): the loop's V loads, or K's and
    V's, replaced by a bare barrier arrival, or every load from tile 0 / tile ``n % W`` (``win<W>``). On an H100
    (``benchmarks/results/fwd64_sm90_h100_probe_loads.json``, ``_prefetch.json``) the same chain with no
    loop loads is 1.40-1.47x the default, the same bytes from one tile 1.25-1.32x and from 16 tiles a head
    1.20-1.27x: the kernel waits on where its K / V bytes come from, not on the bytes or on its chain
    alone (docs/hopper-64-token.md);
  - ``rotate_walk`` (a configuration, off; written without a GPU run): the CTA of linear index ``i`` walks
    its list from entry ``((i % rotate_walk) * count) // rotate_walk``, wrapping around, so that CTAs
    started one after another read neighbouring kv tiles at the same moment (the probes above put 20-30 %
    of the time in the spread of the tiles the resident CTAs read). Deterministic; the output matches the
    default to rounding (the sum runs in another order);
  - ``tile_prefetch = p`` (a configuration, off; written without a GPU run): at step j warp 0 asks the L2
    for list entry j + p's K and V tiles, tensor prefetches (``UTMAPF``) of the loads' TMA boxes. It
    tests whether the spread above is a cost of reaching the lines or of their absence; hints only, the
    same bits;
  - the pipeline is a configuration too (``k_stages`` 1-3 K slots, ``v_stages`` 2-3 V slots,
    ``ctas_per_sm``, ``stmatrix_epilogue``): with ``k_stages`` slots K[j + k_stages] is issued once
    S[j] retires, with three V slots V[j + 1] is issued at step j. The default (one K slot, two V
    slots, three CTAs per SM) is the fastest measured on the H200; two CTAs with deeper rings were
    9-20 % slower (``benchmarks/results/fwd64_sm90_h200_v4.json``, docs/hopper-64-token.md).

Layouts (the cuDNN-frontend blk64 entry's, so one host path serves both): q / k / out
``(S, D, H, B)``, v ``(D, S, H, B)`` (unit stride on D, 128-byte aligned bases, every other stride
dynamic), lse fp32 ``(S, H, B)``, idx int32 ``(W, Qb, H, B)``, num int32 ``(Qb, H, B)``, sizes int32
``(KVb,)`` or None; with ``fuse_gate`` also gate ``(S, D, H, B)`` (q's layout) and out_c
``(D, Qb, H, B)`` (unit stride on D), else None; with ``store_out_s`` out_s ``(S, D, H, B)`` (q's
layout), else None; with ``merge_prev`` prev_o ``(S, D, H, B)`` (q's layout; may be out or out_s
itself: each element is read before the CTA's output leaves), else None. head_dim 64 or 128, fp16/bf16. Shared memory
(default pipeline): (64 D) x 4 x 2 B + barriers, 64 KB + 32 B at D = 128, three CTAs per SM within
the H200's 227 KB (``__init__`` refuses a pipeline whose CTAs do not fit).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_helpers
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from quack import layout_utils

from fastvideo_cute.jit import CuteKernel, fake_stream

from ..common.bulk import L2_EVICT_FIRST, L2_EVICT_LAST, tma_policy
from ..common.softmax import finalize_row, mask_keys_mn, mask_keys_pieces_mn, merge_weights, online_softmax_rows
from ..common.wgmma import wgmma_gemm

__all__ = ["BlockSparseFwd64Sm90", "BLOCK", "HEAD_DIMS", "DTYPE_NAMES", "BASE_ALIGN", "SMEM_PER_SM", "smem_bytes"]

BLOCK = 64
HEAD_DIMS = (64, 128)
DTYPE_NAMES = ("float16", "bfloat16")
BASE_ALIGN = 128
THREADS = 128
PV_STEP = 16  # keys per wgmma k-step of P V
# (``packed_steps``) a step of the packed list: four int32 words, one per 16-key piece of the K / V
# slot: bits 0-4 the piece's valid keys (0: unused), bit 5 ``STEP_WHOLE`` (word 0 of a step that is
# one whole tile), bits 6.. the piece's index in the sequence (key row / 16); the host's
# ``kernels/triton/packed_steps`` writes them
STEP_WORDS = 4
V_ZERO_VEC = 8  # elements of one V row a 16-byte zeroing store covers
STEP_WHOLE = 32
STEP_KEYS_MASK = 31
STEP_PIECE_SHIFT = 6
# (``probe_loads``, a timing probe) the loop's V loads or K and V loads dropped, every load of tile 0, or of
# tile ``n % W`` (a per-head working set of W tiles: 512 KB of K and V at W = 16, head_dim 128)
PROBES = ("", "skip_v", "skip_kv", "tile0", "win16", "win64", "win128", "win256")
# (``lazy_rescale``) a row's reference max moves only when the row's max passes it by more than
# this, in log2 units: P <= 2^8 (exact in bf16/fp16 to the same relative precision as P <= 1)
RESCALE_THRESHOLD = 8.0
_CUTE_DTYPES = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}
SMEM_PER_SM = 227 * 1024  # the H100/H200 shared memory a kernel may use per SM
SMEM_RESERVED_PER_CTA = 1024  # the driver's per-CTA reservation


def smem_bytes(head_dim: int, k_stages: int, v_stages: int) -> int:
    """Dynamic shared memory of one CTA: Q + the K and V rings (64 x D, 2 B each), barriers and the
    1 KB alignment slack of the buffers."""
    return BLOCK * head_dim * 2 * (1 + k_stages + v_stages) + 8 * (2 + k_stages + v_stages) + 1024


@cute.jit
def _uniform_base(t: cute.Tensor) -> cute.Tensor:
    """``t`` re-based on a warp-uniform copy of its start address (same elements and layout), so
    the per-step list reads do not rematerialise the address (constant loads + IMAD chain)."""
    addr = t.iterator.toint()
    lo = cute.arch.make_warp_uniform(Int32(addr & 0xFFFFFFFF))
    hi = cute.arch.make_warp_uniform(Int32(addr >> 32))
    base = (cutlass.Int64(hi) << 32) | (cutlass.Int64(lo) & 0xFFFFFFFF)
    return cute.make_tensor(cute.make_ptr(t.element_type, base, cute.AddressSpace.gmem, assumed_align=4), t.layout)


class BlockSparseFwd64Sm90(CuteKernel):
    """The sm_90a 64-token forward (module docstring). Called (compiled) as
    ``fn(q, k, v, out, lse, idx, num, sizes, softmax_scale)`` with the permuted torch views."""

    name = "block_sparse_fwd64_sm90"

    def __init__(self, dtype: str = "bfloat16", head_dim: int = 128, *, has_block_sizes: bool = True,
                 fuse_gate: bool = False, k_stages: int = 1, v_stages: int = 2, ctas_per_sm: int = 3,
                 stmatrix_epilogue: bool = False, q_regs: int = 0, lazy_rescale: bool = True,
                 lazy_vote: Optional[bool] = None, partial_loads: bool = False, store_out_s: bool = False,
                 merge_prev: bool = False, narrow_tiles: bool = True, packed_steps: bool = False,
                 l2_hints: bool = False, probe_loads: str = "", rotate_walk: int = 0, tile_prefetch: int = 0):
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {DTYPE_NAMES}, got {dtype!r}")
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim!r}")
        if k_stages not in (1, 2, 3):
            raise ValueError(f"k_stages must be 1, 2 or 3, got {k_stages!r}")
        if v_stages not in (2, 3):
            raise ValueError(f"v_stages must be 2 or 3, got {v_stages!r}")
        if ctas_per_sm not in (1, 2, 3):
            raise ValueError(f"ctas_per_sm must be 1, 2 or 3, got {ctas_per_sm!r}")
        if q_regs % 16 or not 0 <= q_regs <= head_dim:
            raise ValueError(f"q_regs (Q columns held in registers) must be a multiple of 16 in [0, head_dim], "
                             f"got {q_regs!r}")
        need = ctas_per_sm * (smem_bytes(head_dim, k_stages, v_stages) + SMEM_RESERVED_PER_CTA)
        if need > SMEM_PER_SM:
            raise ValueError(f"k_stages={k_stages}, v_stages={v_stages} at head_dim {head_dim} need {need} B of "
                             f"shared memory for {ctas_per_sm} CTAs per SM; the SM has {SMEM_PER_SM}")
        self.dtype_name = dtype
        self.head_dim = int(head_dim)
        self.has_block_sizes = bool(has_block_sizes)
        self.fuse_gate = bool(fuse_gate)
        self.k_stages = int(k_stages)
        self.v_stages = int(v_stages)
        self.ctas_per_sm = int(ctas_per_sm)
        self.stmatrix_epilogue = bool(stmatrix_epilogue)
        self.q_regs = int(q_regs)
        self.lazy_rescale = bool(lazy_rescale)
        if lazy_vote and not lazy_rescale:
            raise ValueError("lazy_vote (skip the row-max reduction where every lane keeps its reference max) "
                             "needs lazy_rescale")
        self.lazy_vote = self.lazy_rescale if lazy_vote is None else bool(lazy_vote)
        if partial_loads and (k_stages, v_stages) != (1, 2):
            raise ValueError(f"partial_loads needs the default rings (k_stages=1, v_stages=2), got "
                             f"k_stages={k_stages}, v_stages={v_stages}")
        self.partial_loads = bool(partial_loads)
        if packed_steps and (partial_loads or (k_stages, v_stages) != (1, 2)):
            raise ValueError(f"packed_steps needs the default rings (k_stages=1, v_stages=2) and no partial_loads, got "
                             f"k_stages={k_stages}, v_stages={v_stages}, partial_loads={partial_loads}")
        self.packed_steps = bool(packed_steps)
        if store_out_s and not fuse_gate:
            raise ValueError("store_out_s (out_s beside out_s + gate * out_c) needs fuse_gate; without the gate "
                             "the kernel's out is out_s")
        self.store_out_s = bool(store_out_s)
        self.merge_prev = bool(merge_prev)
        self.narrow_tiles = bool(narrow_tiles)
        # L2 cache policies on the TMA copies: Q (read once) and the outputs (written once) evict_first, the
        # whole K / V tiles (read by every query tile that selected them) evict_last; hints only, the same bits
        self.l2_hints = bool(l2_hints)
        # (a timing probe, never routed: its output is wrong) the loop's V loads ("skip_v") or K and V loads
        # ("skip_kv") replaced by a bare barrier arrival, or every load of tile 0 ("tile0") or of tile n % W
        # ("win<W>"): the same instruction chain with fewer bytes or the same bytes from a small working set
        if probe_loads not in PROBES:
            raise ValueError(f"probe_loads must be one of {PROBES}, got {probe_loads!r}")
        if probe_loads and (partial_loads or packed_steps or k_stages != 1 or fuse_gate):
            raise ValueError("probe_loads is a timing probe of the default build (no partial_loads, packed_steps, "
                             "fuse_gate; one K slot)")
        self.probe_loads = str(probe_loads)
        # (tile0 / win<W>) the loads' tile index taken modulo this window (0: not a window probe)
        self.probe_window = 1 if probe_loads == "tile0" else int(probe_loads[3:]) if probe_loads.startswith("win") else 0
        # (off; written 2026-12-07 without a GPU run) the CTA of linear index i (grid x fastest) walks its list
        # from entry ((i % rotate_walk) * count) // rotate_walk, wrapping around: with rotate_walk the resident
        # CTAs of a wave, CTAs that start one after another in a staggered steady state read neighbouring kv
        # tiles at the same moment (a sorted list's position tracks its kv index). Deterministic (no clock);
        # the sum runs in another order, so the output matches the default to rounding only
        if not 0 <= rotate_walk <= 4096:
            raise ValueError(f"rotate_walk (resident CTAs a wave, 0 = off) must be in [0, 4096], got {rotate_walk!r}")
        if rotate_walk and (partial_loads or packed_steps or (k_stages, v_stages) != (1, 2)):
            raise ValueError("rotate_walk is written for the default rings and whole-tile lists (no partial_loads, "
                             "packed_steps)")
        self.rotate_walk = int(rotate_walk)
        # (off; written 2026-12-08 without a GPU run) at step j warp 0 asks the L2 for list entry j + p's K and V
        # tiles by tensor prefetches (cp.async.bulk.prefetch.tensor, SASS UTMAPF) of the TMA boxes the loads read,
        # two 64-column boxes a tile: four requests a step (the removed per-row l2_prefetch sent 128). Hints only
        if not 0 <= tile_prefetch <= 8 or tile_prefetch == 1:
            raise ValueError(f"tile_prefetch (list entries ahead, 0 = off; K[j + 1] is loaded at step j) must be 0 or "
                             f"in [2, 8], got {tile_prefetch!r}")
        if tile_prefetch and (partial_loads or packed_steps or probe_loads or (k_stages, v_stages) != (1, 2)):
            raise ValueError("tile_prefetch is written for the default rings and whole-tile lists (no partial_loads, "
                             "packed_steps, probe_loads)")
        self.tile_prefetch = int(tile_prefetch)

    def config(self) -> Mapping[str, Any]:
        return {"dtype": self.dtype_name, "head_dim": self.head_dim, "has_block_sizes": self.has_block_sizes,
                "fuse_gate": self.fuse_gate, "k_stages": self.k_stages, "v_stages": self.v_stages,
                "ctas_per_sm": self.ctas_per_sm, "stmatrix_epilogue": self.stmatrix_epilogue,
                "q_regs": self.q_regs, "lazy_rescale": self.lazy_rescale, "lazy_vote": self.lazy_vote,
                "partial_loads": self.partial_loads, "store_out_s": self.store_out_s,
                "merge_prev": self.merge_prev, "narrow_tiles": self.narrow_tiles, "packed_steps": self.packed_steps,
                **({"l2_hints": True} if self.l2_hints else {}),
                **({"probe_loads": self.probe_loads} if self.probe_loads else {}),
                **({"rotate_walk": self.rotate_walk} if self.rotate_walk else {}),
                **({"tile_prefetch": self.tile_prefetch} if self.tile_prefetch else {})}

    def fake_args(self) -> tuple:
        dt = _CUTE_DTYPES[self.dtype_name]
        b, h, sq, skv, qb, width, kvb = (cute.sym_int32() for _ in range(7))

        def tensor(dtype, shape, unit: int, align: int):
            stride = tuple(1 if i == unit else cute.sym_int64() for i in range(len(shape)))
            return cute.runtime.make_fake_tensor(dtype, shape, stride=stride, assumed_align=align)

        d = self.head_dim
        q = tensor(dt, (sq, d, h, b), 1, BASE_ALIGN)
        k = tensor(dt, (skv, d, h, b), 1, BASE_ALIGN)
        v = tensor(dt, (d, skv, h, b), 0, BASE_ALIGN)
        out = tensor(dt, (sq, d, h, b), 1, BASE_ALIGN)
        lse = tensor(Float32, (sq, h, b), 0, 4)
        idx = tensor(Int32, (width, qb, h, b), 0, 4)
        num = tensor(Int32, (qb, h, b), 0, 4)
        sizes = tensor(Int32, (kvb,), 0, 4) if self.has_block_sizes else None
        gate = tensor(dt, (sq, d, h, b), 1, BASE_ALIGN) if self.fuse_gate else None
        out_c = tensor(dt, (d, qb, h, b), 0, 4) if self.fuse_gate else None
        out_s = tensor(dt, (sq, d, h, b), 1, BASE_ALIGN) if self.store_out_s else None
        prev_o = tensor(dt, (sq, d, h, b), 1, 16) if self.merge_prev else None
        return (q, k, v, out, lse, idx, num, sizes, gate, out_c, out_s, prev_o, Float32(1.0), fake_stream())

    # ------------------------------------------------------------------ host side
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 mIdx: cute.Tensor, mNum: cute.Tensor, mSizes, mGate, mOutC, mOs, mPrevO, softmax_scale: Float32,
                 stream: cuda.CUstream):
        d = self.head_dim
        dt = _CUTE_DTYPES[self.dtype_name]

        def static_dim(t: cute.Tensor, mode: int) -> cute.Tensor:
            shape = tuple(d if i == mode else t.shape[i] for i in range(4))
            return cute.make_tensor(t.iterator, cute.make_layout(shape, stride=t.stride))

        mQ, mK, mO, mV = static_dim(mQ, 1), static_dim(mK, 1), static_dim(mO, 1), static_dim(mV, 0)

        k_atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, dt)
        mn_atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.MN_SW128, dt)
        sQ_layout = cute.tile_to_shape(k_atom, (BLOCK, d), order=(0, 1))
        sK_layout = cute.tile_to_shape(k_atom, (BLOCK, d, self.k_stages), order=(0, 1, 2))
        sK_one = cute.slice_(sK_layout, (None, None, 0))
        sV_layout = cute.tile_to_shape(mn_atom, (d, BLOCK, self.v_stages), order=(1, 0, 2))
        sV_one = cute.slice_(sV_layout, (None, None, 0))

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(g2s, mQ, sQ_layout, (BLOCK, d))
        tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(g2s, mK, sK_one, (BLOCK, d))
        tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(g2s, mV, sV_one, (d, BLOCK))
        tma_atom_O, tma_O = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), mO, sQ_layout, (BLOCK, d))
        if const_expr(self.fuse_gate):  # the gate tile lands in K's slot once the last S has retired
            tma_atom_G, tma_G = cpasync.make_tiled_tma_atom(g2s, static_dim(mGate, 1), sK_one, (BLOCK, d))
        else:
            tma_atom_G, tma_G = tma_atom_K, tma_K  # placeholders, never used
        out_c = mOutC if const_expr(self.fuse_gate) else mNum
        prev_o = static_dim(mPrevO, 1) if const_expr(self.merge_prev) else mNum  # (a placeholder never read)
        if const_expr(self.store_out_s):  # out_s leaves from the gate's K slot (K's tile layout = Q's)
            tma_atom_Os, tma_Os = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), static_dim(mOs, 1),
                                                              sK_one, (BLOCK, d))
        else:
            tma_atom_Os, tma_Os = tma_atom_O, tma_O  # placeholders, never used
        if const_expr(self.partial_loads or self.packed_steps):  # 16-key pieces (x 64 columns) of K and V
            hd = min(d, 64)
            sK_piece = cute.tile_to_shape(k_atom, (PV_STEP, hd), order=(0, 1))
            sV_piece = cute.tile_to_shape(mn_atom, (hd, PV_STEP), order=(1, 0))
            tma_atom_K16, tma_K16 = cpasync.make_tiled_tma_atom(g2s, mK, sK_piece, (PV_STEP, hd))
            tma_atom_V16, tma_V16 = cpasync.make_tiled_tma_atom(g2s, mV, sV_piece, (hd, PV_STEP))
        else:
            tma_atom_K16, tma_K16, tma_atom_V16, tma_V16 = tma_atom_K, tma_K, tma_atom_V, tma_V  # never used

        mma_qk = sm90_helpers.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                     (1, 1, 1), tiler_mn=(BLOCK, BLOCK))
        mma_qk_rs = mma_qk  # (q_regs) the k-steps of S whose Q columns are in registers: RS wgmma
        if const_expr(self.q_regs > 0):
            mma_qk_rs = sm90_helpers.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                            (1, 1, 1), tiler_mn=(BLOCK, BLOCK),
                                                            a_source=warpgroup.OperandSource.RMEM)
        mma_pv = sm90_helpers.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.MN, Float32,
                                                     (1, 1, 1), tiler_mn=(BLOCK, d),
                                                     a_source=warpgroup.OperandSource.RMEM)

        @cute.struct
        class SharedStorage:
            bar_q: cute.struct.MemRange[cutlass.Int64, 1]
            bar_k: cute.struct.MemRange[cutlass.Int64, self.k_stages]
            bar_v: cute.struct.MemRange[cutlass.Int64, self.v_stages]
            sQ: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], 1024]

        scale_log2 = softmax_scale * Float32(math.log2(math.e))
        grid = (cute.ceil_div(mQ.shape[0], BLOCK), mQ.shape[2], mQ.shape[3])
        sizes = mSizes if const_expr(self.has_block_sizes) else mNum  # a placeholder never read
        self.kernel(
            tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, tma_atom_O, tma_O, tma_atom_G, tma_G, out_c,
            tma_atom_Os, tma_Os, prev_o, tma_atom_K16, tma_K16, tma_atom_V16, tma_V16, mLSE, mIdx, mNum, sizes,
            sQ_layout, sK_layout, sV_layout, mma_qk, mma_qk_rs, mma_pv, scale_log2, SharedStorage,
        ).launch(grid=grid, block=(THREADS, 1, 1), smem=SharedStorage.size_in_bytes(), stream=stream,
                 # three CTAs per SM: ptxas caps a thread at 65536 / 384 registers; the full
                 # shared-memory carveout is asked for explicitly (it also keeps the build free of
                 # the device query the DSL makes otherwise, so it cross-compiles without a GPU)
                 min_blocks_per_mp=self.ctas_per_sm, preferred_smem_carveout=100)

    # ------------------------------------------------------------------ device side
    @cute.jit
    def tile_keys(self, mSizes, n: Int32, seqlen_k: Int32) -> Int32:
        """Valid leading keys of kv tile ``n``, in [0, 64]."""
        keys = cutlass.min(seqlen_k - n * BLOCK, Int32(BLOCK))
        if const_expr(self.has_block_sizes):
            keys = cutlass.min(cutlass.max(mSizes[n], Int32(0)), keys)
        return cutlass.max(keys, Int32(0))

    @cute.jit
    def v_row_stores(self, sV: cute.Tensor, slot: Int32, tidx: Int32):
        """What a thread needs to zero V rows of ring slot ``slot``: the 16-byte store atom, a zero
        vector, the slot, the thread's 8-column chunk ``c`` and first key ``k0``; pass ``i`` of
        ``BLOCK // keys_per_pass`` is key ``k0 + i * keys_per_pass``."""
        dt = _CUTE_DTYPES[self.dtype_name]
        chunks = self.head_dim // V_ZERO_VEC
        zero = cute.make_rmem_tensor((V_ZERO_VEC, 1), dt)
        zero.fill(0.0)
        store = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt, num_bits_per_copy=128)
        return store, zero, sV[None, None, slot], tidx % chunks, tidx // chunks, THREADS // chunks

    @cute.jit
    def zero_v_padding(self, sV: cute.Tensor, slot: Int32, keys: Int32, tidx: Int32):
        """V rows (keys) ``keys .. ceil16(keys) - 1`` of ring slot ``slot`` -> 0, visible to the next
        wgmma (the P V steps past ``ceil16(keys)`` are not issued, so those rows are never read):
        16-byte stores (8 elements of one key along D, contiguous under the 128-byte swizzle)."""
        store, zero, sV_slot, c, k0, keys_per_pass = self.v_row_stores(sV, slot, tidx)
        end = (keys + PV_STEP - 1) // PV_STEP * PV_STEP
        for i in cutlass.range_constexpr(BLOCK // keys_per_pass):
            key = k0 + i * keys_per_pass
            if key >= keys and key < end:
                cute.copy(store, zero, cute.local_tile(sV_slot, (V_ZERO_VEC, 1), (c, key)))
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier()

    @cute.kernel
    def kernel(self, tma_atom_Q: cute.CopyAtom, mQ: cute.Tensor, tma_atom_K: cute.CopyAtom, mK: cute.Tensor,
               tma_atom_V: cute.CopyAtom, mV: cute.Tensor, tma_atom_O: cute.CopyAtom, mO: cute.Tensor,
               tma_atom_G: cute.CopyAtom, mG: cute.Tensor, mOutC: cute.Tensor,
               tma_atom_Os: cute.CopyAtom, mOs: cute.Tensor, mPrevO: cute.Tensor, tma_atom_K16: cute.CopyAtom, mK16: cute.Tensor, tma_atom_V16: cute.CopyAtom, mV16: cute.Tensor,
               mLSE: cute.Tensor, mIdx: cute.Tensor, mNum: cute.Tensor, mSizes,
               sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout,
               mma_qk: cute.TiledMma, mma_qk_rs: cute.TiledMma, mma_pv: cute.TiledMma, scale_log2: Float32,
               SharedStorage: cutlass.Constexpr):
        d = self.head_dim
        dt = _CUTE_DTYPES[self.dtype_name]
        tidx, _, _ = cute.arch.thread_idx()
        qt, h, b = cute.arch.block_idx()
        # The tile / head / batch coordinates feed every TMA issue in the loop; read once and held
        # as warp-uniform values, ptxas keeps them in registers instead of re-reading SR_CTAID
        # (S2UR) inside each issue branch (seen in the SASS).
        qt = cute.arch.make_warp_uniform(qt)
        h = cute.arch.make_warp_uniform(h)
        b = cute.arch.make_warp_uniform(b)
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        seqlen_q = mQ.shape[0]
        seqlen_k = mK.shape[0]
        width = mIdx.shape[0]
        ks, vs = self.k_stages, self.v_stages
        tx = {"q": cute.size_in_bytes(dt, sQ_layout), "k": cute.size_in_bytes(dt, cute.slice_(sK_layout, (None, None, 0))),
              "v": cute.size_in_bytes(dt, cute.slice_(sV_layout, (None, None, 0)))}

        if warp_idx == 0:
            for atom in (tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O):
                cpasync.prefetch_descriptor(atom)
            if const_expr(self.fuse_gate):
                cpasync.prefetch_descriptor(tma_atom_G)
            if const_expr(self.store_out_s):
                cpasync.prefetch_descriptor(tma_atom_Os)
            if const_expr(self.partial_loads or self.packed_steps):
                cpasync.prefetch_descriptor(tma_atom_K16)
                cpasync.prefetch_descriptor(tma_atom_V16)

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        tma_op = pipeline.PipelineOp.TmaLoad
        one = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        bar_q = pipeline.MbarrierArray(storage.bar_q.data_ptr(), num_stages=1, agent=(tma_op, one))
        bar_k = pipeline.MbarrierArray(storage.bar_k.data_ptr(), num_stages=ks, agent=(tma_op, one))
        bar_v = pipeline.MbarrierArray(storage.bar_v.data_ptr(), num_stages=vs, agent=(tma_op, one))
        cute.arch.mbarrier_init_fence()

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)

        gQ = cute.local_tile(mQ[None, None, h, b], (BLOCK, d), (qt, 0))
        gK = cute.local_tile(mK[None, None, h, b], (BLOCK, d), (None, 0))  # (64, D, kv tiles)
        gV = cute.local_tile(mV[None, None, h, b], (d, BLOCK), (0, None))  # (D, 64, kv tiles)
        gO = cute.local_tile(mO[None, None, h, b], (BLOCK, d), (qt, 0))
        unit = cute.make_layout(1)
        tQsQ, tQgQ = cpasync.tma_partition(tma_atom_Q, 0, unit, cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
        tKsK, tKgK = cpasync.tma_partition(tma_atom_K, 0, unit, cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_atom_V, 0, unit, cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))
        k16 = v16 = None
        if const_expr(self.partial_loads or self.packed_steps):
            # 16-key x 64-column pieces: K (16, 64, key pieces, column halves[, slot]), V (64, 16,
            # column halves, key pieces[, slot]); each piece 2 KB of smem at a 1 KB-aligned offset of
            # its slot, so the 128-byte swizzle lands as the whole tile's load would place it
            hd = min(d, 64)
            sK16 = cute.flat_divide(sK, (PV_STEP, hd))
            gK16 = cute.flat_divide(mK16[None, None, h, b], (PV_STEP, hd))
            sV16 = cute.flat_divide(sV, (hd, PV_STEP))
            gV16 = cute.flat_divide(mV16[None, None, h, b], (hd, PV_STEP))
            tK16s, tK16g = cpasync.tma_partition(tma_atom_K16, 0, unit, cute.group_modes(sK16, 0, 2),
                                                 cute.group_modes(gK16, 0, 2))
            tV16s, tV16g = cpasync.tma_partition(tma_atom_V16, 0, unit, cute.group_modes(sV16, 0, 2),
                                                 cute.group_modes(gV16, 0, 2))
            k16, v16 = (tma_atom_K16, tK16g, tK16s), (tma_atom_V16, tV16g, tV16s)

        thr_qk = mma_qk.get_slice(tidx)
        thr_pv = mma_pv.get_slice(tidx)
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ))
        tSrQr = tSrQ  # (q_regs) Q as RS wgmma fragments; the first q_regs // 16 k-steps loaded at step 0
        if const_expr(self.q_regs > 0):
            thr_rs = mma_qk_rs.get_slice(tidx)
            tSrQr = thr_rs.make_fragment_A(thr_rs.partition_A(sQ))
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))  # (..., k stages)
        tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sV))  # (..., v stages)
        acc_S = cute.make_rmem_tensor(thr_qk.partition_shape_C((BLOCK, BLOCK)), Float32)
        acc_O = cute.make_rmem_tensor(thr_pv.partition_shape_C((BLOCK, d)), Float32)
        acc_O.fill(0.0)
        tScS = layout_utils.reshape_acc_to_mn(thr_qk.partition_C(cute.make_identity_tensor((BLOCK, BLOCK))))
        tP_view = layout_utils.reshape_acc_to_frgA(acc_S)
        rP = cute.make_rmem_tensor_like(tP_view, dt)
        acc_S_mn = layout_utils.reshape_acc_to_mn(acc_S)
        acc_O_mn = layout_utils.reshape_acc_to_mn(acc_O)
        num_rows = cute.size(acc_O_mn, mode=[0])
        row_max = cute.make_rmem_tensor((num_rows,), Float32)
        row_sum = cute.make_rmem_tensor((num_rows,), Float32)
        alpha = cute.make_rmem_tensor((num_rows,), Float32)
        neg_scaled = cute.make_rmem_tensor((num_rows,), Float32)  # (lazy_vote) -(max * scale_log2), carried
        neg_scaled.fill(0.0)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        alpha.fill(1.0)

        cute.arch.barrier()  # barrier initialisation visible to every waiting thread
        # Q does not depend on the list: its load goes out before the count and the first entry
        # (read unconditionally: the list is at least one entry wide) come back.
        if warp_idx == 0:
            bar_q.arrive_and_expect_tx(0, tx["q"])
            cute.copy(tma_atom_Q, tQgQ, tQsQ, tma_bar_ptr=bar_q.get_barrier(0),
                      **tma_policy(L2_EVICT_FIRST if self.l2_hints else 0))
        gIdx = _uniform_base(mIdx[None, qt, h, b])
        n_cur = gIdx[0]
        # (packed_steps) the step list's words (``step_keys``): the step before, this one, the next
        st_prev = st_cur = st_nxt = None
        ragged_cur = ragged_prev = cutlass.Boolean(False)
        if const_expr(self.packed_steps):
            st_prev, st_cur, st_nxt = (cute.make_rmem_tensor((STEP_WORDS,), Int32) for _ in range(3))
            for c in cutlass.range_constexpr(STEP_WORDS):
                st_cur[c] = gIdx[c]
            width = width // STEP_WORDS
        count = cutlass.min(cutlass.max(mNum[qt, h, b], Int32(0)), width)
        s0 = Int32(0)  # (rotate_walk) the list entry the walk starts from
        if const_expr(self.rotate_walk > 0):
            gdim = cute.arch.grid_dim()
            lin = qt + gdim[0] * (h + gdim[1] * b)
            s0 = ((lin % Int32(self.rotate_walk)) * count) // Int32(self.rotate_walk)
            n_cur = gIdx[s0]

        if count > 0:
            # Prologue: K[0 .. ks-1] fill the K ring, V[0 .. vs-2] the V ring (V[j + vs - 2] is
            # issued at step j, into the slot whose P V retired at step j - 1).
            keys_cur = Int32(BLOCK)
            if const_expr(self.partial_loads):  # (the loads of tile 0 need its size)
                keys_cur = self.tile_keys(mSizes, n_cur, seqlen_k)
            if warp_idx == 0:
                if const_expr(self.packed_steps):
                    self.load_step(tma_atom_K, tKgK, tKsK, k16, bar_k, tx["k"], Int32(0), st_cur, False)
                    self.load_step(tma_atom_V, tVgV, tVsV, v16, bar_v, tx["v"], Int32(0), st_cur, True)
                elif const_expr(self.partial_loads):
                    self.load_kv(tma_atom_K, tKgK, tKsK, k16, bar_k, tx["k"], Int32(0), n_cur, keys_cur, False)
                    self.load_kv(tma_atom_V, tVgV, tVsV, v16, bar_v, tx["v"], Int32(0), n_cur, keys_cur, True)
                else:
                    self.load_tile(tma_atom_K, tKgK, tKsK, bar_k, tx["k"], 0, n_cur)
                    self.load_tile(tma_atom_V, tVgV, tVsV, bar_v, tx["v"], 0, n_cur)
                for i in cutlass.range_constexpr(1, ks):
                    if i < count:
                        self.load_tile(tma_atom_K, tKgK, tKsK, bar_k, tx["k"], i, gIdx[i])
                for i in cutlass.range_constexpr(1, vs - 1):
                    if i < count:
                        self.load_tile(tma_atom_V, tVgV, tVsV, bar_v, tx["v"], i, gIdx[i])
                for i in cutlass.range_constexpr(1, self.tile_prefetch):  # (tile_prefetch) entries 1 .. p-1
                    if i < count:
                        self.prefetch_tile(tma_atom_K, tKgK, tma_atom_V, tVgV, gIdx[self.walk_pos(Int32(i), s0, count)])
            n_next = Int32(0)
            if count > 1:
                n_next = gIdx[self.walk_pos(Int32(1), s0, count)]
            n_nn = Int32(0)  # (partial_loads) the list entry two ahead, and the next tile's size
            keys_nxt = Int32(BLOCK)
            if const_expr(self.packed_steps):
                if count > 1:
                    for c in cutlass.range_constexpr(STEP_WORDS):
                        st_nxt[c] = gIdx[STEP_WORDS + c]
                keys_cur = self.step_keys(st_cur)
                ragged_cur = self.step_ragged(st_cur)
            elif const_expr(self.partial_loads):
                if count > 2:
                    n_nn = gIdx[2]
                keys_nxt = self.tile_keys(mSizes, n_next, seqlen_k)
            else:
                keys_cur = self.tile_keys(mSizes, n_cur, seqlen_k)

            # ---- step 0: S[0], no P V yet
            bar_k.wait(0, 0)
            bar_q.wait(0, 0)
            if const_expr(self.q_regs > 0):
                self.load_q_regs(mma_qk_rs, sQ, tSrQr, tidx)
            self.gemm_s(mma_qk, mma_qk_rs, acc_S, tSrQ, tSrQr, tSrK[None, None, None, 0])
            warpgroup.wait_group(0)
            if warp_idx == 0 and ks < count:  # K[ks] into the slot S[0] freed
                if const_expr(self.packed_steps):
                    self.load_step(tma_atom_K, tKgK, tKsK, k16, bar_k, tx["k"], Int32(0), st_nxt, False)
                elif const_expr(self.partial_loads):
                    self.load_kv(tma_atom_K, tKgK, tKsK, k16, bar_k, tx["k"], Int32(0), n_next, keys_nxt, False)
                elif const_expr(self.probe_loads == "skip_kv"):
                    bar_k.arrive_and_expect_tx(0, 0)
                else:
                    self.load_tile(tma_atom_K, tKgK, tKsK, bar_k, tx["k"], 0,
                                   n_next if const_expr(ks == 1) else gIdx[ks])
            self.softmax(acc_S, acc_S_mn, tScS, keys_cur, row_max, row_sum, alpha, neg_scaled, scale_log2,
                         st_cur, ragged_cur)
            rP.store(tP_view.load().to(dt))
            keys_prev = keys_cur
            ragged_prev = ragged_cur

            # ---- steps 1 .. count-1: S[j] in flight with P V[j-1]
            for j in cutlass.range(1, count, unroll=1):
                n_cur = n_next
                if const_expr(self.packed_steps):  # step j's words were read one step ahead
                    for c in cutlass.range_constexpr(STEP_WORDS):
                        st_prev[c] = st_cur[c]
                        st_cur[c] = st_nxt[c]
                    if j + 1 < count:
                        for c in cutlass.range_constexpr(STEP_WORDS):
                            st_nxt[c] = gIdx[(j + 1) * STEP_WORDS + c]
                elif const_expr(self.partial_loads):  # the list two ahead: a size read waits on no list read
                    n_next = n_nn
                    if j + 2 < count:
                        n_nn = gIdx[j + 2]
                else:
                    if j + 1 < count:
                        n_next = gIdx[self.walk_pos(j + 1, s0, count)]
                n_k = n_next  # K[j + ks]'s tile: read now, issued once S[j] retires
                if const_expr(ks > 1):
                    if j + ks < count:
                        n_k = gIdx[j + ks]
                if const_expr(self.packed_steps):
                    keys_cur = self.step_keys(st_cur)
                    ragged_cur = self.step_ragged(st_cur)
                elif const_expr(self.partial_loads):
                    keys_cur = keys_nxt
                    keys_nxt = self.tile_keys(mSizes, n_next, seqlen_k)
                else:
                    keys_cur = self.tile_keys(mSizes, n_cur, seqlen_k)
                if warp_idx == 0 and j + vs - 2 < count:  # V[j + vs - 2]
                    if const_expr(self.packed_steps):
                        self.load_step(tma_atom_V, tVgV, tVsV, v16, bar_v, tx["v"], j % vs, st_cur, True)
                    elif const_expr(self.partial_loads):
                        self.load_kv(tma_atom_V, tVgV, tVsV, v16, bar_v, tx["v"], j % vs, n_cur, keys_cur, True)
                    elif const_expr(self.probe_loads in ("skip_v", "skip_kv")):
                        bar_v.arrive_and_expect_tx((j + vs - 2) % vs, 0)
                    else:
                        self.load_tile(tma_atom_V, tVgV, tVsV, bar_v, tx["v"], (j + vs - 2) % vs,
                                       n_cur if const_expr(vs == 2) else n_next)
                if const_expr(self.tile_prefetch > 0):  # entry j + p's tiles into the L2
                    if warp_idx == 0 and j + self.tile_prefetch < count:
                        self.prefetch_tile(tma_atom_K, tKgK, tma_atom_V, tVgV,
                                           gIdx[self.walk_pos(j + self.tile_prefetch, s0, count)])
                k_slot = j % ks
                bar_k.wait(k_slot, (j // ks) % 2)
                self.gemm_s(mma_qk, mma_qk_rs, acc_S, tSrQ, tSrQr, tSrK[None, None, None, k_slot])
                if const_expr(not self.lazy_rescale):  # beside S[j] (lazy: after P V[j-1], below)
                    self.rescale_o(acc_O_mn, alpha, num_rows)
                prev = (j - 1) % vs
                bar_v.wait(prev, ((j - 1) // vs) % 2)
                if const_expr(self.packed_steps):
                    if ragged_prev:
                        self.zero_v_pieces(sV, prev, st_prev, tidx)
                elif keys_prev % PV_STEP != 0:
                    self.zero_v_padding(sV, prev, keys_prev, tidx)
                self.gemm_pv(mma_pv, acc_O, rP, tOrV[None, None, None, prev], keys_prev)
                warpgroup.wait_group(1)  # S[j] retired; P V[j-1] may still run
                if warp_idx == 0 and j + ks < count:
                    if const_expr(self.packed_steps):
                        self.load_step(tma_atom_K, tKgK, tKsK, k16, bar_k, tx["k"], k_slot, st_nxt, False)
                    elif const_expr(self.partial_loads):
                        self.load_kv(tma_atom_K, tKgK, tKsK, k16, bar_k, tx["k"], k_slot, n_k, keys_nxt, False)
                    elif const_expr(self.probe_loads == "skip_kv"):
                        bar_k.arrive_and_expect_tx(k_slot, 0)
                    else:
                        self.load_tile(tma_atom_K, tKgK, tKsK, bar_k, tx["k"], k_slot, n_k)
                moved = self.softmax(acc_S, acc_S_mn, tScS, keys_cur, row_max, row_sum, alpha, neg_scaled,
                                     scale_log2, st_cur, ragged_cur)
                warpgroup.wait_group(0)  # P V[j-1] retired: P's registers are free
                if const_expr(self.lazy_rescale):
                    # no wgmma in flight: a conditional rescale beside one would make ptxas
                    # serialise every wgmma of the kernel (C7515)
                    if const_expr(self.lazy_vote):
                        if moved:  # (warp-uniform) some row of this warp moved its reference max
                            self.rescale_o(acc_O_mn, alpha, num_rows)
                    else:
                        self.rescale_o(acc_O_mn, alpha, num_rows)
                rP.store(tP_view.load().to(dt))
                keys_prev = keys_cur
                ragged_prev = ragged_cur

            # ---- drain: P V[count-1]; every S has retired, so the gate tile can take a K slot
            if const_expr(self.fuse_gate):
                if warp_idx == 0:
                    self.load_gate(tma_atom_G, mG, sK, bar_k, tx["k"], count % ks, qt, h, b)
            last = (count - 1) % vs
            if const_expr(not self.lazy_rescale):  # (lazy: done at the end of the last step)
                self.rescale_o(acc_O_mn, alpha, num_rows)
            bar_v.wait(last, ((count - 1) // vs) % 2)
            if const_expr(self.packed_steps):
                if ragged_prev:  # (st_cur: the last step's words)
                    self.zero_v_pieces(sV, last, st_cur, tidx)
            elif keys_prev % PV_STEP != 0:
                self.zero_v_padding(sV, last, keys_prev, tidx)
            self.gemm_pv(mma_pv, acc_O, rP, tOrV[None, None, None, last], keys_prev)
            warpgroup.wait_group(0)

        else:
            bar_q.wait(0, 0)  # Q landed before its buffer takes O
            if const_expr(self.fuse_gate):
                if warp_idx == 0:
                    self.load_gate(tma_atom_G, mG, sK, bar_k, tx["k"], Int32(0), qt, h, b)

        # ---- epilogue: normalise, LSE, O through Q's buffer by TMA
        tOcO_mn = layout_utils.reshape_acc_to_mn(thr_pv.partition_C(cute.make_identity_tensor((BLOCK, d))))
        st_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt, num_bits_per_copy=32)
        thr_copy_O = cute.make_tiled_copy_C(st_atom, mma_pv).get_slice(tidx)
        rG_mn = acc_O_mn  # (unused without the gate)
        if const_expr(self.fuse_gate):
            # the gate tile is K slot (count % ks)'s (count // ks + 1)-th completion: count // ks
            # K tiles went through that slot before it
            g_slot = count % self.k_stages
            bar_k.wait(g_slot, (count // self.k_stages) % 2)
            rG = cute.make_rmem_tensor_like(acc_O, dt)
            cute.copy(thr_copy_O, thr_copy_O.partition_S(sK[None, None, g_slot]), thr_copy_O.retile(rG))
            rG_mn = layout_utils.reshape_acc_to_mn(rG)
        num_cols = cute.size(acc_O_mn, mode=[1])
        oc = cute.make_rmem_tensor((num_cols,), Float32)
        # this thread's columns of the tile's out_c row (with merge_prev read where used: registers)
        if const_expr(self.fuse_gate and not self.merge_prev):
            for c in cutlass.range_constexpr(num_cols):
                oc[c] = Float32(mOutC[tOcO_mn[0, c][1], qt, h, b])
        lse_prev = cute.make_rmem_tensor((num_rows,), Float32)  # (merge_prev) the earlier ranges' LSEs
        if const_expr(self.merge_prev):
            for r in cutlass.range_constexpr(num_rows):
                lse_prev[r] = mLSE[qt * BLOCK + tOcO_mn[r, 0][0], h, b]
            cute.arch.sync_warp()  # every lane of a row has read its LSE before one of them writes it
        for r in cutlass.range_constexpr(num_rows):
            total = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
            inv, lse, empty = finalize_row(row_max[r], total, scale_log2)
            if const_expr(self.merge_prev):
                a_this, a_prev, lse = merge_weights(lse, lse_prev[r])
            for c in cutlass.range_constexpr(num_cols):
                acc_O_mn[r, c] = Float32(0.0) if empty else acc_O_mn[r, c] * inv
                if const_expr(self.merge_prev):
                    o_prev = Float32(mPrevO[qt * BLOCK + tOcO_mn[r, c][0], tOcO_mn[r, c][1], h, b])
                    acc_O_mn[r, c] = acc_O_mn[r, c] * a_this + o_prev * a_prev
                if const_expr(self.fuse_gate and not self.store_out_s):
                    # out = out_s + gate * out_c[q tile] (fp32, rounded once)
                    oc_c = self.out_c_at(mOutC, oc, tOcO_mn, c, qt, h, b)
                    acc_O_mn[r, c] = acc_O_mn[r, c] + Float32(rG_mn[r, c]) * oc_c
            row = qt * BLOCK + tOcO_mn[r, 0][0]
            if tOcO_mn[r, 0][1] == 0 and row < seqlen_q:
                mLSE[row, h, b] = lse
        rOs = acc_O  # (store_out_s) out_s rounded, before the gate is added
        if const_expr(self.store_out_s):
            rOs = cute.make_rmem_tensor_like(acc_O, dt)
            rOs.store(acc_O.load().to(dt))
            for r in cutlass.range_constexpr(num_rows):
                for c in cutlass.range_constexpr(num_cols):
                    oc_c = self.out_c_at(mOutC, oc, tOcO_mn, c, qt, h, b)
                    acc_O_mn[r, c] = acc_O_mn[r, c] + Float32(rG_mn[r, c]) * oc_c
        rO = cute.make_rmem_tensor_like(acc_O, dt)
        rO.store(acc_O.load().to(dt))
        # every warp's wgmma reads of Q are done before Q's buffer takes O (and, with the gate,
        # every thread's gate reads before its K slot takes out_s)
        cute.arch.barrier()
        sO = sQ
        if const_expr(self.stmatrix_epilogue):  # stmatrix: 4 8x8 matrices per instruction
            st_o = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(num_matrices=4), dt)
            thr_st = cute.make_tiled_copy_C(st_o, mma_pv).get_slice(tidx)
            cute.copy(thr_st, thr_st.retile(rO), thr_st.partition_D(sO))
        else:
            cute.copy(thr_copy_O, thr_copy_O.retile(rO), thr_copy_O.partition_D(sO))
        if const_expr(self.store_out_s):
            cute.copy(thr_copy_O, thr_copy_O.retile(rOs), thr_copy_O.partition_D(sK[None, None, g_slot]))
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier()
        if warp_idx == 0:
            tOsO, tOgO = cpasync.tma_partition(tma_atom_O, 0, unit, cute.group_modes(sO, 0, 2),
                                               cute.group_modes(gO, 0, 2))
            cute.copy(tma_atom_O, tOsO, tOgO, **tma_policy(L2_EVICT_FIRST if self.l2_hints else 0))
            if const_expr(self.store_out_s):
                gOs = cute.local_tile(mOs[None, None, h, b], (BLOCK, d), (qt, 0))
                tSsS, tSgS = cpasync.tma_partition(tma_atom_Os, 0, unit, cute.group_modes(sK, 0, 2),
                                                   cute.group_modes(gOs, 0, 2))
                cute.copy(tma_atom_Os, tSsS[None, g_slot], tSgS, **tma_policy(L2_EVICT_FIRST if self.l2_hints else 0))
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def out_c_at(self, mOutC, oc, tOcO_mn, c: cutlass.Constexpr, qt, h, b) -> Float32:
        """out_c of this thread's column ``c`` (the q tile's row): held in ``oc``, or, with
        ``merge_prev`` (whose epilogue has no registers to hold them), read here."""
        if const_expr(self.merge_prev):
            return Float32(mOutC[tOcO_mn[0, c][1], qt, h, b])
        return oc[c]

    @cute.jit
    def walk_pos(self, x: Int32, s0: Int32, count: Int32) -> Int32:
        """The list position of the walk's step ``x`` (``x`` itself unless ``rotate_walk``: ``x + s0`` wrapped
        at ``count``)."""
        p = x
        if const_expr(self.rotate_walk > 0):
            p = x + s0
            if p >= count:
                p = p - count
        return p

    @cute.jit
    def prefetch_tile(self, tma_atom_K: cute.CopyAtom, tKgK: cute.Tensor, tma_atom_V: cute.CopyAtom, tVgV: cute.Tensor,
                      n: Int32):
        """(warp 0, ``tile_prefetch``) kv tile ``n``'s K and V boxes asked into the L2: one tensor prefetch a box
        (two a tile), no barrier, no shared memory."""
        cute.prefetch(tma_atom_K, tKgK[None, n])
        cute.prefetch(tma_atom_V, tVgV[None, n])

    @cute.jit
    def load_tile(self, tma_atom: cute.CopyAtom, tXgX: cute.Tensor, tXsX: cute.Tensor, bar, tx_bytes: cutlass.Constexpr,
                  slot: Int32, n: Int32):
        """(warp 0) kv tile ``n`` into ring slot ``slot``, on that slot's transaction barrier."""
        bar.arrive_and_expect_tx(slot, tx_bytes)
        if const_expr(self.probe_window > 0):
            n = n % Int32(self.probe_window)
        cute.copy(tma_atom, tXgX[None, n], tXsX[None, slot], tma_bar_ptr=bar.get_barrier(slot),
                  **tma_policy(L2_EVICT_LAST if self.l2_hints else 0))

    @cute.jit
    def load_kv(self, tma_atom, tXgX, tXsX, pieces16, bar, tx_bytes: cutlass.Constexpr, slot: Int32, n: Int32,
                keys: Int32, is_v: cutlass.Constexpr):
        """(warp 0, ``partial_loads``) K (or V, ``is_v``) tile ``n`` into ``slot``: whole when full,
        else only the 16-key pieces that hold a valid key, so a partial tile's padding never comes
        through the L2. The rest of a K slot keeps stale rows, which the key mask selects away; the
        P V steps past ``ceil16(keys)`` are not issued, so V's are never read. ``pieces16``: the
        piece atom and its partitions, K (.., key pieces, column halves[, slot]), V (.., column
        halves, key pieces[, slot])."""
        if keys == BLOCK:
            self.load_tile(tma_atom, tXgX, tXsX, bar, tx_bytes, slot, n)
        else:
            per_tile = BLOCK // PV_STEP
            pieces = (keys + PV_STEP - 1) // PV_STEP
            bar.arrive_and_expect_tx(slot, pieces * (tx_bytes // per_tile))
            for c in cutlass.range_constexpr(per_tile):
                if c < pieces:
                    self.load_piece(pieces16, bar, slot, n * per_tile + c, c, is_v)

    @cute.jit
    def load_piece(self, pieces16, bar, slot: Int32, piece: Int32, place: cutlass.Constexpr,
                   is_v: cutlass.Constexpr):
        """(warp 0) 16-key piece ``piece`` of the sequence (all of its columns, 64 a load) into piece
        ``place`` of ring slot ``slot``, on the slot's barrier (the caller expects its bytes)."""
        atom, tg, ts = pieces16
        for hh in cutlass.range_constexpr(cute.size(ts, mode=[1 if const_expr(is_v) else 2])):
            if const_expr(is_v):
                src, dst = tg[None, hh, piece], ts[None, hh, place, slot]
            else:
                src, dst = tg[None, piece, hh], ts[None, place, hh, slot]
            cute.copy(atom, src, dst, tma_bar_ptr=bar.get_barrier(slot))

    @cute.jit
    def step_keys(self, st: cute.Tensor) -> Int32:
        """(``packed_steps``) The leading keys of a step's slot that its P V reads: 64 for a whole tile,
        else 16 per used piece (the packer fills a step's pieces from the first)."""
        used = Int32(0)
        for c in cutlass.range_constexpr(STEP_WORDS):
            used = used + (Int32(1) if (st[c] & STEP_KEYS_MASK) > 0 else Int32(0))
        return Int32(BLOCK) if (st[0] & STEP_WHOLE) != 0 else used * PV_STEP

    @cute.jit
    def step_ragged(self, st: cute.Tensor) -> cutlass.Boolean:
        """(``packed_steps``) Whether a used piece of the step has fewer than 16 valid keys (its K rows
        past them are masked, its V rows zeroed). A whole tile's word 0 holds 16, its others 0."""
        used = Int32(0)
        total = Int32(0)
        for c in cutlass.range_constexpr(STEP_WORDS):
            keys = st[c] & STEP_KEYS_MASK
            used = used + (Int32(1) if keys > 0 else Int32(0))
            total = total + keys
        return total != used * PV_STEP

    @cute.jit
    def load_step(self, tma_atom, tXgX, tXsX, pieces16, bar, tx_bytes: cutlass.Constexpr, slot: Int32,
                  st: cute.Tensor, is_v: cutlass.Constexpr):
        """(warp 0, ``packed_steps``) K (or V, ``is_v``) of one step into ``slot``: a whole tile by one
        load, else each used piece (16 keys, from any tile) by its own loads into its place in the
        slot (``pieces16`` as :meth:`load_kv`'s). The slot's unused pieces keep stale rows: their keys
        are masked (K) and their P V steps not issued (V)."""
        w0 = st[0]
        if (w0 & STEP_WHOLE) != 0:
            self.load_tile(tma_atom, tXgX, tXsX, bar, tx_bytes, slot, w0 >> (STEP_PIECE_SHIFT + 2))
        else:
            per_tile = BLOCK // PV_STEP
            used = Int32(0)
            for c in cutlass.range_constexpr(STEP_WORDS):
                used = used + (Int32(1) if (st[c] & STEP_KEYS_MASK) > 0 else Int32(0))
            bar.arrive_and_expect_tx(slot, used * (tx_bytes // per_tile))
            for c in cutlass.range_constexpr(STEP_WORDS):
                w = st[c]
                if (w & STEP_KEYS_MASK) > 0:
                    self.load_piece(pieces16, bar, slot, w >> STEP_PIECE_SHIFT, c, is_v)

    @cute.jit
    def zero_v_pieces(self, sV: cute.Tensor, slot: Int32, st: cute.Tensor, tidx: Int32):
        """(``packed_steps``) V rows of ring slot ``slot`` past each used piece's valid keys -> 0 (the
        padding rows of a ragged piece, which the P V step of its piece reads), as
        :meth:`zero_v_padding` does for one tile. ``keys_per_pass`` (8 or 16) divides a piece, so
        pass ``i`` stays in one piece."""
        store, zero, sV_slot, c, k0, keys_per_pass = self.v_row_stores(sV, slot, tidx)
        for i in cutlass.range_constexpr(BLOCK // keys_per_pass):
            p = i * keys_per_pass // PV_STEP
            keys = st[p] & STEP_KEYS_MASK
            off = k0 + (i * keys_per_pass) % PV_STEP
            if keys > 0 and off >= keys:
                cute.copy(store, zero, cute.local_tile(sV_slot, (V_ZERO_VEC, 1), (c, k0 + i * keys_per_pass)))
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier()

    @cute.jit
    def load_gate(self, tma_atom_G, mG: cute.Tensor, sK: cute.Tensor, bar_k, tx_bytes: cutlass.Constexpr,
                  slot: Int32, qt: Int32, h: Int32, b: Int32):
        """(warp 0) The query tile's gate rows into K slot ``slot``, on that slot's barrier."""
        gG = cute.local_tile(mG[None, None, h, b], (BLOCK, self.head_dim), (qt, 0))
        tGsG, tGgG = cpasync.tma_partition(tma_atom_G, 0, cute.make_layout(1), cute.group_modes(sK, 0, 2),
                                           cute.group_modes(gG, 0, 2))
        bar_k.arrive_and_expect_tx(slot, tx_bytes)
        cute.copy(tma_atom_G, tGgG, tGsG[None, slot], tma_bar_ptr=bar_k.get_barrier(slot))

    @cute.jit
    def gemm(self, tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
             zero_init: cutlass.Constexpr[bool]):
        """One wgmma group over the k-blocks (issued and committed; the caller waits)."""
        wgmma_gemm(tiled_mma, acc, tCrA, tCrB, zero_init)

    @cute.jit
    def gemm_s(self, mma_ss: cute.TiledMma, mma_rs: cute.TiledMma, acc: cute.Tensor, tSrQ: cute.Tensor,
               tSrQr: cute.Tensor, tSrK: cute.Tensor):
        """S = Q K^T as one wgmma group: the k-steps of Q's first ``q_regs`` columns with Q from
        registers (RS), the rest with Q from shared memory (SS); K from shared memory throughout."""
        if const_expr(self.q_regs == 0):
            self.gemm(mma_ss, acc, tSrQ, tSrK, zero_init=True)
        else:
            warpgroup.fence()
            rs = cute.make_mma_atom(mma_rs.op)
            rs.set(warpgroup.Field.ACCUMULATE, False)
            for k in cutlass.range_constexpr(self.q_regs // PV_STEP):
                cute.gemm(rs, acc, tSrQr[None, None, k], tSrK[None, None, k], acc)
                rs.set(warpgroup.Field.ACCUMULATE, True)
            if const_expr(self.q_regs < self.head_dim):
                ss = cute.make_mma_atom(mma_ss.op)
                ss.set(warpgroup.Field.ACCUMULATE, True)
                for k in cutlass.range_constexpr(self.q_regs // PV_STEP, self.head_dim // PV_STEP):
                    cute.gemm(ss, acc, tSrQ[None, None, k], tSrK[None, None, k], acc)
            warpgroup.commit_group()

    @cute.jit
    def gemm_pv(self, tiled_mma: cute.TiledMma, acc: cute.Tensor, rP: cute.Tensor, tOrV: cute.Tensor, keys: Int32):
        """O += P V over the k-steps (16 keys each) that hold a valid key. A full tile issues the
        four k-steps as one group; a partial one branches per k-step (uniform over the
        warpgroup), which ptxas serialises, so only partial tiles pay for it."""
        if keys == BLOCK:
            self.gemm(tiled_mma, acc, rP, tOrV, zero_init=False)
        else:
            self.gemm_partial(tiled_mma, acc, rP, tOrV, keys)

    @cute.jit
    def gemm_partial(self, tiled_mma: cute.TiledMma, acc: cute.Tensor, rP: cute.Tensor, tOrV: cute.Tensor,
                     keys: Int32):
        warpgroup.fence()
        atom = cute.make_mma_atom(tiled_mma.op)
        atom.set(warpgroup.Field.ACCUMULATE, True)
        for k in cutlass.range_constexpr(cute.size(rP.shape[2])):
            if k * PV_STEP < keys:
                cute.gemm(atom, acc, rP[None, None, k], tOrV[None, None, k], acc)
        warpgroup.commit_group()

    @cute.jit
    def load_q_regs(self, tiled_mma: cute.TiledMma, sQ: cute.Tensor, tSrQ: cute.Tensor, tidx: Int32):
        """(``q_regs``) Q, the A operand of S = Q K^T as an RS wgmma, from its shared-memory tile into
        its register fragment by ldmatrix, once: the per-step S then reads only K from shared memory."""
        atom = cute.make_copy_atom(cute.nvgpu.warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4),
                                   _CUTE_DTYPES[self.dtype_name])
        thr_copy = cute.make_tiled_copy_A(atom, tiled_mma).get_slice(tidx)
        src, dst = thr_copy.partition_S(sQ), thr_copy.retile(tSrQ)
        for k in cutlass.range_constexpr(self.q_regs // PV_STEP):  # one ldmatrix.x4 per k-step
            cute.copy(thr_copy, src[None, None, k], dst[None, None, k])

    @cute.jit
    def rescale_o(self, acc_O_mn: cute.Tensor, alpha: cute.Tensor, num_rows: cutlass.Constexpr):
        """O's rows times their ratio; with ``lazy_rescale`` a row whose ratio is exactly 1 (its
        reference max kept) is skipped (x * 1 == x: the same result without the multiplies)."""
        for r in cutlass.range_constexpr(num_rows):
            if const_expr(self.lazy_rescale):
                if alpha[r] != Float32(1.0):
                    acc_O_mn[r, None].store(acc_O_mn[r, None].load() * alpha[r])
            else:
                acc_O_mn[r, None].store(acc_O_mn[r, None].load() * alpha[r])

    @cute.jit
    def softmax(self, acc_S: cute.Tensor, acc_S_mn: cute.Tensor, tScS: cute.Tensor, keys: Int32,
                row_max: cute.Tensor, row_sum: cute.Tensor, alpha: cute.Tensor, neg_scaled: cute.Tensor,
                scale_log2: Float32, st: cute.Tensor = None, ragged=None):
        """Mask keys past ``keys`` (a select), then the online softmax of S in place (P there);
        ``alpha`` gets each row's ratio for the next O rescale. A row spans 4 lanes. Returns whether
        this warp's rows may have moved (``lazy_vote``: False means every ``alpha`` is 1).
        (``packed_steps``) ``st``: the step's words, ``ragged``: whether a piece's keys are masked."""
        full = cute.size(acc_S_mn, mode=[1])
        st = st if const_expr(self.packed_steps) else None
        args = (acc_S_mn, tScS, keys, row_max, row_sum, alpha, neg_scaled, scale_log2)
        if const_expr(not self.narrow_tiles):
            return self.softmax_columns(*args, full, st, ragged)
        # narrow_tiles: a thread's column c of a row holds key 8 (c // 2) + 2 (lane % 4) + c % 2, so
        # the first quarter / half of its columns hold keys 0-15 / 0-31; a tile of at most 16 / 32
        # keys runs the softmax on those only (its P V reads no other column: the k-steps past
        # ceil16(keys) are not issued). The branch is uniform over the warpgroup (one tile).
        moved = cutlass.Boolean(False)
        if keys > BLOCK // 2:
            moved = self.softmax_columns(*args, full, st, ragged)
        elif keys > BLOCK // 4:
            moved = self.softmax_columns(*args, full // 2, st, ragged)
        else:
            moved = self.softmax_columns(*args, full // 4, st, ragged)
        return moved

    @cute.jit
    def softmax_columns(self, acc_S_mn: cute.Tensor, tScS: cute.Tensor, keys: Int32, row_max: cute.Tensor,
                        row_sum: cute.Tensor, alpha: cute.Tensor, neg_scaled: cute.Tensor, scale_log2: Float32,
                        cols: cutlass.Constexpr, st: cute.Tensor = None, ragged=None):
        """The softmax on a thread's first ``cols`` columns of each row (all of them, or with
        ``narrow_tiles`` the half / quarter holding keys below 32 / 16 when the tile has no other),
        keys past ``keys`` masked, the other columns' P set to 0."""
        full = cute.size(acc_S_mn, mode=[1])
        if const_expr(st is not None):  # (packed_steps) a ragged piece: each piece's own count
            if ragged:
                piece_keys = cute.make_rmem_tensor((STEP_WORDS,), Int32)
                for c in cutlass.range_constexpr(STEP_WORDS):
                    piece_keys[c] = st[c] & STEP_KEYS_MASK
                mask_keys_pieces_mn(acc_S_mn, tScS, piece_keys, piece=PV_STEP, cols=cols)
            elif keys < BLOCK * cols // full:
                mask_keys_mn(acc_S_mn, tScS, keys, cols=cols)
        elif keys < BLOCK * cols // full:
            mask_keys_mn(acc_S_mn, tScS, keys, cols=cols)
        moved = online_softmax_rows(acc_S_mn, row_max, row_sum, alpha, scale_log2, threads_in_group=4,
                                    rescale_threshold=RESCALE_THRESHOLD if const_expr(self.lazy_rescale) else None,
                                    vote_kept=self.lazy_vote, neg_scaled_state=neg_scaled, cols=cols)
        if const_expr(cols < full):
            self.zero_columns(acc_S_mn, cols)
        return moved

    @cute.jit
    def zero_columns(self, s_mn: cute.Tensor, start: cutlass.Constexpr):
        """(``narrow_tiles``) P of the columns from ``start`` on -> 0 (keys the tile does not have):
        every branch of the softmax then defines every register of S / P (a branch that leaves some
        untouched makes ptxas serialise the kernel's wgmmas, C7515)."""
        for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
            for c in cutlass.range_constexpr(start, cute.size(s_mn, mode=[1])):
                s_mn[r, c] = Float32(0.0)
