"""Block-map metadata: index lists and logical -> physical block expansion.

Everything here is plain torch on the tensors' own device: no host synchronisation, no
atomics, and a result that depends only on the input values (sorted lists). The exceptions
are :func:`map_to_index` on a CUDA map, which runs one fused Triton launch
(``fastvideo_cute.kernels.triton.map_to_index``) with the same result bit for bit (its torch
path, :func:`_map_to_index_torch`, is the reference and the CPU path), and
:meth:`BlockSparsity.k2q` on a CUDA map with :data:`FUSED_K2Q` on (the default:
``fastvideo_cute.kernels.triton.k2q_lists``, the same first ``num`` entries of each row, the rest
unwritten).

Layouts (all int32, GPU-resident when the map is):
- q2k: ``idx [B, H, Qb, KVb]`` (first ``num[b, h, i]`` entries are the kv blocks query block
  i selected, ascending; the rest is filler that kernels never read), ``num [B, H, Qb]``.
- k2q: the transpose, ``idx [B, H, KVb, Qb]``, ``num [B, H, KVb]`` (from the fused
  :meth:`BlockSparsity.k2q` the entries past ``num`` are unspecified).

:class:`BlockSparsity` is what the ops hand a backend: the selection of one call as it arrived
(a bool map, or q2k lists such as ``video_sparse_attn``'s top-k writes), with the other form
built on demand, once. A backend asks for the form its kernels take, so lists that go to a
list-taking kernel (cuDNN BSA, our Triton forward at its native tile) never become a map.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

__all__ = [
    "BlockSparsity",
    "map_to_index",
    "index_to_map",
    "invert_indices",
    "expand_block_map",
    "split_block_sizes",
    "physical_layout",
    "split_q2k",
]


def map_to_index(block_map: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Bool map ``[..., R, C]`` -> ``(idx [..., R, C] int32, num [..., R] int32)``, both contiguous.

    Selected columns come first in ascending order, then the others in ascending order (what a
    stable sort on "not selected" gives); a non-bool map is read as ``!= 0``.

    A CUDA map (at least 2-D, at most ``MAX_COLS`` columns) is converted by one fused Triton
    launch (``fastvideo_cute.kernels.triton.map_to_index.map_to_index_fused``) when Triton is
    importable; every other map (and any map while ``torch.compile`` traces, so the graph holds
    plain torch ops) takes :func:`_map_to_index_torch`, the reference the fused kernel equals
    bit for bit.
    """
    _check_map(block_map)
    if block_map.is_cuda and block_map.dim() >= 2 and not torch.compiler.is_compiling():
        fused = _fused_map_to_index()
        if fused is not None and block_map.shape[-1] <= fused[1]:
            return fused[0](block_map)
    return _map_to_index_torch(block_map)


_FUSED = None  # (map_to_index_fused, MAX_COLS) once imported; False if Triton is not importable


def _check_map(block_map, name: str = "block_map") -> None:
    if not isinstance(block_map, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(block_map).__name__}")
    if block_map.dtype.is_floating_point or block_map.dtype.is_complex:
        raise TypeError(f"{name} must be a bool or integer tensor, got {block_map.dtype}")
    if block_map.dim() < 1:
        raise ValueError(f"{name} must have at least 1 dimension [..., C], got a 0-d tensor")


def _check_factor(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _fused_map_to_index():
    """The fused kernel's entry point and column limit, imported lazily (and once): ``None``
    when Triton (or the kernel module) cannot be imported."""
    global _FUSED
    if _FUSED is None:
        try:
            from fastvideo_cute.kernels.triton.map_to_index import MAX_COLS, map_to_index_fused
        except Exception:  # noqa: BLE001 - no usable Triton: the torch path serves every map
            _FUSED = False
        else:
            _FUSED = (map_to_index_fused, MAX_COLS)
    return _FUSED or None


_K2Q = None  # k2q_lists_fused once imported; False if Triton is not importable
#: whether :meth:`BlockSparsity.k2q` takes the fused kernel on CUDA. On since the route's GPU tests passed
#: with it (H100, tests/logs/h100_2026-12-06_s23_406d65f.log; the kernel alone and its lists against
#: map_to_index's: tests/logs/h100_2026-12-06_s22_c13d9ef.log). Off (False) gives map_to_index of the
#: transposed map, whose rows go on with the unselected q blocks.
FUSED_K2Q = True


def _fused_k2q_lists():
    """:meth:`BlockSparsity.k2q`'s fused kernel (``k2q_lists_fused``), imported lazily (and once):
    ``None`` when Triton (or the kernel module) cannot be imported."""
    global _K2Q
    if _K2Q is None:
        try:
            from fastvideo_cute.kernels.triton.k2q_lists import k2q_lists_fused
        except Exception:  # noqa: BLE001 - no usable Triton: map_to_index of the transpose
            _K2Q = False
        else:
            _K2Q = k2q_lists_fused
    return _K2Q or None


def _map_to_index_torch(block_map: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The torch-ops form of :func:`map_to_index` (~6 launches on a GPU): the reference, and
    the path for CPU maps.

    Built without a sort: each column's slot is a running count (a cumsum), and one scatter of
    the column numbers fills the permutation.
    """
    if block_map.dtype != torch.bool:
        block_map = block_map != 0
    cols = block_map.shape[-1]
    csum = torch.cumsum(block_map, dim=-1, dtype=torch.int32)  # selected columns at or before j
    num = csum[..., -1] if cols else block_map.sum(dim=-1, dtype=torch.int32)
    j = torch.arange(cols, device=block_map.device, dtype=torch.int32)
    # selected j -> its rank among the selected; unselected j -> num + its rank among the unselected
    slot = torch.where(block_map, csum - 1, num.unsqueeze(-1) + j - csum)
    # Contiguous whatever the map's strides (a transposed map gives strided cumsum/where outputs).
    idx = torch.empty(slot.shape, dtype=torch.int32, device=slot.device)
    idx.scatter_(-1, slot.to(torch.int64), j.expand_as(slot))
    return idx, num.contiguous()


def index_to_map(idx: torch.Tensor, num: torch.Tensor, num_cols: int) -> torch.Tensor:
    """Inverse of :func:`map_to_index`: ``[..., R, num_cols]`` bool."""
    width = idx.shape[-1]
    slot = torch.arange(width, device=idx.device, dtype=torch.int32)
    used = slot < num.unsqueeze(-1)
    out = torch.zeros(*idx.shape[:-1], num_cols + 1, dtype=torch.bool, device=idx.device)
    # Unused slots scatter into a spare trailing column that is dropped afterwards.
    target = torch.where(used, idx.to(torch.int64), torch.full_like(idx, num_cols, dtype=torch.int64))
    out.scatter_(-1, target, True)
    return out[..., :num_cols]


def invert_indices(
    q2k_idx: torch.Tensor, q2k_num: torch.Tensor, num_kv_blocks: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """q2k lists -> k2q lists (``idx [..., KVb, Qb]``, ``num [..., KVb]``), sorted ascending."""
    block_map = index_to_map(q2k_idx, q2k_num, num_kv_blocks)
    return map_to_index(block_map.transpose(-2, -1))


def expand_block_map(block_map: torch.Tensor, q_factor: int, kv_factor: int) -> torch.Tensor:
    """Logical map -> physical map: each logical q block becomes ``q_factor`` physical ones,
    each kv block ``kv_factor``; a physical pair is selected iff its logical pair is."""
    _check_map(block_map)
    _check_factor("q_factor", q_factor)
    _check_factor("kv_factor", kv_factor)
    if block_map.dim() < 2:
        raise ValueError(f"block_map must be [..., Qb, KVb], got shape {tuple(block_map.shape)}")
    out = block_map
    if q_factor != 1:
        out = out.repeat_interleave(q_factor, dim=-2)
    if kv_factor != 1:
        out = out.repeat_interleave(kv_factor, dim=-1)
    return out


def split_block_sizes(block_sizes: torch.Tensor, factor: int, physical_block: int) -> torch.Tensor:
    """Logical sizes -> physical sizes: ``clamp(size - physical_block * i, 0, physical_block)``
    for ``i < factor``, so the valid tokens stay the leading ones."""
    sizes = block_sizes.to(torch.int32)
    if factor == 1:
        return sizes.contiguous()
    offsets = torch.arange(factor, device=sizes.device, dtype=torch.int32) * physical_block
    return torch.clamp(sizes[:, None] - offsets[None, :], min=0, max=physical_block).reshape(-1)


def physical_layout(block_map: torch.Tensor, kv_block_sizes: torch.Tensor, block_size: int, q_tile: int,
                    kv_tile: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Logical map/sizes at ``block_size`` -> (physical map, physical sizes) for kernels that run
    ``q_tile x kv_tile`` tiles (each dividing ``block_size``): every logical pair becomes the
    ``(block_size // q_tile) x (block_size // kv_tile)`` physical pairs it covers."""
    phys_map = expand_block_map(block_map, block_size // q_tile, block_size // kv_tile)
    phys_sizes = split_block_sizes(kv_block_sizes, block_size // kv_tile, kv_tile)
    return phys_map, phys_sizes


_SPLIT = None  # split_q2k_launch once imported; False if Triton is not importable


def split_q2k(idx: torch.Tensor, num: torch.Tensor, sizes: Optional[torch.Tensor], ratio: int,
              seqlen_k: int) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """q2k lists of ``ratio * 64``-token blocks -> the 64-token tile lists that cover them:
    ``(idx [B, H, Qb * ratio, W * ratio], num [B, H, Qb * ratio], sizes [KVb * ratio] or None)``.

    Query block ``t`` becomes tiles ``t * ratio + e``, each with the block's list; kv block ``n``
    becomes tiles ``n * ratio + f`` of ``clamp(min(size[n], seqlen_k - n * ratio * 64) - 64 f, 0,
    64)`` keys (``sizes`` None: every block full up to ``seqlen_k``). Tiles with no key are left
    out of the lists (exact: they add nothing), the kept ones ascending; entries past a row's
    count are filler never read. ``idx`` / ``num`` int32 contiguous (``BlockSparsity.q2k``).

    On CUDA (not while ``torch.compile`` traces) one Triton launch
    (``fastvideo_cute.kernels.triton.tile_lists``), else :func:`_split_q2k_torch`, the reference:
    the same counts and kept entries."""
    if ratio not in (2, 4):
        raise ValueError(f"split_q2k: ratio must be 2 or 4 (128- or 256-token blocks), got {ratio!r}")
    global _SPLIT
    if idx.is_cuda and not torch.compiler.is_compiling():
        if _SPLIT is None:
            try:
                from fastvideo_cute.kernels.triton.tile_lists import split_q2k_launch
            except Exception:  # noqa: BLE001 - no usable Triton: the torch path
                _SPLIT = False
            else:
                _SPLIT = split_q2k_launch
        if _SPLIT:
            b, h, qb, w = idx.shape
            out_idx = torch.empty((b, h, qb * ratio, w * ratio), dtype=torch.int32, device=idx.device)
            out_num = torch.empty((b, h, qb * ratio), dtype=torch.int32, device=idx.device)
            out_sizes = None
            if sizes is not None:
                sizes = sizes.to(torch.int32).contiguous()
                out_sizes = torch.empty(sizes.numel() * ratio, dtype=torch.int32, device=idx.device)
            _SPLIT(idx, num, sizes, out_idx, out_num, out_sizes, ratio=ratio, seqlen_k=seqlen_k)
            return out_idx, out_num, out_sizes
    return _split_q2k_torch(idx, num, sizes, ratio, seqlen_k)


def _split_q2k_torch(idx, num, sizes, ratio: int, seqlen_k: int):
    """The torch-ops form of :func:`split_q2k` (the reference and the CPU path); its filler past
    the counts is the dropped tiles."""
    b, h, qb, w = idx.shape
    block = ratio * 64
    valid = torch.arange(w, device=idx.device) < num.clamp(0, w)[..., None]
    n = torch.where(valid, idx, 0).long()
    size = torch.clamp(seqlen_k - n * block, max=block)
    if sizes is not None:
        size = torch.minimum(size, sizes.long()[n])
    f = torch.arange(ratio, device=idx.device)
    keep = (valid[..., None] & (size[..., None] - 64 * f > 0)).reshape(b, h, qb, w * ratio)
    tiles = (n[..., None] * ratio + f).reshape(b, h, qb, w * ratio)
    order = torch.sort((~keep).to(torch.int8), dim=-1, stable=True).indices
    out_idx = torch.gather(tiles, -1, order).to(torch.int32).repeat_interleave(ratio, dim=2).contiguous()
    out_num = keep.sum(-1).to(torch.int32).repeat_interleave(ratio, dim=2).contiguous()
    out_sizes = None if sizes is None else split_block_sizes(sizes, ratio, 64).contiguous()
    return out_idx, out_num, out_sizes


class BlockSparsity:
    """The kv blocks each query block attends to in one call: a bool map ``[B, H, Qb, KVb]``
    and/or q2k lists (``idx [B, H, Qb, W]`` int32 whose first ``num [B, H, Qb]`` entries are
    distinct kv ids in ``[0, KVb)``, ascending; entries past ``num`` are never read).

    Made by the ops from what the caller passed (validated there); each form is built from the
    other at most once (:meth:`block_map`, :meth:`q2k`). Lists built from a map are
    :func:`map_to_index`'s; a map built from lists is :func:`index_to_map`'s, so both forms
    describe the same selection and a list-walking kernel sees the same (ascending) order either
    way: results do not depend on which form arrived.
    """

    __slots__ = ("_map", "_idx", "_num", "num_kv_blocks", "has_lists")

    def __init__(self, block_map: Optional[torch.Tensor] = None, q2k_idx: Optional[torch.Tensor] = None,
                 q2k_num: Optional[torch.Tensor] = None, num_kv_blocks: Optional[int] = None):
        if block_map is None and (q2k_idx is None or q2k_num is None):
            raise ValueError("BlockSparsity needs block_map or both q2k_idx and q2k_num")
        if block_map is None and num_kv_blocks is None:
            raise ValueError("BlockSparsity from lists needs num_kv_blocks")
        self._map, self._idx, self._num = block_map, q2k_idx, q2k_num
        self.has_lists = q2k_idx is not None  # what arrived (lists built later do not change it)
        self.num_kv_blocks = int(block_map.shape[-1]) if block_map is not None else int(num_kv_blocks)

    @classmethod
    def of(cls, x) -> "BlockSparsity":
        """``x`` itself when it is one, else a bool map wrapped (backends take either)."""
        return x if isinstance(x, cls) else cls(block_map=x)

    def block_map(self) -> torch.Tensor:
        if self._map is None:
            self._map = index_to_map(self._idx, self._num, self.num_kv_blocks)
        return self._map

    def q2k(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(idx, num)``, int32 and contiguous."""
        if self._idx is None:
            self._idx, self._num = map_to_index(self._map)
        if self._idx.dtype != torch.int32 or not self._idx.is_contiguous():
            self._idx = self._idx.to(torch.int32).contiguous()
        if self._num.dtype != torch.int32 or not self._num.is_contiguous():
            self._num = self._num.to(torch.int32).contiguous()
        return self._idx, self._num

    def k2q(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """The transposed lists (``idx [B, H, KVb, Qb]``, ``num [B, H, KVb]``, int32, contiguous):
        the first ``num[b, h, j]`` entries of ``idx[b, h, j]`` are the q blocks that selected kv
        block ``j``, ascending.

        With :data:`FUSED_K2Q` on, a CUDA map (Triton importable, not while ``torch.compile`` traces) takes one
        ``fastvideo_cute.kernels.triton.k2q_lists`` launch, which writes only those entries: the
        rest of each row is unspecified (uninitialised memory). Every other map takes
        :func:`map_to_index` of the transposed map, whose rows go on with the unselected q blocks.
        Consumers (the sm90 / sm100 backward) read only the first ``num`` entries of a row."""
        block_map = self.block_map()
        _check_map(block_map)
        if FUSED_K2Q and block_map.is_cuda and block_map.dim() >= 2 and not torch.compiler.is_compiling():
            fused = _fused_k2q_lists()
            if fused is not None:
                return fused(block_map)
        return map_to_index(block_map.transpose(-2, -1))
