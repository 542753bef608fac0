"""Our sm_90a 64-token kernels: the forward (:mod:`fastvideo_cute.adapters.cute_sm90_fwd64`: wgmma +
TMA, one warpgroup, three CTAs per SM), with the VSA gate fusable into its epilogue
(:meth:`Sm90Backend.forward_gated`), and the warp-specialized backward
(:mod:`fastvideo_cute.adapters.cute_sm90_bwd64`, ``main="ws"``: a producer warp, a dQ store warp and
two MMA warpgroups; partial kv tiles masked in the kernel, no padding-zeroed copy).

What it serves: the forward direction of calls on sm_90 with 64-, 128- or 256-token blocks (a
128/256-token call runs as the 64-token call that covers it: each block's lists split into 64 x
64 tiles by :func:`fastvideo_cute.metadata.split_q2k`, one Triton launch, tiles without a valid
key left out, so a partial block costs only the tiles its keys touch), fp16/bf16, head_dim
64/128, as many query heads as kv heads (``CallInfo.heads`` is both), ``q_len`` a multiple of 64,
within the kernel's launch limits, with the CuTe DSL installed. The backward serves fewer calls
(``support()`` of a call with ``need_grad`` checks both): 64-token blocks, bf16, head_dim 128,
``q_len == kv_len`` with an even number of blocks (its preprocess works on 128-token pairs),
BHSD or BSHD (BSHD tensors are transposed to BHSD copies around it). The router asks a training
call's forward direction alone as ``need_grad=False, need_lse=True``, so this forward may be paired
with another backend's backward, which runs from the LSE returned here (natural log, fp32
``[B, H, S_q]``, ``-inf`` for a row without a key), and this backward with another forward. Both
mask K/V padding themselves (``zeroes_kv_padding = False``: no padding-zeroed copy is made).

Where the router sends it (``fastvideo_cute.routes``):
- the 64-token forward classes of the route table on sm_90, full and partial tiles, where it was
  measured fastest (``benchmarks/results/vsa_h200_table5_{synthetic,grid}.json``: 7.29 vs 7.55 ms
  for cuDNN over the full-tile cases, 2.12 vs 2.19 ms on the Wan-1.3B grid, where cuDNN's route
  pays V's padding-zeroed copy);
- the 128/256-token partial-tile forward classes (same files: 1.83 vs 2.14 ms for FA4 on the
  128-token Wan grid, 1.87 vs 1.99 ms on the 256-token one); FA4 keeps the full-tile ones (its
  128-wide tiles: 6.22 vs 7.23 ms);
- both 64-token backward classes (route table v10, ``benchmarks/results/vsa_h200_table10_bwd64_{synthetic,grid}.json``:
  23.41 vs 23.70 ms for cuDNN's route over S=32768 + 65536, 6.81 vs 7.00 ms on the Wan-1.3B grid),
  in the configuration ``_BWD_WS_CONFIG`` (the warp-specialized kernel with ``flat_dq``; q groups of
  512 blocks from 768 blocks on, ``adapters/cute_sm90_bwd64_ws``, their dK/dV parts summed by the
  group that finishes last, ``ticket_dkv``); calls whose q2k lists arrive as lists, top-k wide (every
  ``video_sparse_attn`` training call), and (``_SPLIT_MAPS``)
  calls given a bool map whose training forward ran here (it starts reading the map's pair counts,
  ``fastvideo_cute.pair_counts``), run the split chain instead (``_split_plan``:
  ``adapters/cute_sm90_bwd64_split``, 1.07-1.19x cuDNN's kernel on an H100,
  ``benchmarks/results/bwd64_split_h100_s26.json``);
- ``video_sparse_attn`` inference calls with a gate (``select_vsa_route_name``), where the fused
  epilogue also saves the separate gate pass (1.01x / 1.03x / 1.05x the cuDNN path at S=32768 /
  65536 / the Wan-1.3B grid, ``benchmarks/results/fwd64_sm90_h200_v5.json``; 128/256-token tiles:
  ``vsa_e2e_h200_v17_tiles.json``).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from ..call import CallInfo
from ..metadata import BlockSparsity, split_q2k
from ..pair_counts import pair_counts, start_pair_counts
from ..validation import has_partial_blocks
from .base import CompileKey, Verdict, basic_key, module_installed

__all__ = ["Sm90Backend"]

_BLOCK = 64
# The kernel configuration (``BlockSparseFwd64Sm90``'s keyword arguments) every call of this
# backend compiles; None is the kernel's default. A setting for A/B runs (benchmarks/ab_vsa_glue.py
# ``sm90-q64`` etc.), not an API: the warm-up compiles the default.
_FWD_VARIANT = None
# Calls with partial kv tiles (sizes given) run the forward's ``packed_steps`` (the partial tiles'
# 16-key pieces four to a step: ~17 % fewer steps on the Wan-1.3B grid's top-k lists). Measured on the
# H100 (2026-12-05): exact (tests/logs/h100_2026-12-05_fwd64_packed_06e753b.log, 49 passed), 2.15 vs
# 2.38 ms for the default build on the Wan-1.3B grid (1.12x cuDNN's blk64 forward instead of 1.01x,
# benchmarks/results/fwd64_sm90_h100_packed.json), 1.92 vs 2.57 ms for video_sparse_attn's whole forward
# there (ab_vsa_glue_h100_packed_fwd.json); full-tile calls keep the default build (it was 7.5 % / 3.6 %
# slower packed at 32,768 / 65,536 tokens, where the steps are the same). The warm-up compiles it
# through the ragged workloads' calls (their compile key says ``steps=packed``).
_PACK_PARTIAL = True
# kv ranges of the forward (sm90_fwd64's kv_splits): "auto" (adapters.cute_sm90_fwd64.auto_kv_splits:
# 2-4 where one head's K/V outgrow 0.6 of the L2) or an int (benchmarks/ab_vsa_glue.py sets 1-4)
_KV_SPLITS = "auto"
_BLOCKS = (64, 128, 256)  # 128/256 run as the 64-token tiles that cover them (split_q2k)
_DTYPES = (torch.float16, torch.bfloat16)
_GRID_MAX = 65535  # gridDim.y (heads) and gridDim.z (batch): the launch grid is (Qb, H, B)
_INT32_MAX = 2**31 - 1
# The backward's main kernel configuration (``BlockSparseBwd64Sm90Ws``'s keyword arguments):
# narrow_dq, dQ's k-steps of a partial kv tile cut at ceil16(size) (exact on the H200 and 1.5 %
# faster on the Wan-1.3B grid, benchmarks/results/bwd64_sm90_h200_v12.json; full tiles unchanged);
# p_stages=2, P^T handed over through two buffers, so WG1 writes step t+1's while WG2 reads step t's
# (2 % faster on the grid and at S=32768, 65,536 within the spread: bwd64_sm90_h200_v14.json, _v15.json);
# flat_dq, dQ staged in register order (conflict-free) and added by one bulk reduce-add into
# register-ordered dq_accum tiles (5-7 % faster: 4.61 vs 4.90 ms at S=32768, 18.80 vs 20.23 ms at
# 65,536, 6.66 vs 7.00 ms on the Wan-1.3B grid, bwd64_sm90_h200_v17.json); zero_pad_v, dS^T without
# the padded-key select (V's padded rows zeroed in shared memory; neutral), and ticket_dkv, a kv block's
# q-group parts of dK/dV summed by the group that finishes last (no fp32 accumulators, no convert pass:
# 1.3-1.4 % faster where q groups run, 19.49 vs 19.80 ms at 65,536 and 7.51 vs 7.60 ms on the grid's two
# H100 groups; one group unchanged; bwd64_sm90_h100_zv_ticket.json, 2026-12-06); pair_stores, the bf16 dK/dV
# rows by 32-bit stores of adjacent columns instead of 2-byte ones (3.5 % faster at 32,768 tokens, 3.8 % on
# the grid, 1.6 % at 65,536 on the H100: bwd64_sm90_h100_pairs.json, _pairs2.json), and in its place tma_dkv,
# each warp's bf16 rows by stmatrix and two TMA stores (H100, same run: 1.104x / 1.078x cuDNN's blk64 backward
# at 32,768 tokens / on the grid against pair_stores' 1.082x / 1.055x; 1.039x against 1.034x at 65,536 over
# seven rounds: bwd64_sm90_h100_tma.json, _tma65k.json)
_BWD_WS_CONFIG = {"narrow_dq": True, "p_stages": 2, "flat_dq": True, "zero_pad_v": True, "ticket_dkv": True,
                  "tma_dkv": True}


# The split backward (``adapters/cute_sm90_bwd64_split``: the main kernel stores bf16 dS tiles, a
# q-owned kernel sums dQ from them; no fp32 dQ reduce-add) where its dS workspace stays at most
# _SPLIT_MAX_DENSITY of the dense one (``_split_plan``). Measured on an H100 (2026-12-07, the working
# tree of 9dc571a with the split on): exact (tests/logs/h100_2026-12-07_s26_split_routed.log: 20 passed,
# the routed chains through the API among them) and 1.194x / 1.122x / 1.069x cuDNN's blk64 backward at
# 32K / the Wan grid / 64K with top-k-wide lists against the reduce-add chain's 1.107x / 1.080x / 1.000x
# in the same rounds (benchmarks/results/bwd64_split_h100_s26.json).
_SPLIT_BWD = True
_SPLIT_MAX_DENSITY = 0.5
# Bool maps split too, sized by the pair counts their training forward started reading
# (``fastvideo_cute.pair_counts``: no sync in the backward); off, maps keep the reduce-add chain. On
# since an H100 ran this path on cf144a0 (2026-12-07): the split suite and the chains through the API
# (maps, per-head maps and batch-shared maps on the split, sized by their counts, each beside the
# reduce-add chain: dK/dV bitwise equal) passed (tests/logs/h100_2026-12-07_s28_split_maps_cf144a0.log),
# and the map route's backward went from the reduce-add chain's rate to the lists' (table v35 there).
_SPLIT_MAPS = True


def _split_plan(sparsity: BlockSparsity) -> Tuple[bool, Optional[List[int]]]:
    """``(split, seq_pairs)``: whether the backward runs the split chain, and the per-(batch, head)
    pair counts that size its workspace (None: the lists' width does).

    - Lists that arrived as lists (VSA's top-k, ``[B, H, Qb, k]``, or a caller's, sorted by the API)
      bound the workspace by their width, no sync: split when it is at most ``_SPLIT_MAX_DENSITY`` of
      the kv blocks.
    - A bool map's lists (``map_to_index``) are as wide as the kv blocks, so its counts are used: those
      this map's forward started reading (``pair_counts``). Reading them only here would be a device
      sync a call, which exposed the backward's host work (2026-12-07, H100: 5.30 ms against cuDNN's
      5.39 at 32K, benchmarks/results/vsa_h100_default_synthetic_v33.json, where the split on lists
      takes 4.50). Split when no sequence has more than ``_SPLIT_MAX_DENSITY`` of its dense pairs.
      A map without counts (its forward ran elsewhere or without grad, or a CUDA graph is being
      captured) keeps the reduce-add chain."""
    if not _SPLIT_BWD:
        return False, None
    if sparsity.has_lists:
        return sparsity.q2k()[0].shape[-1] <= _SPLIT_MAX_DENSITY * sparsity.num_kv_blocks, None
    block_map = sparsity.block_map()
    if not _SPLIT_MAPS or (block_map.is_cuda and torch.cuda.is_current_stream_capturing()):
        return False, None
    seq_pairs = pair_counts(block_map)
    if seq_pairs is None:
        return False, None
    dense = block_map.shape[-2] * block_map.shape[-1]
    return max(seq_pairs, default=0) <= _SPLIT_MAX_DENSITY * dense, seq_pairs


def _backward_problem(call: CallInfo) -> Optional[str]:
    """Why the warp-specialized backward cannot serve this call (None: it can); static facts only."""
    # the kernel's own limit, imported here: `import fastvideo_cute` loads no kernel module
    from ..kernels.cute.block_sparse_bwd64.limits import HEAD_DIM as _BWD_HEAD_DIM

    if call.block_size != _BLOCK:
        return f"the backward serves 64-token blocks only, got {call.block_size}"
    if call.dtype != torch.bfloat16:
        return f"the backward is bfloat16 only, got {call.dtype}"
    if call.head_dim != _BWD_HEAD_DIM:
        return f"the backward is head_dim {_BWD_HEAD_DIM} only, got {call.head_dim}"
    if call.q_len != call.kv_len:
        return f"the backward needs q_len == kv_len, got {call.q_len} and {call.kv_len}"
    blocks = call.kv_len // _BLOCK
    if blocks < 2 or blocks % 2:
        return f"the backward needs an even number (>= 2) of 64-token blocks, got {blocks}"
    if call.batch * call.heads * call.q_len * call.head_dim > _INT32_MAX:
        return f"the backward addresses B*H*S*head_dim with int32 offsets (<= {_INT32_MAX})"
    return None


def _ready(name: str, t: torch.Tensor) -> torch.Tensor:
    """``t``, or a fresh contiguous copy when its base or strides do not suit TMA (a slice of a
    packed tensor may not; support() cannot see strides)."""
    from ..adapters.cute_sm90_fwd64 import tma_problem

    return t if tma_problem(name, t) is None else t.clone(memory_format=torch.contiguous_format)


class Sm90Backend:
    name = "sm90"
    head_dims = (64, 128)
    #: it masks K/V padding in the kernel (NaN/Inf padding is fine): no padding-zeroed copy
    zeroes_kv_padding = False
    #: ``forward_gated`` returns ``out_s + gate * out_c`` from the kernel's epilogue
    fuses_gate = True
    #: compute capabilities on which its GPU tests have passed (the H200)
    VERIFIED = ((9, 0),)

    def verified_on(self, arch) -> bool:
        return arch is not None and tuple(arch) in self.VERIFIED

    def support(self, call: CallInfo) -> Verdict:
        if call.device_type != "cuda" or call.arch is None:
            return False, "needs CUDA tensors"
        if tuple(call.arch) != (9, 0):
            return False, f"the wgmma 64-token forward is sm_90a only, not sm_{call.arch[0]}{call.arch[1]}"
        if call.block_size not in _BLOCKS:
            return False, f"block_size one of {_BLOCKS}, got {call.block_size}"
        if call.dtype not in _DTYPES:
            return False, f"float16 or bfloat16 only, got {call.dtype}"
        if call.head_dim not in self.head_dims:
            return False, f"head_dim one of {self.head_dims}, got {call.head_dim}"
        if call.q_len % _BLOCK:
            return False, f"q_len {call.q_len} is not a multiple of {_BLOCK}"
        qb, kvb = call.q_len // _BLOCK, max(call.kv_len // _BLOCK, 1)
        if (call.batch > _GRID_MAX or call.heads > _GRID_MAX or call.batch * call.heads * call.q_len > _INT32_MAX
                or call.batch * call.heads * qb * kvb > _INT32_MAX):
            return False, (f"exceeds the kernel's launch limits: batch and heads <= {_GRID_MAX}, "
                           f"batch*heads*q_len and batch*heads*Qb*KVb <= {_INT32_MAX}")
        if call.need_grad:
            problem = _backward_problem(call)
            if problem is not None:
                return False, problem
        if not module_installed("cutlass"):
            return False, "the CuTe DSL is not installed (pip install 'fastvideo-cute[cute]')"
        return True, "ok"

    def compile_keys(self, call: CallInfo, gated=False) -> Dict[str, CompileKey]:
        """``gated``: True, the fused-gate epilogue variant (``forward_gated``); ``"train"``, the one
        that also stores out_s (``forward_gated(out_s=)``): other compiled kernels."""
        from ..kernels.cute.block_sparse_bwd64 import SM90_DQ_REGISTRY_NAME, SM90_WS_REGISTRY_NAME
        from ..kernels.cute.block_sparse_fwd64 import SM90_REGISTRY_NAME

        gate = "fused+out_s" if gated == "train" else ("fused" if gated else "none")
        ragged = not call.kv_all_full
        detail = (("kernel", SM90_REGISTRY_NAME), ("tile", "64x64"), ("target", "sm_90a"),
                  ("ragged", str(ragged)), ("gate", gate),
                  ("steps", "packed" if ragged and _PACK_PARTIAL else "lists"))
        keys = {"fwd": basic_key(self.name, call, "fwd", _BLOCK, detail)}
        if call.need_grad:
            config = ",".join(f"{k}={v}" for k, v in sorted(_BWD_WS_CONFIG.items()))
            keys["bwd"] = basic_key(self.name, call, "bwd", _BLOCK, (
                ("kernel", SM90_WS_REGISTRY_NAME), ("tile", "64x64"), ("target", "sm_90a"), ("config", config),
                # the split chain (``_split_plan``: per call, from the sparsity): the main kernel with
                # ds_out and the dQ kernel
                ("split", f"ds_out+{SM90_DQ_REGISTRY_NAME}" if _SPLIT_BWD else "off")))
        return keys

    def _run(self, q, k, v, sparsity, kv_block_sizes, block_size: int, bshd: bool, sm_scale: float,
             gate: Optional[torch.Tensor] = None, out_c: Optional[torch.Tensor] = None,
             out: Optional[torch.Tensor] = None, out_s: Optional[torch.Tensor] = None):
        from ..adapters.cute_sm90_fwd64 import auto_kv_splits, sm90_fwd64, sm90_fwd64_problems

        if block_size not in _BLOCKS:
            raise RuntimeError(f"sm90 backend: block_size one of {_BLOCKS}, got {block_size}")
        q, k, v = _ready("q", q), _ready("k", k), _ready("v", v)
        problem = sm90_fwd64_problems(q, k, v, bshd=bshd)
        if problem is not None:
            raise RuntimeError(f"sm90 backend cannot serve this call: {problem}")
        if gate is not None:
            gate = _ready("gate", gate)
            if out_c.dtype != q.dtype or out_c.stride(-1) != 1 or out_c.data_ptr() % 16:
                out_c = out_c.to(q.dtype).clone(memory_format=torch.contiguous_format)
        q2k_idx, q2k_num = BlockSparsity.of(sparsity).q2k()
        # No sizes when every kv block is full (from the range check's record; unknown counts as
        # partial): the kernel variant without the per-block masking.
        sizes = kv_block_sizes if has_partial_blocks(kv_block_sizes, block_size) else None
        if block_size != _BLOCK:  # the 64-token tiles that cover the blocks
            ratio = block_size // _BLOCK
            kv_len = k.shape[1] if bshd else k.shape[2]
            q2k_idx, q2k_num, sizes = split_q2k(q2k_idx, q2k_num, sizes, ratio, kv_len)
            if out_c is not None:  # one out_c row per 64-row tile
                out_c = out_c.repeat_interleave(ratio, dim=2)
        splits = _KV_SPLITS
        if splits == "auto":
            q_len, kv_len = (q.shape[1], k.shape[1]) if bshd else (q.shape[2], k.shape[2])
            splits = auto_kv_splits(q.device, q_len, kv_len, q.shape[3], q.element_size(), q2k_idx.shape[-1])
        variant = _FWD_VARIANT
        if _PACK_PARTIAL and sizes is not None:
            variant = {**(variant or {}), "packed_steps": True}
        return sm90_fwd64(q, k, v, q2k_idx, q2k_num, sizes, bshd=bshd, softmax_scale=sm_scale, gate=gate,
                          out_c=out_c, out=out, out_s=out_s, variant=variant, kv_splits=splits)

    def forward(self, q, k, v, sparsity, kv_block_sizes, *, block_size: int, bshd: bool, need_backward: bool,
                sm_scale: float, kv_padding_zero: bool = False):
        """``(out, lse)``. ``need_backward``: another backend runs this call's backward (the route
        table may pair this forward with cuDNN's or Triton's backward); the LSE it needs is
        the one returned. A training call given a bool map starts reading the map's pair counts here,
        for the split backward (``_split_plan``)."""
        sp = BlockSparsity.of(sparsity)
        if need_backward and block_size == _BLOCK and _SPLIT_BWD and _SPLIT_MAPS and not sp.has_lists:
            start_pair_counts(sp.block_map(), sp.q2k()[1])
        return self._run(q, k, v, sp, kv_block_sizes, block_size, bshd, sm_scale)

    def forward_gated(self, q, k, v, sparsity, kv_block_sizes, gate, out_c, *, block_size: int, bshd: bool,
                      sm_scale: float, out: Optional[torch.Tensor] = None, out_s: Optional[torch.Tensor] = None):
        """``(out_s + gate * out_c, lse)``: ``gate`` of q's shape, layout and dtype, ``out_c``
        ``[B, H, Qb, D]`` (one row per q block, broadcast over its tokens); the composition in
        fp32, rounded once; the LSE is the sparse branch's. ``out``: written in place (q's shape,
        dtype and layout; e.g. a head slice of the call's output), else allocated. ``out_s`` (like
        ``out``): also receives the sparse branch's output (the training forward; the kernel's
        ``store_out_s``)."""
        return self._run(q, k, v, sparsity, kv_block_sizes, block_size, bshd, sm_scale, gate=gate, out_c=out_c,
                         out=out, out_s=out_s)

    def backward(self, q, k, v, out, dout, lse, sparsity, kv_block_sizes, *, block_size: int, bshd: bool,
                 sm_scale: float, kv_padding_zero: bool = False):
        """``(dq, dk, dv)`` by the warp-specialized chain (preprocess, main, postprocess), from the
        k2q lists of ``sparsity``; ``lse`` as any forward of the contract returns it. Padded keys
        are masked in the kernel (``kv_padding_zero`` changes nothing) and get dk = dv = 0."""
        from ..adapters.cute_sm90_bwd64 import sm90_block_sparse_bwd64

        if block_size != _BLOCK:
            raise RuntimeError(f"sm90 backend: the backward serves 64-token blocks only, got {block_size}")
        sp = BlockSparsity.of(sparsity)
        k2q_idx, k2q_num = sp.k2q()
        bhsd = (lambda x: x.transpose(1, 2).contiguous()) if bshd else (lambda x: x.contiguous())
        args = (bhsd(q), bhsd(k), bhsd(v), bhsd(out), bhsd(dout), lse.contiguous())
        split, seq_pairs = _split_plan(sp)
        if split:
            from ..adapters.cute_sm90_bwd64_split import sm90_block_sparse_bwd64_split

            q2k_idx, q2k_num = sp.q2k()
            grads = sm90_block_sparse_bwd64_split(*args, q2k_idx, q2k_num, k2q_idx, k2q_num, kv_block_sizes,
                                                  sm_scale=sm_scale, seq_pairs=seq_pairs)
        else:
            grads = sm90_block_sparse_bwd64(*args, k2q_idx, k2q_num, kv_block_sizes, sm_scale=sm_scale, main="ws",
                                            ws_config=dict(_BWD_WS_CONFIG))
        if bshd:
            grads = tuple(g.transpose(1, 2).contiguous() for g in grads)
        return tuple(grads)
