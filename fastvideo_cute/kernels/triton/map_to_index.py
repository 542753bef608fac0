"""Fused ``map_to_index``: block map -> (idx, num) index lists in one Triton launch.

The same result as the torch path in ``fastvideo_cute/metadata.py`` (which stays the
reference and the CPU path), bit for bit: for each row of a map ``[..., R, C]`` the selected
columns first in ascending order, then the unselected ones in ascending order; ``num`` is the
count of selected columns.

``ROWS`` rows per program (grid ``(cdiv(N * R, ROWS),)``, ``N`` = product of the leading dims),
each row whole in ``BLOCK_C = max(next_power_of_2(C), 16)`` masked lanes. The program
loads the row through the map's strides (any strides; non-zero = selected), takes a running
count ``csum`` (``tl.cumsum``), gives column ``j`` the slot ``csum - 1`` if it is selected and
``num + j - csum`` if not, and scatter-stores ``j`` to ``idx[row, slot]`` -- a permutation of
``0..C-1``, so every slot of the row is written exactly once. No atomics, no host sync.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

__all__ = ["map_to_index_triton", "map_to_index_fused", "MAX_COLS"]

# Widest row one program handles (the whole row is one block of BLOCK_C = next_power_of_2(C)
# lanes). Block maps have at most a few thousand columns; wider maps take the torch path.
MAX_COLS = 1 << 16

# Map dtypes loaded as they are (compared ``!= 0`` in the kernel); bool is loaded as uint8.
_NATIVE_DTYPES = (
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
)


@triton.jit
def _map_to_index_kernel(
    Map, Idx, Num,
    stride_mn, stride_mr, stride_mc,
    R, C, NROWS,
    BLOCK_C: tl.constexpr,
    ROWS: tl.constexpr,
):
    # ROWS flattened (leading..., r) rows per program; Idx/Num rows are contiguous
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    rmask = rows < NROWS
    n = rows // R
    r = rows % R
    cols = tl.arange(0, BLOCK_C)
    valid = (cols < C)[None, :] & rmask[:, None]
    m_ptrs = Map + (n * stride_mn + r * stride_mr)[:, None] + cols.to(tl.int64)[None, :] * stride_mc
    sel = (tl.load(m_ptrs, mask=valid, other=0) != 0).to(tl.int32)  # masked lanes: not selected
    csum = tl.cumsum(sel, axis=1)  # selected columns at or before j
    num = tl.sum(sel, axis=1)
    # selected j -> its rank among the selected; unselected j -> num + its rank among the unselected
    slot = tl.where(sel != 0, csum - 1, num[:, None] + cols[None, :] - csum)
    tl.store(Idx + rows[:, None] * C + slot, cols[None, :] + tl.zeros((ROWS, BLOCK_C), tl.int32), mask=valid)
    tl.store(Num + rows, num, mask=rmask)


def _check_map_dims(block_map: torch.Tensor) -> None:
    """``ValueError`` naming ``block_map`` unless it has at least two dims ``[..., R, C]``."""
    if block_map.dim() < 2:
        raise ValueError(f"block_map must have at least 2 dims [..., R, C], got shape {tuple(block_map.shape)}")


def _check_output(name: str, out: torch.Tensor, shape: Tuple[int, ...], device: torch.device) -> None:
    """``ValueError`` naming the output ``name`` unless it is an int32 tensor of ``shape``,
    contiguous, on ``device``."""
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(out.shape)}")
    if out.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {out.dtype}")
    if out.device != device:
        raise ValueError(f"{name} must be on {device}, got {out.device}")
    if not out.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _loadable(block_map: torch.Tensor) -> torch.Tensor:
    """The map in a dtype the kernels load and compare ``!= 0``: bool as a uint8 view (same
    itemsize: a view whatever the strides), :data:`_NATIVE_DTYPES` as they are, any other dtype
    as ``(map != 0)`` viewed as uint8 (a copy)."""
    if block_map.dtype == torch.bool:
        return block_map.view(torch.uint8)
    if block_map.dtype not in _NATIVE_DTYPES:
        return (block_map != 0).view(torch.uint8)
    return block_map


def _flatten_leading(block_map: torch.Tensor) -> torch.Tensor:
    """``[..., R, C]`` -> ``[N, R, C]``: a view when the leading dims allow it (a transposed map
    does), else a copy (``reshape``). A map without leading dims gets ``N = 1``."""
    R, C = block_map.shape[-2:]
    return block_map.reshape(-1, R, C)


def map_to_index_triton(block_map: torch.Tensor, idx_out: torch.Tensor, num_out: torch.Tensor, *,
                        config: Optional[Tuple[int, int]] = None) -> None:
    """Block map ``[..., R, C]`` (bool, or any int/float dtype read as ``!= 0``; any strides)
    -> index lists written into caller-allocated ``idx_out`` (int32 ``[..., R, C]``,
    contiguous) and ``num_out`` (int32 ``[..., R]``, contiguous), on the map's device.

    Raises ``ValueError`` (naming the argument) for a map of fewer than two dims or wider than
    :data:`MAX_COLS`, or an output of the wrong shape, dtype, device or layout. ``config``:
    ``(rows per program, warps)`` instead of :func:`launch_config`'s (the benchmark's sweep); every
    config writes the same lists.
    """
    _check_map_dims(block_map)
    shape = tuple(block_map.shape)
    R, C = shape[-2:]
    if C > MAX_COLS:
        raise ValueError(f"block_map has {C} columns; the fused kernel handles at most {MAX_COLS}")
    _check_output("idx_out", idx_out, shape, block_map.device)
    _check_output("num_out", num_out, shape[:-1], block_map.device)
    if num_out.numel() == 0:  # no rows
        return
    if C == 0:  # zero-width rows: nothing selected, no idx entries
        num_out.zero_()
        return
    m = _flatten_leading(_loadable(block_map))
    # At least 16 lanes: C = 1..16 share one compiled kernel, and no degenerate 1-lane scan.
    block_c = max(triton.next_power_of_2(C), 16)
    rows, num_warps = config if config is not None else launch_config(block_c)
    nrows = m.shape[0] * R
    if m.is_cuda:
        with torch.cuda.device(m.device):  # Triton launches on the current device
            _launch(m, idx_out, num_out, R, C, nrows, block_c, rows, num_warps)
    else:
        _launch(m, idx_out, num_out, R, C, nrows, block_c, rows, num_warps)


def launch_config(block_c: int) -> Tuple[int, int]:
    """``(rows per program, warps)`` for rows of ``block_c`` lanes. Measured on the H200
    (``benchmarks/results/metadata_sweep_h200.json``, 12 heads, 12.5 % selected): one row, one
    warp is fastest up to 1024 lanes (5.6 / 9.1 / 17.9 us at 512 / 624 / 1024 columns against
    7.1 / 11.5 / 19.6 us with four warps; more rows per program were slower everywhere); wider
    rows keep the earlier, unmeasured choice."""
    return 1, (1 if block_c <= 1024 else (4 if block_c <= 4096 else 8))


def _launch(m, idx_out, num_out, R, C, nrows, block_c, rows, num_warps) -> None:
    """One launch of :func:`_map_to_index_kernel` over the flattened ``[N, R, C]`` map ``m``."""
    _map_to_index_kernel[(triton.cdiv(nrows, rows),)](
        m, idx_out, num_out,
        m.stride(0), m.stride(1), m.stride(2),
        R, C, nrows,
        BLOCK_C=block_c,
        ROWS=rows,
        num_warps=num_warps,
    )


def map_to_index_fused(block_map: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Allocating form of :func:`map_to_index_triton`: ``(idx [..., R, C], num [..., R])``, int32,
    contiguous, on the map's device."""
    _check_map_dims(block_map)
    shape = tuple(block_map.shape)
    idx = torch.empty(shape, dtype=torch.int32, device=block_map.device)
    num = torch.empty(shape[:-1], dtype=torch.int32, device=block_map.device)
    map_to_index_triton(block_map, idx, num)
    return idx, num
