"""3D video tiling: raster token order <-> padded tile order.

A latent token grid ``(T, H, W)`` is stored in raster order (t-major, then h, then w):
``token = (t * H + h) * W + w``. VSA cuts it into tiles of shape ``tile = (tt, th, tw)``
(e.g. ``(4, 4, 4)`` = 64 tokens, ``(2, 8, 8)`` = 128, ``(4, 8, 8)`` = 256).

Layout of the *padded tiled sequence* (length :func:`padded_length`):

- There are ``ceil(T/tt) * ceil(H/th) * ceil(W/tw)`` tiles, ordered raster over the tile grid
  (tile-t major, then tile-h, then tile-w). Every tile owns ``prod(tile)`` consecutive slots.
- The grid need not be divisible by the tile; edge tiles are then partial, with extent
  ``(et, eh, ew)`` = ``min(tile, grid - tile_origin)`` per dim and ``size = et * eh * ew``
  real tokens (:func:`variable_block_sizes`).
- Inside a tile the leading ``size`` slots hold its real tokens, raster over the tile's
  *actual* extent: in-tile position ``(i, j, k)`` sits at slot ``(i * eh + j) * ew + k``.
  The remaining ``prod(tile) - size`` slots are padding (zeros in :func:`to_tiles`).

Everything is plain torch, built directly on the requested device with ``arange``
arithmetic (no host <-> device copies, no host synchronisation). The index tensors depend
only on ``(grid, tile, device)`` and are cached (``functools.lru_cache``); the public
getters return a fresh copy of the cached tensor, so callers may modify what they get
without corrupting the cache. :func:`to_tiles` / :func:`from_tiles` use the cached tensors
internally and never expose them.

Caveat for CUDA graphs: build the indices (call any function here once for the shape and
device) before capture, so that the cached tensors are not allocated from a graph's
private memory pool.
"""

from __future__ import annotations

import functools
import operator
from typing import Optional, Sequence, Tuple, Union

import torch

__all__ = [
    "tile_counts",
    "padded_length",
    "variable_block_sizes",
    "tile_gather_index",
    "tile_scatter_index",
    "to_tiles",
    "from_tiles",
]

Shape3 = Tuple[int, int, int]
DeviceLike = Union[str, torch.device, int, None]

_CACHE_SIZE = 64


# ----------------------------------------------------------------------------- validation


def _check_shape3(value: object, name: str) -> Shape3:
    """``value`` as a tuple of 3 positive Python ints, else ``ValueError`` naming ``name``."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 1:
            raise ValueError(f"{name} must be 3 positive ints, got a tensor of shape {tuple(value.shape)}")
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        try:
            value = tuple(value)  # type: ignore[arg-type]
        except TypeError:
            raise ValueError(f"{name} must be a sequence of 3 positive ints, got {value!r}") from None
    if len(value) != 3:
        raise ValueError(f"{name} must have exactly 3 entries (t, h, w), got {len(value)}: {value!r}")
    out = []
    for v in value:
        if isinstance(v, bool):
            raise ValueError(f"{name} entries must be ints, got bool in {value!r}")
        try:
            iv = operator.index(v)
        except TypeError:
            raise ValueError(f"{name} entries must be ints, got {type(v).__name__} in {value!r}") from None
        if iv <= 0:
            raise ValueError(f"{name} entries must be positive, got {tuple(value)!r}")
        out.append(int(iv))
    return (out[0], out[1], out[2])


def _check(grid: object, tile: object) -> Tuple[Shape3, Shape3]:
    return _check_shape3(grid, "grid"), _check_shape3(tile, "tile")


def _norm_device(device: DeviceLike) -> torch.device:
    """Canonical cache key: ``None`` -> cpu; an index-less accelerator gets the current index."""
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError) as e:
        raise ValueError(f"device is not a valid torch device: {device!r} ({e})") from None
    if dev.index is None and dev.type not in ("cpu", "meta"):
        # "cuda" means the current device; pin it so the cache key is unambiguous.
        dev = torch.empty(0, device=dev).device
    return dev


def _check_dim(x: torch.Tensor, dim: int, name: str) -> int:
    if isinstance(dim, bool):
        raise ValueError(f"dim must be an int, got {dim!r}")
    try:
        d = operator.index(dim)
    except TypeError:
        raise ValueError(f"dim must be an int, got {type(dim).__name__}") from None
    if x.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension (the token dimension `dim`)")
    if not -x.dim() <= d < x.dim():
        raise ValueError(f"dim={dim} is out of range for {name} with {x.dim()} dimensions")
    return d % x.dim()


# ----------------------------------------------------------------------------- shapes


def tile_counts(grid: Sequence[int], tile: Sequence[int]) -> Shape3:
    """Tiles per dim: ``(ceil(T/tt), ceil(H/th), ceil(W/tw))``."""
    g, t = _check(grid, tile)
    return (-(-g[0] // t[0]), -(-g[1] // t[1]), -(-g[2] // t[2]))


def padded_length(grid: Sequence[int], tile: Sequence[int]) -> int:
    """Length of the padded tiled sequence: ``num_tiles * prod(tile)``."""
    n = tile_counts(grid, tile)
    t = _check_shape3(tile, "tile")
    return n[0] * n[1] * n[2] * t[0] * t[1] * t[2]


# ----------------------------------------------------------------------------- cached builders


def _inference_safe():
    """Build cached tensors as normal tensors even when first called under inference_mode /
    no_grad, so that later autograd-enabled callers can save them for backward."""
    return torch.inference_mode(False)


def _extents(n: int, size: int, full: int, device: torch.device) -> torch.Tensor:
    """Actual extent of each of the ``n`` tiles along one dim (int64 ``[n]``)."""
    start = torch.arange(n, device=device, dtype=torch.int64) * size
    return torch.clamp(full - start, max=size)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _sizes_cached(grid: Shape3, tile: Shape3, device: torch.device) -> torch.Tensor:
    nt, nh, nw = tile_counts(grid, tile)
    with _inference_safe(), torch.no_grad():
        et = _extents(nt, tile[0], grid[0], device)
        eh = _extents(nh, tile[1], grid[1], device)
        ew = _extents(nw, tile[2], grid[2], device)
        sizes = et[:, None, None] * eh[None, :, None] * ew[None, None, :]
        return sizes.reshape(-1).to(torch.int32)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _gather_cached(grid: Shape3, tile: Shape3, device: torch.device) -> torch.Tensor:
    T, H, W = grid
    tt, th, tw = tile
    nt, nh, nw = tile_counts(grid, tile)
    P = tt * th * tw
    with _inference_safe(), torch.no_grad():
        i64 = dict(device=device, dtype=torch.int64)
        # Per-tile origin and extent, broadcast to [nt, nh, nw, 1].
        t0 = (torch.arange(nt, **i64) * tt).view(-1, 1, 1, 1)
        h0 = (torch.arange(nh, **i64) * th).view(1, -1, 1, 1)
        w0 = (torch.arange(nw, **i64) * tw).view(1, 1, -1, 1)
        et = torch.clamp(T - t0, max=tt)
        eh = torch.clamp(H - h0, max=th)
        ew = torch.clamp(W - w0, max=tw)
        s = torch.arange(P, **i64).view(1, 1, 1, -1)
        plane = eh * ew
        i = s // plane
        rem = s - i * plane
        j = rem // ew
        k = rem - j * ew
        token = ((t0 + i) * H + (h0 + j)) * W + (w0 + k)
        valid = s < et * plane
        out = torch.where(valid, token, torch.full_like(token, -1))
        return out.reshape(-1).contiguous()


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _scatter_cached(grid: Shape3, tile: Shape3, device: torch.device) -> torch.Tensor:
    T, H, W = grid
    tt, th, tw = tile
    _, nh, nw = tile_counts(grid, tile)
    P = tt * th * tw
    with _inference_safe(), torch.no_grad():
        i64 = dict(device=device, dtype=torch.int64)
        t = torch.arange(T, **i64).view(-1, 1, 1)
        h = torch.arange(H, **i64).view(1, -1, 1)
        w = torch.arange(W, **i64).view(1, 1, -1)
        a, i = t // tt, t % tt
        b, j = h // th, h % th
        c, k = w // tw, w % tw
        eh = torch.clamp(H - b * th, max=th)
        ew = torch.clamp(W - c * tw, max=tw)
        tile_id = (a * nh + b) * nw + c
        slot = tile_id * P + (i * eh + j) * ew + k
        return slot.reshape(-1).contiguous()


def _is_identity(grid: Shape3, tile: Shape3) -> bool:
    """True when the tiled layout equals raster order with no padding (one tile along h and
    w covering them exactly, and t divisible by tt)."""
    return tile[1] == grid[1] and tile[2] == grid[2] and grid[0] % tile[0] == 0


# ----------------------------------------------------------------------------- public indices


def variable_block_sizes(
    grid: Sequence[int], tile: Sequence[int], device: DeviceLike = None
) -> torch.Tensor:
    """Valid (real) tokens per tile, int32 ``[num_tiles]``, tiles in raster tile order.

    ``device=None`` means cpu. Returns a fresh tensor (a copy of the cached one).
    """
    g, t = _check(grid, tile)
    return _sizes_cached(g, t, _norm_device(device)).clone()


def tile_gather_index(
    grid: Sequence[int], tile: Sequence[int], device: DeviceLike = None
) -> torch.Tensor:
    """For each slot of the padded tiled sequence, the raster token it holds; ``-1`` for
    padding. int64 ``[num_tiles * prod(tile)]``.

    ``device=None`` means cpu. Returns a fresh tensor (a copy of the cached one).
    """
    g, t = _check(grid, tile)
    return _gather_cached(g, t, _norm_device(device)).clone()


def tile_scatter_index(
    grid: Sequence[int], tile: Sequence[int], device: DeviceLike = None
) -> torch.Tensor:
    """For each raster token, its slot in the padded tiled sequence. int64 ``[T*H*W]``.

    Inverse of :func:`tile_gather_index` on the valid slots:
    ``gather[scatter] == arange(T*H*W)``. ``device=None`` means cpu. Returns a fresh tensor
    (a copy of the cached one).
    """
    g, t = _check(grid, tile)
    return _scatter_cached(g, t, _norm_device(device)).clone()


# ----------------------------------------------------------------------------- permutations


def _to_tiles_impl(x: torch.Tensor, g: Shape3, t: Shape3, dim: int) -> torch.Tensor:
    if _is_identity(g, t):
        return x.clone()
    n = g[0] * g[1] * g[2]
    length = padded_length(g, t)
    dev = x.device
    if length == n:
        # No padding: a pure permutation, one gather.
        return x.index_select(dim, _gather_cached(g, t, dev))
    shape = list(x.shape)
    shape[dim] = length
    out = x.new_zeros(shape)
    out.index_copy_(dim, _scatter_cached(g, t, dev), x)
    return out


def _from_tiles_impl(x_tiled: torch.Tensor, g: Shape3, t: Shape3, dim: int) -> torch.Tensor:
    if _is_identity(g, t):
        return x_tiled.clone()
    return x_tiled.index_select(dim, _scatter_cached(g, t, x_tiled.device))


class _ToTiles(torch.autograd.Function):
    # Backward of a permutation-with-padding is the inverse permutation (padding grads are
    # dropped); written as a Function so neither direction needs index_add / atomics.
    @staticmethod
    def forward(ctx, x, g, t, dim):  # type: ignore[override]
        ctx.g, ctx.t, ctx.dim = g, t, dim
        return _to_tiles_impl(x, g, t, dim)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _FromTiles.apply(grad, ctx.g, ctx.t, ctx.dim), None, None, None


class _FromTiles(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_tiled, g, t, dim):  # type: ignore[override]
        ctx.g, ctx.t, ctx.dim = g, t, dim
        return _from_tiles_impl(x_tiled, g, t, dim)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _ToTiles.apply(grad, ctx.g, ctx.t, ctx.dim), None, None, None


def to_tiles(x: torch.Tensor, grid: Sequence[int], tile: Sequence[int], dim: int) -> torch.Tensor:
    """Raster tokens -> padded tiled sequence along ``dim``.

    ``x`` has ``T*H*W`` tokens along ``dim`` (any layout: BSHD uses ``dim=1``, BHSD
    ``dim=2``). The result has :func:`padded_length` entries along ``dim``, slot ``s``
    holding token ``tile_gather_index(...)[s]``; padding slots are exactly zero. Always
    returns a new tensor (never a view of ``x``). Differentiable: the gradient of ``x`` is
    :func:`from_tiles` of the incoming gradient (padding slots contribute nothing).
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    g, t = _check(grid, tile)
    d = _check_dim(x, dim, "x")
    n = g[0] * g[1] * g[2]
    if x.shape[d] != n:
        raise ValueError(
            f"x.shape[{dim}] must equal T*H*W = {n} for grid={g}, got {x.shape[d]} (x.shape={tuple(x.shape)})"
        )
    return _ToTiles.apply(x, g, t, d)


def from_tiles(
    x_tiled: torch.Tensor, grid: Sequence[int], tile: Sequence[int], dim: int
) -> torch.Tensor:
    """Padded tiled sequence -> raster tokens along ``dim`` (inverse of :func:`to_tiles`).

    ``x_tiled`` has :func:`padded_length` entries along ``dim``; padding slots are ignored
    (whatever they hold). Always returns a new tensor. Differentiable: the gradient of
    ``x_tiled`` is :func:`to_tiles` of the incoming gradient, so padding slots get exactly
    zero gradient.
    """
    if not isinstance(x_tiled, torch.Tensor):
        raise ValueError(f"x_tiled must be a torch.Tensor, got {type(x_tiled).__name__}")
    g, t = _check(grid, tile)
    d = _check_dim(x_tiled, dim, "x_tiled")
    length = padded_length(g, t)
    if x_tiled.shape[d] != length:
        raise ValueError(
            f"x_tiled.shape[{dim}] must equal padded_length(grid, tile) = {length} for grid={g}, "
            f"tile={t}, got {x_tiled.shape[d]} (x_tiled.shape={tuple(x_tiled.shape)})"
        )
    return _FromTiles.apply(x_tiled, g, t, d)
