"""Input checks shared by every public op. They run before any launch and name the argument
at fault. Shape/dtype checks are free; the ``variable_block_sizes`` range check reads the
tensor (a host sync), so a pass is remembered per live tensor and its version counter, and the
check is skipped while tracing under torch.compile (fake tensors have no values)."""

from __future__ import annotations

import weakref

import torch

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INT_DTYPES = (torch.int32, torch.int64, torch.int16, torch.uint8)

__all__ = ["check_qkv", "check_block_map", "check_block_sizes", "has_partial_blocks", "Shapes"]


class Shapes(tuple):
    """(batch, heads, q_len, kv_len, head_dim) of a validated call."""

    batch = property(lambda s: s[0])
    heads = property(lambda s: s[1])
    q_len = property(lambda s: s[2])
    kv_len = property(lambda s: s[3])
    head_dim = property(lambda s: s[4])


def _check_tensor(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"{name} must be 4-D, got shape {tuple(x.shape)}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {x.dtype}")
    if x.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last (head_dim) dimension, got strides {tuple(x.stride())}")


def check_qkv(q, k, v, *, bshd: bool, block_size: int) -> Shapes:
    """Check q/k/v for a ``[B, H, S, D]`` (or ``[B, S, H, D]`` when ``bshd``) call."""
    layout = "[B, S, H, D]" if bshd else "[B, H, S, D]"
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, x)
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {x.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    s_dim, h_dim = (1, 2) if bshd else (2, 1)
    batch, heads, q_len, head_dim = q.shape[0], q.shape[h_dim], q.shape[s_dim], q.shape[3]
    kv_len = k.shape[s_dim]
    if k.shape[0] != batch or k.shape[h_dim] != heads:
        raise ValueError(f"k/v batch and heads must match q's {layout}: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if k.shape[3] != head_dim:
        raise ValueError(f"k/v head_dim {k.shape[3]} must equal q's head_dim {head_dim}")
    if head_dim % 8 != 0 or not 8 <= head_dim <= 256:
        raise ValueError(f"head_dim must be a multiple of 8 in [8, 256], got {head_dim}")
    if q_len == 0 or q_len % block_size != 0:
        raise ValueError(f"q's sequence length {q_len} must be a positive multiple of the block size {block_size}")
    if kv_len == 0 or kv_len % block_size != 0:
        raise ValueError(f"k/v sequence length {kv_len} must be a positive multiple of the block size {block_size}")
    return Shapes((batch, heads, q_len, kv_len, head_dim))


def check_block_map(block_map, shapes: Shapes, block_size: int, device: torch.device) -> torch.Tensor:
    """Return the map as ``[B, H, Qb, KVb]`` bool (a broadcast view for a 3-D map)."""
    if not isinstance(block_map, torch.Tensor):
        raise TypeError(f"block_map must be a torch.Tensor, got {type(block_map).__name__}")
    if block_map.dtype != torch.bool:
        raise TypeError(f"block_map must be a bool tensor, got {block_map.dtype}")
    if block_map.device != device:
        raise ValueError(f"block_map must be on q's device {device}, got {block_map.device}")
    qb, kvb = shapes.q_len // block_size, shapes.kv_len // block_size
    expected = (shapes.batch, shapes.heads, qb, kvb)
    if block_map.dim() == 3:
        if tuple(block_map.shape) != expected[1:]:
            raise ValueError(f"block_map must have shape [H, Qb, KVb] = {list(expected[1:])} "
                             f"or [B, H, Qb, KVb] = {list(expected)}, got {list(block_map.shape)}")
        return block_map.unsqueeze(0).expand(expected)
    if block_map.dim() != 4 or tuple(block_map.shape) != expected:
        raise ValueError(f"block_map must have shape [B, H, Qb, KVb] = {list(expected)}, got {list(block_map.shape)}")
    return block_map


# id(tensor) -> (version, block_size, has a partial block) of a tensor whose range was checked. The entry is
# dropped when the tensor dies, and a write to it bumps its version, so a stale pass is impossible.
_RANGE_OK: dict = {}


def check_block_sizes(sizes, num_blocks: int, block_size: int, device: torch.device,
                      name: str = "variable_block_sizes") -> torch.Tensor:
    """Return the sizes as contiguous int32 ``[num_blocks]`` after checking shape and range."""
    if not isinstance(sizes, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(sizes).__name__}")
    if sizes.dtype not in _INT_DTYPES:
        raise TypeError(f"{name} must be an integer tensor (int32 preferred), got {sizes.dtype}")
    if sizes.device != device:
        raise ValueError(f"{name} must be on q's device {device}, got {sizes.device}")
    if sizes.dim() != 1 or sizes.numel() != num_blocks:
        raise ValueError(f"{name} must be 1-D with one entry per block ({num_blocks}), got shape {list(sizes.shape)}")
    if not torch.compiler.is_compiling():
        entry = _RANGE_OK.get(id(sizes))
        if entry is None or entry[:2] != (sizes._version, block_size):
            lo, hi = int(sizes.min()), int(sizes.max())
            if lo < 0 or hi > block_size:
                raise ValueError(f"{name} must lie in [0, {block_size}], got values in [{lo}, {hi}]")
            if entry is None:
                weakref.finalize(sizes, _RANGE_OK.pop, id(sizes), None)
            _RANGE_OK[id(sizes)] = (sizes._version, block_size, lo < block_size)
    return sizes if sizes.dtype == torch.int32 and sizes.is_contiguous() else sizes.to(torch.int32).contiguous()


def has_partial_blocks(sizes: torch.Tensor, block_size: int) -> bool:
    """Whether some block is shorter than ``block_size``, from the range check's record when it
    has one for this tensor (no sync); True (the safe answer) when unknown."""
    entry = _RANGE_OK.get(id(sizes))
    if entry is not None and entry[:2] == (sizes._version, block_size):
        return entry[2]
    return True
