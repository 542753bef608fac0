"""Which calls cuDNN-frontend block-sparse attention can serve exactly: a pure-Python predicate.

:func:`cudnn_support` answers ``(True, "")`` or ``(False, reason)`` from static facts only (arch,
dtype, head_dim, logical block size, direction, lengths, heads, whether every kv block is full).
It never imports cuDNN and never reads tensor values, so a route can call it per call without a
host synchronisation. Whether cuDNN is installed at its pin is :func:`.cudnn_bsa.cudnn_version_problems`.

Every limit below is the one ``nvidia-cudnn-frontend==1.32.0`` enforces in
``cudnn/block_sparse_attention/api.py`` (``block_sparse_attention_forward`` / ``_backward``) and
``_interface.py`` (``bsa_attn_fwd``, ``bsa_attn_fwd_blk64_cutedsl``, ``bsa_attn_bwd``,
``_bsa_attn_bwd_bucketed_k2q_csr``), restated per arch family (``major``; cuDNN's ``arch // 10``):

==========  =====================================================  ==============================================
family      forward                                                backward
==========  =====================================================  ==============================================
sm_90       fp16/bf16; head_dim 64/96/128; blk64 and blk128;       bf16 only; head_dim 128 only; blk64 and blk128;
            blk64 needs seqlen_q % 64 == 0; block_sizes ranks      block_sizes ranks 1-2
            1-3
sm_100,     blk128: fp16/bf16, head_dim 64/96/128;                 bf16 only; blk64: head_dim 128; blk128: head_dim
sm_110      blk64: bf16, head_dim 128, MHA only;                   64/128; blk128 with ``block_sizes`` only on
            ``block_sizes`` rank 1 only                            sm_100/sm_103 ("SM{arch} blk128 backward does not
                                                                   yet support block_sizes"), rank 1 there
sm_120,     fp16/bf16; head_dim 128 only; blk64 and blk128;        none ("backward requires SM90-SM110")
sm_121      block_sizes ranks 1-3
==========  =====================================================  ==============================================

Backward everywhere: MHA only (heads_q == heads_kv), head_dim == value_dim. Forward GQA exists in
cuDNN but not in this library's contract (k/v have q's heads), so heads_q != heads_kv is refused.

The library's own conditions on top: q and kv lengths positive multiples of the logical block;
logical blocks 64 / 128 / 256, where 256 runs as 128-token physical tiles (each logical block
split 2 x 2, like the Triton backend's ``PHYSICAL_TILES``); the bucketed k2q CSR of the
backward holds ``Qb * KVb`` int32 edges per (batch, head), which must fit in int32.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

__all__ = ["CUDNN_PHYSICAL_TILE", "CUDNN_DEFAULT_Q_GROUP", "ONE_GROUP_MAX_Q_BLOCKS", "cudnn_support", "cudnn_arch_int",
           "cudnn_bwd_bucket", "cudnn_bwd_one_group"]

#: logical block size -> the physical (q and kv) tile cuDNN runs (its ``sparse_block_size``).
CUDNN_PHYSICAL_TILE = {64: 64, 128: 128, 256: 128}

_HALF = (torch.float16, torch.bfloat16)
_INT32_MAX = 2**31 - 1

Verdict = Tuple[bool, str]


def cudnn_arch_int(arch) -> Optional[int]:
    """``(major, minor)`` (or an int such as 90 / 100) -> cuDNN's ``major * 10 + minor``; None stays None."""
    if arch is None:
        return None
    if isinstance(arch, int):
        return arch if arch >= 20 else arch * 10
    major, minor = int(arch[0]), int(arch[1])
    return major * 10 + minor


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def cudnn_support(arch, dtype, head_dim: int, block_size: int, need_grad: bool, *, q_len: int, kv_len: int,
                  heads_q: int, heads_kv: int, bshd: bool, kv_all_full: bool = False) -> Verdict:
    """Can cuDNN BSA serve this call exactly? ``(True, "")`` or ``(False, reason)``.

    ``arch``: CUDA compute capability ``(major, minor)`` (None off-GPU). ``block_size``: the
    library's logical block (64, 128, 256). ``need_grad``: the backward will run too, so both
    directions must be served. ``kv_all_full``: every kv block is full (known from the cached range
    check of ``variable_block_sizes``); then no ``block_sizes`` tensor is passed to cuDNN, which
    some backward kernels require. ``bshd`` is accepted either way (cuDNN's ``layout=`` takes both).
    """
    del bshd  # both layouts are served by cuDNN's ``layout=`` argument
    arch_i = cudnn_arch_int(arch)
    if arch_i is None:
        return False, "cuDNN BSA needs a CUDA GPU (no compute capability given)"
    family = arch_i // 10
    name = f"sm_{arch_i}"
    if family not in (9, 10, 11, 12):
        return False, (f"cuDNN BSA forward serves sm_90, sm_100/sm_103, sm_110 and sm_120/sm_121 only; "
                       f"this GPU is {name}")
    if block_size not in CUDNN_PHYSICAL_TILE:
        return False, f"logical block size must be one of {tuple(CUDNN_PHYSICAL_TILE)}, got {block_size}"
    tile = CUDNN_PHYSICAL_TILE[block_size]
    if q_len <= 0 or kv_len <= 0 or q_len % block_size or kv_len % block_size:
        return False, f"q_len {q_len} and kv_len {kv_len} must be positive multiples of the {block_size}-token block"
    if heads_q != heads_kv:
        return False, f"heads_q ({heads_q}) != heads_kv ({heads_kv}): GQA is outside the library's contract"
    if dtype not in _HALF:
        return False, f"cuDNN BSA takes float16/bfloat16 q/k/v, got {_dtype_name(dtype)}"

    # ---- forward (api.block_sparse_attention_forward) ----
    if family == 9:
        if head_dim not in (64, 96, 128):
            return False, f"{name}: cuDNN's SM90 forward supports head_dim 64, 96 or 128, got {head_dim}"
    elif family == 12:
        if head_dim != 128:
            return False, f"{name}: cuDNN's SM120 forward requires head_dim 128, got {head_dim}"
    elif tile == 64:
        if dtype != torch.bfloat16 or head_dim != 128:
            return False, (f"{name}: cuDNN's SM100/SM110 blk64 forward requires bfloat16 and head_dim 128, got "
                           f"{_dtype_name(dtype)} and head_dim {head_dim}")
    elif head_dim not in (64, 96, 128):
        return False, f"{name}: cuDNN's SM100/SM110 blk128 forward supports head_dim 64, 96 or 128, got {head_dim}"

    if not need_grad:
        return True, ""

    # ---- backward (api.block_sparse_attention_backward) ----
    if family == 12:
        return False, f"{name}: cuDNN BSA has no backward on SM120 (its backward requires SM90-SM110); forward only"
    if dtype != torch.bfloat16:
        return False, f"{name}: cuDNN's BSA backward requires bfloat16, got {_dtype_name(dtype)}"
    if family == 9 and head_dim != 128:
        return False, f"{name}: cuDNN's SM90 backward requires head_dim 128, got {head_dim}"
    if tile == 64 and head_dim != 128:
        return False, f"{name}: cuDNN's blk64 backward requires head_dim 128, got {head_dim}"
    if tile == 128 and head_dim not in (64, 128):
        return False, f"{name}: cuDNN's blk128 backward requires head_dim 64 or 128, got {head_dim}"
    if family in (10, 11) and arch_i not in (100, 103) and tile == 128 and not kv_all_full:
        return False, (f"{name}: cuDNN's blk128 backward does not yet support block_sizes on this arch (only "
                       f"sm_100/sm_103), so partial kv blocks cannot be served; full blocks only")
    if (q_len // tile) * (kv_len // tile) > _INT32_MAX:
        return False, f"{q_len // tile} x {kv_len // tile} k2q edges per (batch, head) exceed cuDNN's int32 CSR"
    return True, ""


#: cuDNN's own backward q-group size (``bucket_size_blocks`` when None is passed), by physical tile.
CUDNN_DEFAULT_Q_GROUP = {64: 384, 128: 256}

#: sm_90: physical q blocks up to which the backward runs as ONE q group (``bucket_size_blocks`` =
#: this bound) instead of cuDNN's default groups. At blk128 one group selects cuDNN's direct-dK/dV
#: kernel variant (no fp32 workspace to zero, reduce into and convert); at blk64 cuDNN always
#: reduces dK/dV into its fp32 workspace, and one group halves the CTAs (and reductions) per kv
#: block. Measured on the H200, 5-7 rotated rounds (benchmarks/results/sweep_cudnn_bwd64_h200_v2.json,
#: _v3.json, sweep_cudnn_bwd128_h200.json): blk128 Wan-1.3B grid (308 q blocks) 5.12 vs 5.61 ms,
#: S=32768 (256: one group either way) 3.70 vs 3.76; blk64 S=32768 (512) 4.86-4.92 vs 5.04-5.05 ms.
#: Past the bound one group was slower (blk64 S=65536: 23.4 vs 19.9 ms; blk128 S=65536: 15.9-16.2 vs
#: 15.4) and the Wan grid at blk64 (624) gained nothing (7.12-7.23 vs 7.09-7.15).
ONE_GROUP_MAX_Q_BLOCKS = {64: 512, 128: 384}


def cudnn_bwd_bucket(arch, sparse_block: int, q_len: int) -> Optional[int]:
    """cuDNN backward's ``bucket_size_blocks`` for a call: the one-group bound where it applies
    (sm_90, at most that many physical q blocks of ``sparse_block`` tokens), else None (cuDNN's
    default; other arches keep cuDNN's own choice: not measured there)."""
    limit = ONE_GROUP_MAX_Q_BLOCKS.get(int(sparse_block))
    if arch is None or int(tuple(arch)[0]) != 9 or limit is None:
        return None
    return limit if -(-int(q_len) // int(sparse_block)) <= limit else None


def cudnn_bwd_one_group(arch, sparse_block: int, q_len: int) -> bool:
    """Whether the adapter's cuDNN backward runs as one q group: :func:`cudnn_bwd_bucket`'s bound,
    or cuDNN's default group holding every q block."""
    bucket = cudnn_bwd_bucket(arch, sparse_block, q_len) or CUDNN_DEFAULT_Q_GROUP[int(sparse_block)]
    return -(-int(q_len) // int(sparse_block)) <= bucket
