"""Whether K's or V's padding rows hold anything but zeros, in one Triton launch.

Padding tokens are the positions at or past ``kv_block_sizes[j]`` inside kv block ``j`` (the
library's "valid tokens lead" rule). The backends whose kernels read partial kv tiles whole
(cuDNN, FA4) need those rows to be zero and otherwise copy K and V with them zeroed
(:mod:`.sanitize_padding`, a full read and write of both tensors). This kernel reads only the
padding rows and raises a flag when one of them holds a value that is not zero (``x != 0``:
NaN, +-Inf and every finite non-zero value; ``-0.0`` counts as zero), so a caller that learns
the padding is already zero can skip the copy: the kernels then read exactly the values the copy
would have given them.

Dataflow: grid ``(KVb, B * H)``; a program owns kv block ``j`` of one (batch, head). A full block
(``size == KV_BLOCK``) returns after one load. A partial one walks its rows from ``size`` to the
block's end in ``CHUNK``-row steps (``BLOCK_D = next_power_of_2(D)`` channels), loads the padding
rows of K and V through their own strides (valid rows are masked off, never loaded) and, when any
element is not zero, sets ``flag[0] = 1`` (``atomic_max``). Tensors are addressed as
``[B, H, S, D]`` by strides, so BHSD, BSHD and any strided view work unchanged; offsets are
int64. No host sync; the flag is the caller's (zeroed before the launch).

Limits: the last dim must have stride 1; ``D <= 256``. Runs on CPU tensors under
``TRITON_INTERPRET=1`` (test fp16/fp32 there).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .sanitize_padding import bhsd_dims, bhsd_strides, check_kv_block_sizes

__all__ = ["padding_nonzero_triton", "MAX_HEAD_DIM"]

MAX_HEAD_DIM = 256


@triton.jit
def _padding_nonzero_kernel(
    K, V, Sizes, Flag,
    sk_b, sk_h, sk_s, sv_b, sv_h, sv_s,
    H, D,
    KV_BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    j = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    size = tl.load(Sizes + j)
    if size < KV_BLOCK:
        d = tl.arange(0, BLOCK_D)
        d64 = d.to(tl.int64)[None, :]
        in_d = (d < D)[None, :]
        k_base = K + b * sk_b + h * sk_h
        v_base = V + b * sv_b + h * sv_h
        hit = tl.zeros([CHUNK, BLOCK_D], dtype=tl.int32)
        for r0 in range((size // CHUNK) * CHUNK, KV_BLOCK, CHUNK):
            r = r0 + tl.arange(0, CHUNK)
            m = ((r >= size) & (r < KV_BLOCK))[:, None] & in_d
            s64 = (j.to(tl.int64) * KV_BLOCK + r.to(tl.int64))[:, None]
            x = tl.load(k_base + s64 * sk_s + d64, mask=m, other=0.0)
            y = tl.load(v_base + s64 * sv_s + d64, mask=m, other=0.0)
            hit = hit | ((x != 0.0) | (y != 0.0)).to(tl.int32)
        if tl.max(tl.max(hit, axis=1), axis=0) > 0:
            tl.atomic_max(Flag, 1)


def padding_nonzero_triton(k: torch.Tensor, v: torch.Tensor, kv_block_sizes: torch.Tensor, kv_block: int,
                           flag: torch.Tensor, *, bshd: bool) -> None:
    """Set ``flag[0] = 1`` when a padding row of ``k`` or ``v`` holds a value that is not zero
    (``flag`` is left as it is otherwise: zero it first). ``k`` / ``v``: 4-D, call layout
    (``[B, S, H, D]`` if ``bshd`` else ``[B, H, S, D]``), one shape, any strides with a unit last
    stride. ``kv_block_sizes``: int32 ``[S / kv_block]``, contiguous. ``flag``: int32, at least one
    element, contiguous; all on one device.

    Raises ``ValueError`` naming the argument for any mismatch, before the launch.
    """
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a unit last (head_dim) stride, got strides {t.stride()}")
    if v.shape != k.shape or v.device != k.device:
        raise ValueError(f"v {tuple(v.shape)} on {v.device} must match k {tuple(k.shape)} on {k.device}")
    B, H, S, D = bhsd_dims(k, bshd)
    if D > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {D} exceeds {MAX_HEAD_DIM}")
    check_kv_block_sizes(kv_block_sizes, S, kv_block, k.device, "k")
    if (not isinstance(flag, torch.Tensor) or flag.dtype != torch.int32 or flag.numel() < 1
            or not flag.is_contiguous()):
        raise ValueError("flag must be a contiguous int32 tensor with at least one element")
    if flag.device != k.device:
        raise ValueError(f"flag is on {flag.device}, k on {k.device}")
    if B * H * S == 0:
        return
    block_d = max(triton.next_power_of_2(D), 16)
    chunk = max(8, min(32, 4096 // block_d))
    grid = (S // kv_block, B * H)
    args = (k, v, kv_block_sizes, flag, *bhsd_strides(k, bshd), *bhsd_strides(v, bshd), H, D)
    kw = dict(KV_BLOCK=kv_block, CHUNK=chunk, BLOCK_D=block_d, num_warps=4)
    if k.is_cuda:
        with torch.cuda.device(k.device):  # Triton launches on the current device
            _padding_nonzero_kernel[grid](*args, **kw)
    else:
        _padding_nonzero_kernel[grid](*args, **kw)
