"""Checked q2k lists -> ascending rows in one Triton launch (``api_indices.ascending_lists``).

For each row of ``idx [N, W]`` (leading dims flattened) with count ``num[row]``: the used entries
(slots ``< num``) in ascending order, then 0 in every slot past ``num`` (a valid id no kernel
reads). The same result as the torch path in ``fastvideo_cute/api_indices.py`` bit for bit (the
reference and the CPU path), which spends a radix sort and four elementwise launches on it:
measured on an H100 at S=32768 (12 heads, 512 q blocks, 64 wide) 80 us of device time against
11 us for ``map_to_index`` on the same selection
(``benchmarks/results/diag_lists_fwd_h100_s28.log``).

``ROWS`` rows per program, each row whole in ``BLOCK_W = max(next_power_of_2(W), 16)`` lanes:
unused and padding lanes get the key ``KVB`` (past every index the value checks allow), one
bitonic ``tl.sort`` along the row puts the used entries first, ascending, and the keys ``KVB``
are stored as 0. The entries must already be checked (distinct, in ``[0, KVB)``, ``num`` in
``[0, W]``); no atomics, no host sync.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .map_to_index import _check_output

__all__ = ["ascending_lists_triton", "MAX_WIDTH"]

#: widest row one program sorts (the whole row in registers); wider lists take the torch path
MAX_WIDTH = 4096


@triton.jit
def _ascending_lists_kernel(
    Idx, Num, Out,
    stride_ir, stride_iw, stride_n,
    NROWS, W, KVB,
    BLOCK_W: tl.constexpr,
    ROWS: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS).to(tl.int64)
    rmask = rows < NROWS
    cols = tl.arange(0, BLOCK_W)
    num = tl.load(Num + rows * stride_n, mask=rmask, other=0).to(tl.int32)
    valid = (cols < W)[None, :] & rmask[:, None]
    used = valid & (cols[None, :] < num[:, None])
    idx = tl.load(Idx + rows[:, None] * stride_ir + cols.to(tl.int64)[None, :] * stride_iw, mask=used, other=0)
    key = tl.where(used, idx.to(tl.int32), KVB)
    key = tl.sort(key, dim=1)
    out = tl.where(key >= KVB, 0, key)
    tl.store(Out + rows[:, None] * W + cols[None, :], out, mask=valid)


def launch_config(block_w: int):
    """``(rows per program, warps)``: about 1024 lanes a program (unmeasured beyond the H100
    diagnosis's 64- and 128-wide rows)."""
    rows = max(1, 1024 // block_w)
    return rows, (1 if block_w * rows <= 1024 else 4)


def ascending_lists_triton(idx: torch.Tensor, num: torch.Tensor, kv_blocks: int,
                           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``idx [..., W]`` (any integer dtype, any strides), ``num [...]`` -> int32 ``[..., W]``
    contiguous, each row's used entries ascending, 0 past ``num``, written into ``out`` (allocated
    when None) and returned. Raises ``ValueError`` (naming the argument) for mismatched shapes, a
    row wider than :data:`MAX_WIDTH`, or an ``out`` that is not int32, contiguous, of ``idx``'s
    shape and device."""
    if idx.dim() < 1 or tuple(num.shape) != tuple(idx.shape[:-1]):
        raise ValueError(f"num must have idx's leading shape {tuple(idx.shape[:-1])}, got {tuple(num.shape)}")
    w = idx.shape[-1]
    if w > MAX_WIDTH:
        raise ValueError(f"idx rows are {w} wide; the kernel sorts at most {MAX_WIDTH}")
    if out is None:
        out = torch.empty(idx.shape, dtype=torch.int32, device=idx.device)
    _check_output("out", out, tuple(idx.shape), idx.device)
    nrows = num.numel()
    if nrows == 0 or w == 0:
        return out
    flat_idx, flat_num = idx.reshape(nrows, w), num.reshape(nrows)
    block_w = max(triton.next_power_of_2(w), 16)
    rows, warps = launch_config(block_w)
    grid = (triton.cdiv(nrows, rows),)
    args = (flat_idx, flat_num, out, flat_idx.stride(0), flat_idx.stride(1), flat_num.stride(0), nrows, w,
            int(kv_blocks))
    if idx.is_cuda:
        with torch.cuda.device(idx.device):
            _ascending_lists_kernel[grid](*args, BLOCK_W=block_w, ROWS=rows, num_warps=warps)
    else:
        _ascending_lists_kernel[grid](*args, BLOCK_W=block_w, ROWS=rows, num_warps=warps)
    return out
