"""Input checks shared by every public op. They run before any launch and name the argument at
fault.

Shape/dtype/device checks are free. The ``variable_block_sizes`` range check reads values, which
for a CUDA tensor is a host sync, so :func:`check_sizes_range` remembers a pass per live tensor:

- keyed on the tensor's identity, data pointer, version counter (``None`` for inference tensors,
  which have none) and the block size; an in-place write bumps the version and forces a re-check;
- CPU tensors are re-checked on every call (no GPU sync is involved), which also catches writes
  through ``.numpy()`` that no version counter sees;
- a remembered CUDA pass is backed by a device-side assert on every call (no sync: one Triton
  launch, ``kernels/triton/sizes_backstop``; ``aminmax`` and ``torch._assert_async`` without
  Triton or for sizes that are not int32 contiguous), which catches what no host record can see — writes
  through ``.data``, or in place to an inference tensor — that leave the range or break a cached
  "every block is full" record (the FA4 route then skips the padding pass). It is a documented
  device-side assert (a CUDA error), not a ``ValueError``: re-create the sizes tensor instead of
  writing through ``.data``.

The check runs inside the forward op too, so it also holds under ``torch.compile`` (the op body
runs eagerly on real tensors); meta and fake tensors have no values and skip it. While a CUDA
graph is captured a tensor not seen before is checked by the device-side assert only.
"""

from __future__ import annotations

import weakref
from typing import Optional, Sequence

import torch

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: integer dtypes accepted for sizes (int32 preferred: others are converted on every call)
SIZE_DTYPES = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)

__all__ = ["check_qkv", "check_block_map", "check_block_sizes", "check_sizes_range", "has_partial_blocks",
           "smallest_block", "Shapes", "SIZE_DTYPES"]


class Shapes(tuple):
    """(batch, heads, q_len, kv_len, head_dim) of a validated call."""

    batch = property(lambda s: s[0])
    heads = property(lambda s: s[1])
    q_len = property(lambda s: s[2])
    kv_len = property(lambda s: s[3])
    head_dim = property(lambda s: s[4])


def _dtype_names(dtypes) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def _check_tensor(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"{name} must be 4-D, got shape {tuple(x.shape)}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {x.dtype}")
    if x.stride(-1) != 1 and x.shape[-1] > 1:
        raise ValueError(f"{name} must have a contiguous last (head_dim) dimension, got strides {tuple(x.stride())}")


def check_qkv(q, k, v, *, bshd: bool, block_size: int, head_dims: Optional[Sequence[int]] = None) -> Shapes:
    """Check q/k/v for a ``[B, H, S, D]`` (or ``[B, S, H, D]`` when ``bshd``) call. ``head_dims``:
    the head dims some route serves (the API passes the backends' union)."""
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
    if head_dims is not None and head_dim not in head_dims:
        raise ValueError(f"head_dim must be one of {tuple(sorted(head_dims))} (the head dims a route serves), "
                         f"got {head_dim}")
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


# id(tensor) -> (key, smallest entry) of a tensor whose range was checked ("some block is partial"
# is smallest < block_size); dropped when it dies.
_RANGE_OK: dict = {}


def _has_values(t: torch.Tensor) -> bool:
    return t.device.type != "meta" and not isinstance(t, torch._subclasses.FakeTensor)


def _record_key(sizes: torch.Tensor, block_size: int):
    version = None if sizes.is_inference() else sizes._version
    return (version, sizes.data_ptr(), tuple(sizes.shape), block_size)


def _remember(sizes: torch.Tensor, key, smallest: int) -> None:
    if id(sizes) not in _RANGE_OK:
        weakref.finalize(sizes, _RANGE_OK.pop, id(sizes), None)
    _RANGE_OK[id(sizes)] = (key, smallest)


def _device_backstop(sizes: torch.Tensor, block_size: int, name: str, smallest: int = 0) -> None:
    """Queue the device-side check ``smallest <= sizes <= block_size`` (no host sync). One Triton
    launch for int32 contiguous sizes (``kernels/triton/sizes_backstop``: 1.0 us of GPU time against
    7.0 us for the five torch launches on the H200, ``benchmarks/results/metadata_sweep_h200.json``),
    the torch ops otherwise."""
    message = (f"{name} changed behind the library's back (a write through .data, or in place to an "
               f"inference tensor) and left the range its first check recorded; re-create the tensor instead")
    launch = _backstop_kernel() if sizes.dtype == torch.int32 and sizes.is_contiguous() else None
    if launch is not None:
        with torch.cuda.device(sizes.device):
            launch(sizes, smallest, block_size, message)
        return
    lo, hi = torch.aminmax(sizes)
    ok = (lo >= smallest) & (hi <= block_size)
    torch._assert_async(ok, message + f" [{smallest}, {block_size}]")


_BACKSTOP = None  # the Triton launch once imported; False when Triton cannot be imported


def _backstop_kernel():
    global _BACKSTOP
    if _BACKSTOP is None:
        try:
            from .kernels.triton.sizes_backstop import sizes_backstop_launch
        except ImportError:
            _BACKSTOP = False
        else:
            _BACKSTOP = sizes_backstop_launch
    return _BACKSTOP or None


def check_sizes_range(sizes: torch.Tensor, block_size: int, name: str = "variable_block_sizes") -> None:
    """Raise ``ValueError`` unless every entry of ``sizes`` lies in ``[0, block_size]`` (see the
    module docstring for what is remembered, and the device-side backstop)."""
    if not _has_values(sizes) or sizes.numel() == 0:
        return
    key = _record_key(sizes, block_size)
    entry = _RANGE_OK.get(id(sizes))
    if entry is not None and entry[0] == key and sizes.device.type != "cpu":
        _device_backstop(sizes, block_size, name, entry[1])
        return
    if sizes.is_cuda and torch.cuda.is_current_stream_capturing():
        # A host read is illegal while a CUDA graph is captured: check on the device only (call
        # once before capture to get the ValueError and the "every block full" record).
        _device_backstop(sizes, block_size, name)
        return
    lo, hi = (int(x) for x in torch.aminmax(sizes))
    if lo < 0 or hi > block_size:
        raise ValueError(f"{name} must lie in [0, {block_size}], got values in [{lo}, {hi}]")
    _remember(sizes, key, lo)


def check_block_sizes(sizes, num_blocks: int, block_size: int, device: torch.device,
                      name: str = "variable_block_sizes") -> torch.Tensor:
    """Return the sizes as contiguous int32 ``[num_blocks]`` after checking type, shape, device
    and range. A converted copy inherits the original's range record."""
    if not isinstance(sizes, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(sizes).__name__}")
    if sizes.dtype not in SIZE_DTYPES:
        raise TypeError(f"{name} must be an integer tensor ({_dtype_names(SIZE_DTYPES)}; int32 preferred), "
                        f"got {sizes.dtype}")
    if sizes.device != device:
        raise ValueError(f"{name} must be on q's device {device}, got {sizes.device}")
    if sizes.dim() != 1 or sizes.numel() != num_blocks:
        raise ValueError(f"{name} must be 1-D with one entry per block ({num_blocks}), got shape {list(sizes.shape)}")
    if not torch.compiler.is_compiling():
        check_sizes_range(sizes, block_size, name)
    if sizes.dtype == torch.int32 and sizes.is_contiguous():
        return sizes
    converted = sizes.to(torch.int32).contiguous()
    entry = _RANGE_OK.get(id(sizes))
    if entry is not None and _has_values(converted):
        _remember(converted, _record_key(converted, block_size), entry[1])
    return converted


def has_partial_blocks(sizes: torch.Tensor, block_size: int) -> bool:
    """Whether some block is shorter than ``block_size``, from the range check's record when it
    has one for this tensor (no sync); True (the safe answer) when unknown, as while
    ``torch.compile`` traces."""
    smallest = smallest_block(sizes, block_size)
    return smallest is None or smallest < block_size


def smallest_block(sizes: torch.Tensor, block_size: int) -> Optional[int]:
    """The smallest entry of ``sizes`` from the range check's record (no sync; the device-side
    backstop guards it), or None when unknown (no record, or ``torch.compile`` tracing)."""
    if torch.compiler.is_compiling():
        return None
    entry = _RANGE_OK.get(id(sizes))
    if entry is not None and _has_values(sizes) and entry[0] == _record_key(sizes, block_size):
        return entry[1]
    return None
