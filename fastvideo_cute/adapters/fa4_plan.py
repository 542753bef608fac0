"""FA4 support predicate and per-arch tile plans (pure Python: no FA4 import).

How a VSA call with logical ``block_size`` maps onto FA4's tiles on each arch, exactly (a
physical q tile never spans two logical q blocks, a physical kv tile never spans two logical kv
blocks); the table is in :mod:`fastvideo_cute.adapters.fa4`'s docstring.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

__all__ = ["FA4UnsupportedError", "FA4Plan", "fa4_support", "fa4_fwd_plan", "fa4_bwd_plan", "sm90_bwd_tile_m",
           "SingleQStageSeqlen", "FA4_BLOCK_SIZES", "FA4_HEAD_DIMS", "FA4_DTYPES"]

FA4_BLOCK_SIZES = (64, 128, 256)
FA4_HEAD_DIMS = (64, 128)
FA4_DTYPES = (torch.float16, torch.bfloat16)


class FA4UnsupportedError(ValueError):
    """The FA4 route cannot serve this call exactly (the message says why)."""


class FA4Plan(NamedTuple):
    """How one call maps onto FA4 tiles.

    ``q_sparse``: rows per sparse q block handed to FA4 (``BlockSparseTensorsTorch.block_size[0]``);
    it divides the logical block, so a physical q tile never spans two logical q blocks.
    ``kv_tile``: physical kv tile (``block_size[1]``); logical kv blocks split into
    ``block_size // kv_tile`` tiles with sizes ``clamp(size - kv_tile * i, 0, kv_tile)``.
    ``tile_mn``: forward tile passed to FA4 (None for the backward, whose tile FA4 fixes).
    ``single_q_stage``: sm_100 forward with 128-row sparse q blocks (see ``SingleQStageSeqlen``).
    """

    block_size: int
    q_sparse: int
    kv_tile: int
    tile_mn: Optional[Tuple[int, int]]
    single_q_stage: bool


def _arch_major(arch) -> int:
    if isinstance(arch, int):
        return arch // 10 if arch >= 20 else arch
    return int(arch[0])


def _arch_str(arch) -> str:
    if isinstance(arch, int):
        return f"sm_{arch}"
    return f"sm_{arch[0]}{arch[1]}"


def sm90_bwd_tile_m(head_dim: int, sparse_q: int) -> int:
    # flash-attn-4 4.0.0b36 interface._tile_size_bwd_sm90, non-causal; cross-checked against FA4
    # itself in tests/adapters/test_fa4_compile.py.
    if head_dim <= 64:
        return 128
    if head_dim <= 96:
        return 64
    if head_dim <= 128:
        return 80 if sparse_q % 80 == 0 else 64
    return 64


def fa4_support(arch, dtype, head_dim: int, q_block: int, kv_block: int, need_grad: bool) -> Tuple[bool, str]:
    """Can the FA4 route serve this call exactly? ``(True, "")`` or ``(False, reason)``.

    ``arch`` is the CUDA compute capability ``(major, minor)`` (or None off-GPU). Pure Python:
    it does not import FA4 (whether FA4 is importable is :func:`load_fa4`'s business).
    """
    if arch is None:
        return False, "FA4 needs a CUDA GPU (no compute capability given)"
    major = _arch_major(arch)
    if major not in (9, 10):
        return False, (f"FA4 block sparsity serves sm_90 (Hopper) and sm_100 (Blackwell datacenter) only; "
                       f"this GPU is {_arch_str(arch)}")
    if dtype not in FA4_DTYPES:
        return False, f"FA4 route takes float16/bfloat16 q/k/v, got {dtype}"
    if head_dim not in FA4_HEAD_DIMS:
        return False, f"FA4 route is built and compile-tested for head_dim 64 or 128, got {head_dim}"
    if q_block != kv_block:
        return False, f"q and kv must use the same logical block size, got q_block={q_block}, kv_block={kv_block}"
    if q_block not in FA4_BLOCK_SIZES:
        return False, f"logical block size must be one of {FA4_BLOCK_SIZES}, got {q_block}"
    if major == 10 and q_block == 64:
        return False, ("sm_100: FA4's forward q tile is 128 rows (one Q stage), so a 64-token q block cannot "
                       "own its tile: a tile would span two logical q blocks")
    if major == 9 and q_block == 64 and need_grad:
        return False, ("sm_90: FA4's block-sparse backward needs 128-wide kv tiles (tile_n=128), "
                       "so 64-token kv blocks cannot be served exactly; the 64-token forward alone is served")
    if need_grad and major == 9 and q_block % sm90_bwd_tile_m(head_dim, q_block) != 0:
        return False, f"sm_90 backward q tile does not divide the {q_block}-token block for head_dim {head_dim}"
    return True, ""


def fa4_fwd_plan(arch, block_size: int) -> FA4Plan:
    major = _arch_major(arch)
    if major == 9:
        if block_size == 64:
            return FA4Plan(64, 64, 64, (64, 64), False)
        return FA4Plan(block_size, block_size, 128, (128, 128), False)
    if major == 10:
        if block_size == 128:
            return FA4Plan(128, 128, 128, (128, 128), True)
        if block_size == 256:
            # q_stage 2 (two 128-row Q stages): FA4's sparse q block is then 256 = one logical block.
            return FA4Plan(256, 256, 128, (128, 128), False)
    raise FA4UnsupportedError(f"no FA4 forward plan for {_arch_str(arch)} and block size {block_size}")


def fa4_bwd_plan(arch, block_size: int) -> FA4Plan:
    major = _arch_major(arch)
    if major in (9, 10) and block_size in (128, 256):
        return FA4Plan(block_size, block_size, 128, None, False)
    raise FA4UnsupportedError(f"no FA4 backward plan for {_arch_str(arch)} and block size {block_size}")


class SingleQStageSeqlen(int):
    """``max_seqlen_q`` that selects ONE Q stage on sm_100 and keeps the true length elsewhere.

    flash-attn-4 4.0.0b36 has no argument or config for the Q-stage count: ``_get_fwd_config``
    sets ``q_stage = 2 if max_seqlen_q * (qhead_per_kvhead if pack_gqa else 1) > tile_m and
    head_dim_v != 256 else 1``, and the sparse q block must then be a multiple of
    ``q_stage * tile_m`` = 256 ("... which must be a multiple of 256"). A plain
    ``max_seqlen_q=128`` is NOT a way out: on sm_100 the interface also hands ``max_seqlen_q``
    to the kernel, where it is the tile scheduler's M bound (``FlashAttentionForwardSm100``:
    ``ceil_div(eff_seqlen_q, q_stage * tile_m)`` m-blocks), so only the first 128 rows would be
    computed. This int keeps the true ``Sq`` for every use (the scheduler bound, ``<=`` in
    ``max_m_blocks_leq_one``, arithmetic) and answers ``False`` only to the one question
    ``> tile_m`` that picks the stage count (``__mul__`` keeps the type through the
    ``* qhead_per_kvhead`` factor). The compile test checks that FA4 then builds a
    ``q_stage == 1`` kernel and that the length stays a runtime argument (same PTX for two lengths).
    """

    _TILE_M = 128

    # The same object is also a cute.compile argument (FlashAttentionForwardSm100.__call__'s
    # max_seqlen_q). CuTe DSL 4.8.1 looks JIT-argument adapters up by EXACT type, so a bare int
    # subclass is rejected ("cannot be converted to a JitArgument") and the following arguments
    # shift ("unable to convert BlockArgument ... !cuda.stream ... to Numeric"). This protocol
    # (cutlass.base_dsl JitArgAdapterRegistry.get_registered_adapter, "F-TRANSPARENT") makes the
    # DSL adapt the value as the plain int it declares: a dynamic Int32, exactly as FA4's default
    # path passes a plain int there. At call time tvm-ffi passes any int subclass as a plain int.
    __pyir_plain_type__ = int

    def __pyir_plain_view__(self) -> int:
        return int(self)

    def __gt__(self, other):
        if isinstance(other, int) and int(other) == self._TILE_M:
            return False
        return int(self) > other

    def __mul__(self, other):
        if isinstance(other, int):
            return SingleQStageSeqlen(int(self) * int(other))
        return int(self) * other

    __rmul__ = __mul__


# Kept for callers of the old private names.
_sm90_bwd_tile_m = sm90_bwd_tile_m
_SingleQStageSeqlen = SingleQStageSeqlen
