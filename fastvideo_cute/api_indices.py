"""Index-native block-sparse attention: ``block_sparse_attn*_from_indices``.

The map API's contract (docs/semantics.md) with the block map given as q2k lists, in
FastVideo's layout:

- ``q2k_idx``: integer ``[B, H, Qb, W]`` (or ``[H, Qb, W]``, shared by every batch entry). The
  first ``q2k_num[b, h, i]`` entries of row ``(b, h, i)`` are the kv blocks query block ``i``
  attends to, in any order, each in ``[0, KVb)``, no duplicates. Entries at or past
  ``q2k_num`` are never read (FastVideo's ``map_to_index`` fills them with -1).
- ``q2k_num``: integer ``[B, H, Qb]`` (or ``[H, Qb]``, with a 3-D ``q2k_idx``), in ``[0, W]``.

Dataflow: ``check_qkv`` / ``check_block_sizes`` (validation.py) -> :func:`check_index_lists`
(shapes, dtypes, device; then the values) -> :func:`_lists_to_op`, the one place lists meet
the op. There the lists are sorted ascending per row (one device sort) and go to the op as
lists: a backend whose kernels take lists (cuDNN BSA, the Triton forward at its native tile)
never sees a bool map; the others build the map from them. Ascending rows are what the map API's
``map_to_index`` gives, so list order does not matter and the result equals the map API's bit
for bit. (Under ``torch.compile`` / CUDA-graph capture the values are not checked, so the lists
take the map API's path through one bounds-safe scatter instead.)

Value checks (counts in ``[0, W]``, indices in ``[0, KVb)``, no duplicates) run as one device
reduction read back once: a host sync. As with the sizes range check in validation.py, a pass
is remembered per (tensor identity, version counter) pair, so calls that reuse the same list
tensors sync once; inference tensors (no version counter) are checked on every call. The
checks are skipped while ``torch.compile`` traces (fake tensors have no values) and while a
CUDA graph captures (a sync is illegal there); in those cases an invalid entry is dropped by
the scatter instead of read out of bounds. :func:`checked_once` is that cache, shared with
``varlen.py`` and ``compat``.
"""

from __future__ import annotations

import weakref
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import api
from .validation import check_block_sizes, check_qkv

__all__ = [
    "block_sparse_attn_from_indices",
    "block_sparse_attn_bshd_from_indices",
    "block_sparse_attn_128_from_indices",
    "block_sparse_attn_128_bshd_from_indices",
    "block_sparse_attn_256_from_indices",
    "block_sparse_attn_256_bshd_from_indices",
    "check_index_lists",
    "check_index_values",
    "checked_once",
    "values_unreadable",
]

INDEX_DTYPES = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)

# ------------------------------------------------------------------ cached value checks

# key -> True for a value check that passed. A key holds (id, version) of every tensor it read;
# the entry is dropped when any of them dies, and an in-place write bumps a version, so a stale
# pass cannot be reused.
_PASSED: Dict[tuple, bool] = {}


def values_unreadable(tensors: Sequence[Tensor]) -> bool:
    """True while torch.compile traces or a CUDA graph captures: no value can be read back."""
    if torch.compiler.is_compiling():
        return True
    if any(t.is_cuda for t in tensors) and torch.cuda.is_available():
        return torch.cuda.is_current_stream_capturing()
    return False


def checked_once(tensors: Sequence[Tensor], extra: tuple, check: Callable[[], None]) -> None:
    """Run ``check()`` (which raises on bad values) unless it already passed for these very
    tensors, unmodified, with the same ``extra`` (the static facts the check depends on).
    Skipped when values cannot be read (see :func:`values_unreadable`)."""
    if values_unreadable(tensors):
        return
    if any(t.is_inference() for t in tensors):
        check()  # no version counter: a pass cannot be remembered safely
        return
    key = tuple((id(t), t._version) for t in tensors) + extra
    if key in _PASSED:
        return
    check()
    _PASSED[key] = True
    for t in tensors:
        weakref.finalize(t, _PASSED.pop, key, None)


# ------------------------------------------------------------------ index list checks


def _check_index_tensor(name: str, x, dims: Tuple[int, ...], device: torch.device) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be an integer tensor (int32 preferred), got {x.dtype}")
    if x.device != device:
        raise ValueError(f"{name} must be on q's device {device}, got {x.device}")
    if x.dim() not in dims:
        raise ValueError(f"{name} must be {' or '.join(f'{d}-D' for d in dims)}, got shape {list(x.shape)}")


def check_index_lists(q2k_idx, q2k_num, *, batch: int, heads: int, q_blocks: int, kv_blocks: int,
                      device: torch.device, row_limit: Optional[Tensor] = None,
                      names: Tuple[str, str] = ("q2k_idx", "q2k_num"), values: bool = True) -> Tuple[Tensor, Tensor]:
    """Check q2k lists for a call with ``q_blocks`` x ``kv_blocks`` blocks; returns them as given.

    Shapes: ``idx [B, H, Qb, W]`` with ``num [B, H, Qb]``, or ``idx [H, Qb, W]`` with
    ``num [H, Qb]``. Values (see the module docstring for when they are read): ``num`` in
    ``[0, W]``; used entries in ``[0, kv_blocks)`` and, when ``row_limit`` (int ``[Qb]``) is
    given, below ``row_limit[i]`` in row ``i``; no duplicate within a row's used entries.
    ``values=False`` checks shapes only (a caller that checks several lists' values at once).
    """
    n_idx, n_num = names
    _check_index_tensor(n_idx, q2k_idx, (3, 4), device)
    _check_index_tensor(n_num, q2k_num, (2, 3), device)
    width = q2k_idx.shape[-1]
    if q2k_idx.dim() == 4:
        want_idx, want_num = [batch, heads, q_blocks, width], [batch, heads, q_blocks]
        form = "[B, H, Qb, W]"
    else:
        want_idx, want_num = [heads, q_blocks, width], [heads, q_blocks]
        form = "[H, Qb, W]"
    if list(q2k_idx.shape) != want_idx:
        raise ValueError(f"{n_idx} must have shape [B, H, Qb, W] = {[batch, heads, q_blocks, 'W']} or "
                         f"[H, Qb, W] = {[heads, q_blocks, 'W']}, got {list(q2k_idx.shape)}")
    if list(q2k_num.shape) != want_num:
        raise ValueError(f"{n_num} must have shape {want_num} to go with a {form} {n_idx}, "
                         f"got {list(q2k_num.shape)}")
    if values:
        tensors = [q2k_idx, q2k_num] + ([row_limit] if row_limit is not None else [])
        checked_once(tensors, ("q2k", kv_blocks),
                     lambda: check_index_values(q2k_idx, q2k_num, kv_blocks, row_limit, names))
    return q2k_idx, q2k_num


def _used(q2k_idx: Tensor, q2k_num: Tensor) -> Tensor:
    slot = torch.arange(q2k_idx.shape[-1], device=q2k_idx.device)
    return slot < q2k_num.unsqueeze(-1).to(torch.int64)


def check_index_values(q2k_idx: Tensor, q2k_num: Tensor, kv_blocks: int, row_limit: Optional[Tensor] = None,
                       names: Tuple[str, str] = ("q2k_idx", "q2k_num")) -> None:
    """The value checks of :func:`check_index_lists`, run now (one device reduction, one sync)."""
    n_idx, n_num = names
    width = q2k_idx.shape[-1]
    num = q2k_num.to(torch.int64)
    idx = q2k_idx.to(torch.int64)
    used = _used(q2k_idx, q2k_num)
    limit = torch.full((), kv_blocks, dtype=torch.int64, device=idx.device)
    if row_limit is not None:
        limit = torch.minimum(limit, row_limit.to(torch.int64).unsqueeze(-1))  # [Qb, 1]
    out_of_range = used & ((idx < 0) | (idx >= limit))
    # Duplicates: sort each row with unused slots replaced by distinct values past any index.
    filler = kv_blocks + torch.arange(width, device=idx.device)
    ordered = torch.sort(torch.where(used, idx, filler), dim=-1).values
    dup = ordered[..., 1:] == ordered[..., :-1]
    bad_num = (num < 0) | (num > width)
    flags = torch.stack([bad_num.any(), out_of_range.any(), dup.any()]).tolist()  # the one sync
    if flags[0]:
        lo, hi = int(num.min()), int(num.max())
        raise ValueError(f"{n_num} must lie in [0, W] = [0, {width}], got values in [{lo}, {hi}]")
    if flags[1]:
        where = out_of_range.nonzero()[0].tolist()
        bound = "that row's sequence's kv blocks" if row_limit is not None else f"[0, KVb) = [0, {kv_blocks})"
        raise ValueError(f"{n_idx} entries below {n_num} must lie in {bound}; "
                         f"{n_idx}{where} = {int(idx[tuple(where)])}")
    if flags[2]:
        row = dup.any(-1).nonzero()[0].tolist()
        raise ValueError(f"{n_idx} lists a kv block twice in row {row} (each row's entries below {n_num} must be "
                         f"distinct: a bool map cannot count a block twice)")


# ------------------------------------------------------------------ the conversion (one place)

_MAP_API: Dict[Tuple[int, bool], Callable] = {
    (64, False): api.block_sparse_attn,
    (64, True): api.block_sparse_attn_bshd,
    (128, False): api.block_sparse_attn_128,
    (128, True): api.block_sparse_attn_128_bshd,
    (256, False): api.block_sparse_attn_256,
    (256, True): api.block_sparse_attn_256_bshd,
}


def lists_to_map(q2k_idx: Tensor, q2k_num: Tensor, kv_blocks: int) -> Tensor:
    """q2k lists -> bool map ``[..., Qb, KVb]`` (same leading dims) by one scatter. Unused
    entries, and any index outside ``[0, KVb)`` (possible only when the value checks were
    skipped), go to a spare column that is dropped, so the scatter never writes out of bounds."""
    idx = q2k_idx.to(torch.int64)
    keep = _used(q2k_idx, q2k_num) & (idx >= 0) & (idx < kv_blocks)
    target = torch.where(keep, idx, torch.full_like(idx, kv_blocks))
    out = torch.zeros(*idx.shape[:-1], kv_blocks + 1, dtype=torch.bool, device=idx.device)
    out.scatter_(-1, target, True)
    return out[..., :kv_blocks]


def ascending_lists(q2k_idx: Tensor, q2k_num: Tensor, kv_blocks: int, batch: int) -> Tuple[Tensor, Tensor]:
    """Checked q2k lists -> the op's list form: int32 contiguous ``[B, H, Qb, W]`` / ``[B, H, Qb]``
    with each row's used entries ascending (one sort on the device; a 3-D input is expanded over
    the batch). The entries past ``num`` become 0, a valid id that no kernel reads. Ascending
    rows are what ``map_to_index`` gives, so a list-walking kernel accumulates in the order the
    map API's call would, and the result is the map API's bit for bit."""
    idx = _ascending_rows(q2k_idx, q2k_num, kv_blocks)
    num = q2k_num.to(torch.int32)
    if idx.dim() == 3:
        idx, num = idx.unsqueeze(0).expand(batch, *idx.shape), num.unsqueeze(0).expand(batch, *num.shape)
    return idx.contiguous(), num.contiguous()


#: whether CUDA lists are sorted by one Triton launch (``kernels/triton/ascending_lists``) instead of
#: the torch path's radix sort and four elementwise launches (about 65 us of device time a call at
#: S=32768 on an H100, ``benchmarks/results/diag_lists_fwd_h100_s28.log``). On since its GPU test
#: passed on an H100 (``tests/logs/h100_2026-12-07_s29_sort_split_20fca6f.log``): 6.9 us a call there,
#: the lists' forward then at the map's device time (``benchmarks/results/diag_lists_fwd_h100_s29b.log``,
#: both sorts in one run).
TRITON_SORT = True


def _ascending_rows(q2k_idx: Tensor, q2k_num: Tensor, kv_blocks: int) -> Tensor:
    """int32 rows of ``q2k_idx``: the used entries ascending, 0 past ``num`` (same shape)."""
    if TRITON_SORT and q2k_idx.is_cuda and not torch.compiler.is_compiling():
        try:
            from .kernels.triton.ascending_lists import MAX_WIDTH, ascending_lists_triton
        except Exception:  # noqa: BLE001 - no usable Triton: the torch path
            pass
        else:
            if q2k_idx.shape[-1] <= MAX_WIDTH:
                return ascending_lists_triton(q2k_idx, q2k_num, kv_blocks)
    return ascending_rows_torch(q2k_idx, q2k_num, kv_blocks)


def ascending_rows_torch(q2k_idx: Tensor, q2k_num: Tensor, kv_blocks: int) -> Tensor:
    """:func:`_ascending_rows` by torch ops: the reference, and the CPU path."""
    used = _used(q2k_idx, q2k_num)
    key = torch.where(used, q2k_idx.to(torch.int32), kv_blocks)
    idx = torch.sort(key, dim=-1).values
    return torch.where(idx >= kv_blocks, 0, idx)


def _lists_to_op(q: Tensor, k: Tensor, v: Tensor, q2k_idx: Tensor, q2k_num: Tensor, variable_block_sizes: Tensor,
                 *, block_size: int, bshd: bool, kv_blocks: int) -> Tuple[Tensor, Tensor]:
    """Run block-sparse attention on checked q2k lists. THE place lists meet the op.

    When their values were checked (eager mode outside CUDA-graph capture: see
    :func:`values_unreadable`), the lists go to the op as lists (:func:`ascending_lists`; no bool
    map unless the route's kernels take one). While ``torch.compile`` traces or a graph captures,
    the values were not read, so the lists become a bool map by one scatter (:func:`lists_to_map`,
    which drops an out-of-range entry instead of letting a kernel read out of bounds) and go
    through the map API. Every index-native entry point (``block_sparse_attn*_from_indices``, the
    compat ``block_sparse_attn_from_indices`` and ``block_sparse_attn_varlen``) comes through here.
    """
    if not values_unreadable([q2k_idx, q2k_num]) and q2k_idx.shape[-1] >= 1:
        batch = q.shape[0]
        return api._block_sparse(q, k, v, None, variable_block_sizes, block_size, bshd,
                                 q2k=ascending_lists(q2k_idx, q2k_num, kv_blocks, batch))
    block_map = lists_to_map(q2k_idx, q2k_num, kv_blocks)
    return _MAP_API[(block_size, bshd)](q, k, v, block_map, variable_block_sizes)


def _from_indices(q, k, v, q2k_idx, q2k_num, variable_block_sizes, block_size: int, bshd: bool):
    shapes = check_qkv(q, k, v, bshd=bshd, block_size=block_size)
    qb, kvb = shapes.q_len // block_size, shapes.kv_len // block_size
    check_block_sizes(variable_block_sizes, kvb, block_size, q.device)
    check_index_lists(q2k_idx, q2k_num, batch=shapes.batch, heads=shapes.heads, q_blocks=qb, kv_blocks=kvb,
                      device=q.device)
    return _lists_to_op(q, k, v, q2k_idx, q2k_num, variable_block_sizes, block_size=block_size, bshd=bshd,
                        kv_blocks=kvb)


# ------------------------------------------------------------------ public functions


def block_sparse_attn_from_indices(q: Tensor, k: Tensor, v: Tensor, q2k_idx: Tensor, q2k_num: Tensor,
                                   variable_block_sizes: Tensor) -> Tuple[Tensor, Tensor]:
    """Block-sparse attention over 64-token blocks from q2k lists, ``[B, H, S, D]``.
    Returns ``(out, lse)`` exactly as :func:`fastvideo_cute.block_sparse_attn` does for the
    equivalent map."""
    return _from_indices(q, k, v, q2k_idx, q2k_num, variable_block_sizes, 64, False)


def block_sparse_attn_bshd_from_indices(q: Tensor, k: Tensor, v: Tensor, q2k_idx: Tensor, q2k_num: Tensor,
                                        variable_block_sizes: Tensor) -> Tuple[Tensor, Tensor]:
    """:func:`block_sparse_attn_from_indices` for ``[B, S, H, D]`` tensors."""
    return _from_indices(q, k, v, q2k_idx, q2k_num, variable_block_sizes, 64, True)


def block_sparse_attn_128_from_indices(q: Tensor, k: Tensor, v: Tensor, q2k_idx: Tensor, q2k_num: Tensor,
                                       variable_block_sizes: Tensor) -> Tuple[Tensor, Tensor]:
    """Block-sparse attention over 128-token blocks from q2k lists, ``[B, H, S, D]``."""
    return _from_indices(q, k, v, q2k_idx, q2k_num, variable_block_sizes, 128, False)


def block_sparse_attn_128_bshd_from_indices(q: Tensor, k: Tensor, v: Tensor, q2k_idx: Tensor, q2k_num: Tensor,
                                            variable_block_sizes: Tensor) -> Tuple[Tensor, Tensor]:
    """Block-sparse attention over 128-token blocks from q2k lists, ``[B, S, H, D]``."""
    return _from_indices(q, k, v, q2k_idx, q2k_num, variable_block_sizes, 128, True)


def block_sparse_attn_256_from_indices(q: Tensor, k: Tensor, v: Tensor, q2k_idx: Tensor, q2k_num: Tensor,
                                       variable_block_sizes: Tensor) -> Tuple[Tensor, Tensor]:
    """Block-sparse attention over 256-token blocks from q2k lists, ``[B, H, S, D]``."""
    return _from_indices(q, k, v, q2k_idx, q2k_num, variable_block_sizes, 256, False)


def block_sparse_attn_256_bshd_from_indices(q: Tensor, k: Tensor, v: Tensor, q2k_idx: Tensor, q2k_num: Tensor,
                                            variable_block_sizes: Tensor) -> Tuple[Tensor, Tensor]:
    """Block-sparse attention over 256-token blocks from q2k lists, ``[B, S, H, D]``."""
    return _from_indices(q, k, v, q2k_idx, q2k_num, variable_block_sizes, 256, True)
