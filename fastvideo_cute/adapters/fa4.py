"""FlashAttention-4 (CuTe DSL) block-sparse adapter for VSA.

VSA describes block-sparse attention with a *logical* block map (``[B, H, Qb, KVb]`` bool,
``block_size`` tokens per block on both axes) and ``kv_block_sizes`` (valid leading tokens per
kv block). FA4's block sparsity wants, per *physical* tile, index lists of the tiles to visit,
split into FULL tiles (no masking) and PARTIAL tiles (a ``mask_mod`` decides per element).
This module does that translation, on the torch side only, and calls FA4's private
``_flash_attn_fwd`` / ``_flash_attn_bwd`` (the public ``flash_attn_func`` hides the tile and
q-stage choices this adapter has to make).

Pinned stack: ``flash-attn-4==4.0.0b36``, ``nvidia-cutlass-dsl==4.8.1``,
``quack-kernels==0.6.5``. FA4 is imported lazily (:func:`load_fa4`); importing this module does
not import it, so the predicate and the metadata builders work without FA4.

Tile decisions (all exact: a physical q tile never spans two logical q blocks, and a physical
kv tile never spans two logical kv blocks):

============  ====================================  ==========================================
arch          forward                               backward
============  ====================================  ==========================================
sm_90         tile 128x128, sparse q block = L,     tile (64|128)x128 (FA4's
              kv tiles of 128 (L=256 split in 2);   ``_tile_size_bwd_sm90``), sparse q block = L,
              L=64: tile 64x64, kv tiles of 64      kv tiles of 128; L=64: not served (FA4's
                                                    sm_90 backward needs 128-wide kv tiles)
sm_100        tile 128x128, kv tiles of 128;        tile 128x128, 1-CTA, sparse q block = L,
              L=256: two Q stages (q block 256);    kv tiles of 128
              L=128: ONE Q stage (see
              ``_SingleQStageSeqlen``); L=64: not
              served (a 128-row q tile would span
              two logical blocks)
============  ====================================  ==========================================

Empty rows. A q tile whose lists are both empty (nothing selected, or every selected kv tile
has size 0, which the builder drops) takes FA4's empty-tile path: sm_90
(``flash_fwd_sm90.py``) resets the softmax stats and zero-fills the accumulator, so
``row_sum == 0`` and ``finalize`` writes ``lse = -inf``; sm_100
(``block_sparse_utils.handle_block_sparse_empty_tile_correction_sm100``) seeds
``row_sum = 1, row_max = -inf`` and writes the tile with scale 0, so ``lse = -inf * scale + 0
= -inf``. Both write ``out = 0``: the library's contract already, so no conversion pass is
needed (``tests/adapters/test_fa4_gpu.py`` checks it on the GPU). A row of a PARTIAL tile always
keeps at least one key (the mask depends on the key index only and a partial tile has
``size > 0``), so no visited row is fully masked. FA4's LSE is natural log (it multiplies the
log2 value by ln 2), ``[B, H, Sq]`` fp32: the library's contract as is.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import types
import warnings
from typing import NamedTuple, Optional, Tuple

import torch

from ..metadata import expand_block_map, map_to_index, split_block_sizes

__all__ = [
    "FA4_PINS",
    "FA4UnsupportedError",
    "FA4Plan",
    "FA4SparseIndex",
    "FA4Metadata",
    "FA4_JIT_SYMPTOMS",
    "load_fa4",
    "fa4_version_problems",
    "fa4_arch",
    "fa4_support",
    "fa4_fwd_plan",
    "fa4_bwd_plan",
    "build_fwd_metadata",
    "build_bwd_metadata",
    "fa4_block_sparse_fwd",
    "fa4_block_sparse_bwd",
    "fa4_block_sparse_fwd_prebuilt",
    "fa4_block_sparse_bwd_prebuilt",
]

# ----------------------------------------------------------------------------------------------
# Versions and loading
# ----------------------------------------------------------------------------------------------

#: Exact pins: a mismatched CuTe DSL stack imports fine and then breaks when a kernel JIT-compiles.
FA4_PINS = {
    "flash-attn-4": "4.0.0b36",
    "nvidia-cutlass-dsl": "4.8.1",
    "quack-kernels": "0.6.5",
}

#: Symptoms that a mismatched stack shows at JIT time (first CuTe call), with their cause.
FA4_JIT_SYMPTOMS = (
    ("TypeError: fmax() missing 1 required positional argument: 'b'",
     "nvidia-cutlass-dsl 4.5.x: a CuTe DSL older than the one flash-attn-4 was written against"),
    ("AttributeError: module 'cutlass.cute.core' has no attribute 'ThrMma'",
     "quack-kernels too old for the installed CuTe DSL / flash-attn-4"),
    ("ImportError: cannot import name 'alloc_reserved_mbarrier'",
     "quack-kernels too new for the installed flash-attn-4"),
)

_ALLOW_MISMATCH_ENV = "FASTVIDEO_CUTE_FA4_ALLOW_VERSION_MISMATCH"

_INSTALL_HINT = (
    "pip install 'fastvideo-cute[cute]' (CUDA 13 wheels: 'fastvideo-cute[cu13]'), i.e. exactly "
    "pip install 'flash-attn-4==4.0.0b36' 'nvidia-cutlass-dsl==4.8.1' 'quack-kernels==0.6.5'"
)


def _symptom_table() -> str:
    rows = [f"  {symptom}\n      -> {cause}" for symptom, cause in FA4_JIT_SYMPTOMS]
    return "Errors a mismatched stack raises on the first CuTe call, and their causes:\n" + "\n".join(rows)


def _installed_versions() -> dict:
    found = {}
    for name in FA4_PINS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def fa4_version_problems() -> list:
    """``["name: installed X, pinned Y", ...]`` for every package off its pin (empty if none)."""
    problems = []
    for name, have in _installed_versions().items():
        want = FA4_PINS[name]
        if have is None:
            problems.append(f"{name}: not installed, pinned {want}")
        elif have != want:
            problems.append(f"{name}: installed {have}, pinned {want}")
    return problems


def _import_error_message(problems: list, cause: Optional[BaseException]) -> str:
    lines = ["The FA4 (CuTe DSL) route of fastvideo-cute needs its 'cute' extra, exactly: "
             + ", ".join(f"{n}=={v}" for n, v in FA4_PINS.items()) + "."]
    if problems:
        lines.append("Mismatched: " + "; ".join(problems) + ".")
    if cause is not None:
        lines.append(f"Import failed: {type(cause).__name__}: {cause}")
    lines.append(f"Fix: {_INSTALL_HINT}.")
    lines.append("Without it, unset FASTVIDEO_VSA_CUTEDSL (or set FASTVIDEO_VSA_TRITON=1): the Triton route "
                 "serves every call.")
    lines.append(_symptom_table())
    lines.append(f"(Set {_ALLOW_MISMATCH_ENV}=1 to try a mismatched stack anyway.)")
    return "\n".join(lines)


@functools.lru_cache(maxsize=1)
def load_fa4() -> types.SimpleNamespace:
    """Import FA4 lazily, once. Raises :class:`ImportError` with the fix when it cannot.

    Returns a namespace with ``fwd`` (``_flash_attn_fwd``), ``bwd`` (``_flash_attn_bwd``),
    ``flash_attn_func``, ``BlockSparseTensorsTorch``, ``interface`` (the module), ``arch()``
    (FA4's own arch, as the int it uses: 90, 100, ...), ``mask_mod(kv_tile)`` (the cached
    mask_mod factory) and ``versions``.
    """
    problems = fa4_version_problems()
    if problems and os.environ.get(_ALLOW_MISMATCH_ENV, "") != "1":
        raise ImportError(_import_error_message(problems, None))
    if problems:
        warnings.warn("FA4 stack off its pins (" + "; ".join(problems) + "); " + _symptom_table(),
                      RuntimeWarning, stacklevel=2)
    try:
        interface = importlib.import_module("flash_attn.cute.interface")
        block_sparsity = importlib.import_module("flash_attn.cute.block_sparsity")
        masks = importlib.import_module("fastvideo_cute.adapters.fa4_masks")
    except ImportError as exc:
        raise ImportError(_import_error_message(problems, exc)) from exc
    return types.SimpleNamespace(
        interface=interface,
        fwd=interface._flash_attn_fwd,
        bwd=interface._flash_attn_bwd,
        flash_attn_func=interface.flash_attn_func,
        BlockSparseTensorsTorch=block_sparsity.BlockSparseTensorsTorch,
        arch=interface._get_device_arch,
        mask_mod=masks.kv_valid_len_mask,
        versions=_installed_versions(),
    )


def fa4_arch() -> Tuple[int, int]:
    """The arch FA4 itself will pick kernels for (honours ``FLASH_ATTENTION_ARCH``)."""
    arch = int(load_fa4().arch())
    return arch // 10, arch % 10


# ----------------------------------------------------------------------------------------------
# Support predicate and per-arch plans
# ----------------------------------------------------------------------------------------------

_BLOCK_SIZES = (64, 128, 256)
_HEAD_DIMS = (64, 128)
_DTYPES = (torch.float16, torch.bfloat16)


class FA4UnsupportedError(ValueError):
    """The FA4 route cannot serve this call exactly (the message says why)."""


class FA4Plan(NamedTuple):
    """How one call maps onto FA4 tiles.

    ``q_sparse``: rows per sparse q block handed to FA4 (``BlockSparseTensorsTorch.block_size[0]``);
    it divides the logical block, so a physical q tile never spans two logical q blocks.
    ``kv_tile``: physical kv tile (``block_size[1]``); logical kv blocks split into
    ``block_size // kv_tile`` tiles with sizes ``clamp(size - kv_tile * i, 0, kv_tile)``.
    ``tile_mn``: forward tile passed to FA4 (None for the backward, whose tile FA4 fixes).
    ``single_q_stage``: sm_100 forward with 128-row sparse q blocks (see ``_SingleQStageSeqlen``).
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


def _sm90_bwd_tile_m(head_dim: int, sparse_q: int) -> int:
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
    if dtype not in _DTYPES:
        return False, f"FA4 route takes float16/bfloat16 q/k/v, got {dtype}"
    if head_dim not in _HEAD_DIMS:
        return False, f"FA4 route is built and compile-tested for head_dim 64 or 128, got {head_dim}"
    if q_block != kv_block:
        return False, f"q and kv must use the same logical block size, got q_block={q_block}, kv_block={kv_block}"
    if q_block not in _BLOCK_SIZES:
        return False, f"logical block size must be one of {_BLOCK_SIZES}, got {q_block}"
    if major == 10 and q_block == 64:
        return False, ("sm_100: FA4's forward q tile is 128 rows (one Q stage), so a 64-token q block cannot "
                       "own its tile: a tile would span two logical q blocks")
    if major == 9 and q_block == 64 and need_grad:
        return False, ("sm_90: FA4's block-sparse backward needs 128-wide kv tiles (tile_n=128), "
                       "so 64-token kv blocks cannot be served exactly; the 64-token forward alone is served")
    if need_grad and major == 9 and q_block % _sm90_bwd_tile_m(head_dim, q_block) != 0:
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


class _SingleQStageSeqlen(int):
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
            return _SingleQStageSeqlen(int(self) * int(other))
        return int(self) * other

    __rmul__ = __mul__


# ----------------------------------------------------------------------------------------------
# Metadata (pure torch, on the map's device, no host synchronisation)
# ----------------------------------------------------------------------------------------------


class FA4SparseIndex(NamedTuple):
    """FA4 block-sparse lists (int32). Forward: rows are q tiles, columns kv tiles.
    Backward: rows are kv tiles, columns q tiles. ``*_idx`` has the selected columns first
    (ascending); entries past ``*_cnt`` are filler FA4 never reads."""

    full_cnt: torch.Tensor
    full_idx: torch.Tensor
    mask_cnt: torch.Tensor
    mask_idx: torch.Tensor
    block_size: Tuple[int, int]  # (q rows per sparse q block, kv tile)


class FA4Metadata(NamedTuple):
    index: FA4SparseIndex
    kv_tile_sizes: torch.Tensor  # int32 [KVb * block_size // kv_tile]: the mask_mod's aux tensor
    plan: FA4Plan


def _physical_maps(block_map: torch.Tensor, kv_block_sizes: torch.Tensor, plan: FA4Plan, all_full: bool = False):
    """(full map, partial map or None, tile sizes). ``all_full`` is the caller's promise that every
    kv block is full (known from a cached range check): then the partial map is empty and skipped."""
    block = plan.block_size
    kv_factor = block // plan.kv_tile
    q_factor = block // plan.q_sparse
    tile_sizes = split_block_sizes(kv_block_sizes.to(block_map.device), kv_factor, plan.kv_tile)
    # Sizes outside [0, block] mean "none" / "all" valid, as in the reference; clamp per tile.
    tile_sizes = tile_sizes.clamp(0, plan.kv_tile).to(torch.int32).contiguous()
    phys = expand_block_map(block_map.to(torch.bool), q_factor, kv_factor)
    if all_full:
        return phys, None, tile_sizes
    full_cols = (tile_sizes == plan.kv_tile).view(1, 1, 1, -1)
    part_cols = ((tile_sizes > 0) & (tile_sizes < plan.kv_tile)).view(1, 1, 1, -1)
    return phys & full_cols, phys & part_cols, tile_sizes


def _index(full: torch.Tensor, part: Optional[torch.Tensor], block_size: Tuple[int, int]) -> FA4SparseIndex:
    full_idx, full_cnt = map_to_index(full.contiguous())
    if part is None:  # no partial tile anywhere: empty mask lists, no second sort
        mask_idx, mask_cnt = torch.zeros_like(full_idx), torch.zeros_like(full_cnt)
    else:
        mask_idx, mask_cnt = map_to_index(part.contiguous())
    return FA4SparseIndex(full_cnt.contiguous(), full_idx.contiguous(), mask_cnt.contiguous(),
                          mask_idx.contiguous(), block_size)


def build_fwd_metadata(block_map: torch.Tensor, kv_block_sizes: torch.Tensor, plan: FA4Plan,
                       all_full: bool = False) -> FA4Metadata:
    """Q-owned forward lists: per sparse q block, its FULL and PARTIAL kv tiles (size-0 dropped)."""
    full, part, tile_sizes = _physical_maps(_as_4d(block_map), kv_block_sizes, plan, all_full)
    return FA4Metadata(_index(full, part, (plan.q_sparse, plan.kv_tile)), tile_sizes, plan)


def build_bwd_metadata(block_map: torch.Tensor, kv_block_sizes: torch.Tensor, plan: FA4Plan,
                       all_full: bool = False) -> FA4Metadata:
    """KV-owned backward lists: per kv tile, the sparse q blocks that selected it (the transpose)."""
    full, part, tile_sizes = _physical_maps(_as_4d(block_map), kv_block_sizes, plan, all_full)
    index = _index(full.transpose(-2, -1), None if part is None else part.transpose(-2, -1),
                   (plan.q_sparse, plan.kv_tile))
    return FA4Metadata(index, tile_sizes, plan)


def _as_4d(block_map: torch.Tensor) -> torch.Tensor:
    return block_map.unsqueeze(0) if block_map.dim() == 3 else block_map


# ----------------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------------


def _check_block_size(block_size) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size not in _BLOCK_SIZES:
        raise ValueError(f"block_size must be one of {_BLOCK_SIZES}, got {block_size!r}")
    return block_size


def _check_4d(name: str, t, dims: str = "[B, S, H, D]") -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-D BSHD {dims}, got shape {tuple(t.shape)}")


def _check_qkv(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_4d(name, t)
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name} must be float16 or bfloat16, got {t.dtype}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last (head_dim) dimension, got strides {t.stride()}")
    b, sq, h, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if k.shape[0] != b or k.shape[2] != h or k.shape[3] != d:
        raise ValueError(f"k/v must be [B={b}, Skv, H={h}, D={d}] to match q {tuple(q.shape)}, got {tuple(k.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    return b, sq, k.shape[1], h, d


def _check_map_and_sizes(block_map, kv_block_sizes, b, h, sq, skv, block_size):
    if not isinstance(block_map, torch.Tensor):
        raise ValueError(f"block_map must be a torch.Tensor, got {type(block_map).__name__}")
    if block_map.dim() == 3:
        block_map = block_map.unsqueeze(0)
    if block_map.dim() != 4:
        raise ValueError(f"block_map must be [B, H, Qb, KVb] (or [H, Qb, KVb]), got shape {tuple(block_map.shape)}")
    if block_map.dtype.is_floating_point or block_map.dtype.is_complex:
        raise ValueError(f"block_map must be bool (or an integer 0/1 map), got {block_map.dtype}")
    if sq % block_size or skv % block_size:
        raise ValueError(f"q length {sq} and kv length {skv} must be multiples of block_size={block_size}")
    qb, kvb = sq // block_size, skv // block_size
    if block_map.shape[0] not in (1, b) or block_map.shape[1] != h or tuple(block_map.shape[2:]) != (qb, kvb):
        raise ValueError(f"block_map must be [B={b}, H={h}, Qb={qb}, KVb={kvb}] for q length {sq}, kv length "
                         f"{skv} and block_size={block_size}; got {tuple(block_map.shape)}")
    if block_map.shape[0] != b:
        block_map = block_map.expand(b, -1, -1, -1)
    if not isinstance(kv_block_sizes, torch.Tensor):
        raise ValueError(f"kv_block_sizes must be a torch.Tensor, got {type(kv_block_sizes).__name__}")
    if kv_block_sizes.dim() != 1 or kv_block_sizes.numel() != kvb:
        raise ValueError(f"kv_block_sizes must be 1-D with KVb={kvb} entries, got shape {tuple(kv_block_sizes.shape)}")
    if kv_block_sizes.dtype.is_floating_point or kv_block_sizes.dtype.is_complex or kv_block_sizes.dtype == torch.bool:
        raise ValueError(f"kv_block_sizes must be an integer tensor (int32), got {kv_block_sizes.dtype}")
    return block_map, kv_block_sizes


def _require_support(q_dtype, head_dim, block_size, need_grad):
    arch = fa4_arch()
    ok, reason = fa4_support(arch, q_dtype, head_dim, block_size, block_size, need_grad)
    if not ok:
        raise FA4UnsupportedError(f"FA4 route cannot serve this call: {reason}")
    return arch


# ----------------------------------------------------------------------------------------------
# Forward / backward
# ----------------------------------------------------------------------------------------------


def _zero_kv_padding(k: torch.Tensor, v: torch.Tensor, meta: FA4Metadata):
    """Out-of-place copies of k/v with the padded tail of every kv tile set to 0.

    Needed only when padded keys may hold NaN/Inf: FA4 reads a PARTIAL tile whole, and although
    the mask_mod turns the padded scores into -inf (so P = 0 there), ``P @ V`` still computes
    ``0 * NaN = NaN`` in the forward, and the backward's ``dS = P * (dO V^T - delta)`` and
    ``dQ = dS K`` do the same with NaN/Inf in V or K. Finite padding (e.g. the zeros the tiling
    writes) needs nothing. Costs one read + write of k and v.
    """
    kv_tile = meta.plan.kv_tile
    pos = torch.arange(kv_tile, device=k.device, dtype=torch.int32)
    valid = (pos[None, :] < meta.kv_tile_sizes.to(k.device)[:, None]).reshape(1, -1, 1, 1)
    zero = torch.zeros((), dtype=k.dtype, device=k.device)
    return torch.where(valid, k, zero), torch.where(valid, v, zero)


def _to_fa4(fa, index: FA4SparseIndex):
    return fa.BlockSparseTensorsTorch(
        mask_block_cnt=index.mask_cnt,
        mask_block_idx=index.mask_idx,
        full_block_cnt=index.full_cnt,
        full_block_idx=index.full_idx,
        block_size=tuple(index.block_size),
    )


def fa4_block_sparse_fwd_prebuilt(q, k, v, meta: FA4Metadata, *, softmax_scale: Optional[float] = None):
    """FA4 forward with metadata from :func:`build_fwd_metadata` (no checks: the kernel only)."""
    fa = load_fa4()
    plan = meta.plan
    max_seqlen_q = _SingleQStageSeqlen(q.shape[1]) if plan.single_q_stage else None
    out, lse = fa.fwd(
        q, k, v,
        softmax_scale=softmax_scale,
        causal=False,
        tile_mn=plan.tile_mn,
        max_seqlen_q=max_seqlen_q,
        mask_mod=fa.mask_mod(plan.kv_tile),
        block_sparse_tensors=_to_fa4(fa, meta.index),
        aux_tensors=[meta.kv_tile_sizes],
        return_lse=True,
    )[:2]
    return out, lse


def fa4_block_sparse_bwd_prebuilt(q, k, v, out, dout, lse, meta: FA4Metadata, *,
                                  softmax_scale: Optional[float] = None):
    """FA4 backward with metadata from :func:`build_bwd_metadata` (no checks: the kernels only)."""
    fa = load_fa4()
    grads = fa.bwd(
        q, k, v, out, dout, lse,
        softmax_scale=softmax_scale,
        causal=False,
        mask_mod=fa.mask_mod(meta.plan.kv_tile),
        aux_tensors=[meta.kv_tile_sizes],
        block_sparse_tensors=_to_fa4(fa, meta.index),
    )
    return grads[0], grads[1], grads[2]


def fa4_block_sparse_fwd(q, k, v, block_map, kv_block_sizes, *, block_size: int, need_backward: bool,
                         softmax_scale: Optional[float] = None, zero_kv_padding: bool = False,
                         all_full: bool = False):
    """Block-sparse attention forward through FA4. BSHD in, ``(out BSHD, lse [B, H, Sq] fp32 ln)`` out.

    ``need_backward`` only checks, up front, that :func:`fa4_block_sparse_bwd` will be able to
    serve the backward of this call; the forward itself is identical either way (the backward
    metadata is built by :func:`fa4_block_sparse_bwd`, never here).
    ``zero_kv_padding``: set it when padded keys (positions at or past ``kv_block_sizes``) may
    hold NaN/Inf; see :func:`_zero_kv_padding` (FA4 would otherwise return NaN rows).
    ``all_full``: the caller's promise that every kv block is full (sizes == block_size), e.g.
    from a cached range check; the partial lists are then empty and not built. A false promise
    gives wrong results, so only pass what was checked.
    q/k/v may be strided BSHD views (e.g. ``x_bhsd.transpose(1, 2)``): FA4 takes any layout
    whose last dim is contiguous and whose strides are 16-byte aligned, without a copy.
    """
    block_size = _check_block_size(block_size)
    b, sq, skv, h, d = _check_qkv(q, k, v)
    block_map, kv_block_sizes = _check_map_and_sizes(block_map, kv_block_sizes, b, h, sq, skv, block_size)
    arch = _require_support(q.dtype, d, block_size, bool(need_backward))
    meta = build_fwd_metadata(block_map, kv_block_sizes, fa4_fwd_plan(arch, block_size), all_full)
    if zero_kv_padding and not all_full:
        k, v = _zero_kv_padding(k, v, meta)
    return fa4_block_sparse_fwd_prebuilt(q, k, v, meta, softmax_scale=softmax_scale)


def fa4_block_sparse_bwd(q, k, v, out, dout, lse, block_map, kv_block_sizes, *, block_size: int,
                         softmax_scale: Optional[float] = None, zero_kv_padding: bool = False,
                         all_full: bool = False):
    """Backward of :func:`fa4_block_sparse_fwd`: ``(dq, dk, dv)``, each shaped like its input.

    Builds the KV-owned lists (only here). dk/dv of padded keys come out 0. Pass the same
    ``zero_kv_padding`` as the forward.
    """
    block_size = _check_block_size(block_size)
    b, sq, skv, h, d = _check_qkv(q, k, v)
    _check_4d("out", out)
    _check_4d("dout", dout)
    if out.shape != q.shape:
        raise ValueError(f"out must have q's shape {tuple(q.shape)}, got {tuple(out.shape)}")
    if dout.shape != q.shape:
        raise ValueError(f"dout must have q's shape {tuple(q.shape)}, got {tuple(dout.shape)}")
    if out.dtype != q.dtype or dout.dtype != q.dtype:
        raise ValueError(f"out and dout must be {q.dtype}, got {out.dtype} and {dout.dtype}")
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (b, h, sq) or lse.dtype != torch.float32:
        got = f"{tuple(lse.shape)} {lse.dtype}" if isinstance(lse, torch.Tensor) else type(lse).__name__
        raise ValueError(f"lse must be float32 [B={b}, H={h}, Sq={sq}], got {got}")
    block_map, kv_block_sizes = _check_map_and_sizes(block_map, kv_block_sizes, b, h, sq, skv, block_size)
    arch = _require_support(q.dtype, d, block_size, True)
    meta = build_bwd_metadata(block_map, kv_block_sizes, fa4_bwd_plan(arch, block_size), all_full)
    if zero_kv_padding and not all_full:
        k, v = _zero_kv_padding(k, v, meta)
    return fa4_block_sparse_bwd_prebuilt(q, k, v, out, dout, lse, meta, softmax_scale=softmax_scale)
