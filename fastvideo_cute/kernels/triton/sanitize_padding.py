"""Copy K and/or V with their padding tokens zeroed, in one Triton launch.

Padding tokens are the positions at or past ``kv_block_sizes[j]`` inside kv block ``j`` (the
library's "valid tokens lead" rule). A kernel that reads a partial kv tile whole (TMA) and masks
the scores by select still multiplies the padded rows of V by P = 0 (``0 * NaN = NaN``) and, in
the backward, the padded rows of K by dS = 0; a copy whose padded rows are exact zeros makes
those products 0. This kernel makes that copy: valid rows are copied bit for bit, padded rows are
written as +0.0, and padded rows are never loaded (masked loads), so NaN/Inf there cost nothing.

Dataflow: grid ``(cdiv(S, BLOCK_S), B * H)``; a program owns ``BLOCK_S`` consecutive tokens of one
(batch, head) and all ``D`` channels (``BLOCK_D = next_power_of_2(D)``), reads the sizes of the kv
blocks its rows fall in, loads the valid rows of each tensor it is asked for (``DO_K`` / ``DO_V``)
through the tensor's own strides and stores every row into the output through the output's
strides. Inputs and outputs are addressed as ``[B, H, S, D]`` by strides, so BHSD, BSHD and any
strided view work unchanged; offsets are int64. No atomics, no host sync.

Limits: the last dim must have stride 1 on every tensor; ``D <= 256`` (one program holds a
``BLOCK_S x BLOCK_D`` tile). Runs on CPU tensors under ``TRITON_INTERPRET=1`` (test fp16/fp32
there: the interpreter's bf16 is wrong).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

__all__ = ["sanitize_padding_triton", "sanitize_kv_padding", "MAX_HEAD_DIM"]

MAX_HEAD_DIM = 256


@triton.jit
def _sanitize_kernel(
    K, V, KO, VO, Sizes,
    sk_b, sk_h, sk_s, sv_b, sv_h, sv_s,
    sko_b, sko_h, sko_s, svo_b, svo_h, svo_s,
    H, S, D,
    KV_BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DO_K: tl.constexpr,
    DO_V: tl.constexpr,
):
    pid_s = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    in_s = s < S
    size = tl.load(Sizes + s // KV_BLOCK, mask=in_s, other=0)
    valid = in_s & ((s % KV_BLOCK) < size)
    s64 = s.to(tl.int64)[:, None]
    d64 = d.to(tl.int64)[None, :]
    in_d = (d < D)[None, :]
    load_mask = valid[:, None] & in_d
    store_mask = in_s[:, None] & in_d
    if DO_K:
        x = tl.load(K + b * sk_b + h * sk_h + s64 * sk_s + d64, mask=load_mask, other=0.0)
        tl.store(KO + b * sko_b + h * sko_h + s64 * sko_s + d64, x, mask=store_mask)
    if DO_V:
        y = tl.load(V + b * sv_b + h * sv_h + s64 * sv_s + d64, mask=load_mask, other=0.0)
        tl.store(VO + b * svo_b + h * svo_h + s64 * svo_s + d64, y, mask=store_mask)


def check_kv_block_sizes(kv_block_sizes, S: int, kv_block: int, device, ref_name: str) -> None:
    """``S`` a positive multiple of ``kv_block``; the sizes contiguous int32 ``[S / kv_block]`` on
    ``device`` (where the tensor named ``ref_name`` lives). Raises ``ValueError`` naming them."""
    if kv_block <= 0 or S % kv_block:
        raise ValueError(f"kv length {S} must be a positive multiple of kv_block={kv_block}")
    if (not isinstance(kv_block_sizes, torch.Tensor) or kv_block_sizes.dtype != torch.int32
            or tuple(kv_block_sizes.shape) != (S // kv_block,) or not kv_block_sizes.is_contiguous()):
        got = (f"{kv_block_sizes.dtype} {tuple(kv_block_sizes.shape)}" if isinstance(kv_block_sizes, torch.Tensor)
               else type(kv_block_sizes).__name__)
        raise ValueError(f"kv_block_sizes must be contiguous int32 [{S // kv_block}], got {got}")
    if kv_block_sizes.device != device:
        raise ValueError(f"kv_block_sizes is on {kv_block_sizes.device}, {ref_name} on {device}")


def bhsd_strides(x: torch.Tensor, bshd: bool) -> Tuple[int, int, int]:
    """(batch, head, seq) strides of a 4-D tensor in the call layout."""
    if bshd:
        return x.stride(0), x.stride(2), x.stride(1)
    return x.stride(0), x.stride(1), x.stride(2)


def bhsd_dims(x: torch.Tensor, bshd: bool) -> Tuple[int, int, int, int]:
    b, a, c, d = x.shape
    return (b, c, a, d) if bshd else (b, a, c, d)


def sanitize_padding_triton(k: Optional[torch.Tensor], v: Optional[torch.Tensor], kv_block_sizes: torch.Tensor,
                            kv_block: int, k_out: Optional[torch.Tensor], v_out: Optional[torch.Tensor], *,
                            bshd: bool) -> None:
    """Write ``k`` / ``v`` (4-D, call layout ``[B, S, H, D]`` if ``bshd`` else ``[B, H, S, D]``, any
    strides with a unit last stride) into ``k_out`` / ``v_out`` (same shape and dtype, any such
    strides) with every padding token row set to 0. Pass ``None`` for a tensor (and its output)
    to skip it. ``kv_block_sizes``: int32 ``[S / kv_block]``, contiguous, on the tensors' device.

    Raises ``ValueError`` naming the argument for any mismatch, before the launch.
    """
    pairs = [(n, x, o) for n, x, o in (("k", k, k_out), ("v", v, v_out)) if x is not None or o is not None]
    if not pairs:
        raise ValueError("nothing to sanitize: k and v are both None")
    ref = None
    for name, x, o in pairs:
        if x is None or o is None:
            raise ValueError(f"{name} and {name}_out must be given together")
        for label, t in ((name, x), (f"{name}_out", o)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                raise ValueError(f"{label} must be a 4-D tensor")
            if t.stride(-1) != 1:
                raise ValueError(f"{label} must have a unit last (head_dim) stride, got strides {t.stride()}")
        if o.shape != x.shape or o.dtype != x.dtype or o.device != x.device:
            raise ValueError(f"{name}_out must match {name} in shape, dtype and device: {tuple(o.shape)} {o.dtype} "
                             f"{o.device} vs {tuple(x.shape)} {x.dtype} {x.device}")
        if ref is None:
            ref = (name, x)
        elif x.shape != ref[1].shape or x.device != ref[1].device:
            raise ValueError(f"{name} {tuple(x.shape)} must match {ref[0]} {tuple(ref[1].shape)} on one device")
    x0 = ref[1]
    B, H, S, D = bhsd_dims(x0, bshd)
    if D > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {D} exceeds {MAX_HEAD_DIM}")
    check_kv_block_sizes(kv_block_sizes, S, kv_block, x0.device, ref[0])
    if B * H * S == 0:
        return
    do_k, do_v = k is not None, v is not None
    kk, ko = (k, k_out) if do_k else (x0, x0)  # placeholders never touched when DO_* is False
    vv, vo = (v, v_out) if do_v else (x0, x0)
    block_d = max(triton.next_power_of_2(D), 16)
    block_s = max(16, min(64, 8192 // block_d))
    grid = (triton.cdiv(S, block_s), B * H)
    args = (kk, vv, ko, vo, kv_block_sizes,
            *bhsd_strides(kk, bshd), *bhsd_strides(vv, bshd),
            *bhsd_strides(ko, bshd), *bhsd_strides(vo, bshd),
            H, S, D)
    kw = dict(KV_BLOCK=kv_block, BLOCK_S=block_s, BLOCK_D=block_d, DO_K=do_k, DO_V=do_v, num_warps=4)
    if x0.is_cuda:
        with torch.cuda.device(x0.device):  # Triton launches on the current device
            _sanitize_kernel[grid](*args, **kw)
    else:
        _sanitize_kernel[grid](*args, **kw)


def sanitize_kv_padding(k: Optional[torch.Tensor], v: Optional[torch.Tensor], kv_block_sizes: torch.Tensor,
                        kv_block: int, *, bshd: bool):
    """Allocating form of :func:`sanitize_padding_triton`: ``(k_clean, v_clean)``, each contiguous
    in the call layout (``empty_like(x, memory_format=torch.contiguous_format)``) or None where the
    input was None."""
    k_out = None if k is None else torch.empty_like(k, memory_format=torch.contiguous_format)
    v_out = None if v is None else torch.empty_like(v, memory_format=torch.contiguous_format)
    sanitize_padding_triton(k, v, kv_block_sizes, kv_block, k_out, v_out, bshd=bshd)
    return k_out, v_out
