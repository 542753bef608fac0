"""Plain fp32 torch reference for every public op: the semantics contract.

Nothing here is fast. Every route is tested against these functions; they are written
from the contract (docs/semantics.md), not from any kernel, so they can be wrong only
in the same way the contract is.

Contract, in brief:
- q/k/v are BHSD ``[B, H, S, D]`` here (BSHD callers transpose first).
- ``block_map`` is ``[B, H, Qb, KVb]`` (or ``[H, Qb, KVb]``) bool; query block i attends to
  kv block j iff ``block_map[..., i, j]``.
- ``kv_block_sizes[j]`` is the number of valid (leading) tokens of kv block j; keys at or
  past it are masked and their K/V values (even NaN/Inf) never reach a valid row.
- A query row with no valid key produces exactly 0 and LSE ``-inf``.
- LSE is natural-log, fp32, ``[B, H, Sq]``: ``log(sum_j exp(q.k_j * scale))`` over valid keys.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import torch

__all__ = [
    "block_token_mask",
    "masked_attention_reference",
    "block_sparse_attn_reference",
    "block_mean_reference",
    "topk_block_map_reference",
    "video_sparse_attn_reference",
    "coarse_attention_reference",
    "topk_indices_reference",
    "gate_compose_reference",
]


def _as_4d_map(block_map: torch.Tensor, batch: int) -> torch.Tensor:
    if block_map.dim() == 3:
        block_map = block_map.unsqueeze(0).expand(batch, -1, -1, -1)
    return block_map.to(torch.bool)


def block_token_mask(
    block_map: torch.Tensor,
    kv_block_sizes: torch.Tensor,
    q_block: int,
    kv_block: int,
) -> torch.Tensor:
    """Token-level ``[B, H, Sq, Skv]`` bool mask of a block map plus kv validity."""
    mask = block_map.repeat_interleave(q_block, dim=-2).repeat_interleave(kv_block, dim=-1)
    pos = torch.arange(kv_block, device=kv_block_sizes.device)
    kv_valid = (pos[None, :] < kv_block_sizes.to(torch.int64)[:, None]).reshape(-1)
    return mask & kv_valid.to(mask.device)


def masked_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    token_mask: torch.Tensor,
    kv_valid: Optional[torch.Tensor] = None,
    sm_scale: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Brute-force masked dense attention in fp32, differentiable.

    ``token_mask`` is ``[B, H, Sq, Skv]`` bool. ``kv_valid`` (``[Skv]`` bool) marks keys whose
    K/V values may be read at all; invalid ones are replaced by 0 before any arithmetic,
    so NaN/Inf there cannot leak. Returns ``(out fp32, lse fp32)``.
    """
    scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    qf, kf, vf = q.float(), k.float(), v.float()
    if kv_valid is not None:
        keep = kv_valid.view(1, 1, -1, 1).to(kf.device)
        kf = torch.where(keep, kf, torch.zeros((), dtype=kf.dtype, device=kf.device))
        vf = torch.where(keep, vf, torch.zeros((), dtype=vf.dtype, device=vf.device))
    logits = torch.matmul(qf, kf.transpose(-2, -1)) * scale
    logits = logits.masked_fill(~token_mask, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    has_key = token_mask.any(dim=-1, keepdim=True)
    # Rows with no key: softmax would be 0/0. Give them 0 without touching the graph of others.
    safe_logits = torch.where(has_key, logits, torch.zeros_like(logits))
    probs = torch.softmax(safe_logits, dim=-1)
    probs = torch.where(has_key, probs, torch.zeros_like(probs))
    out = torch.matmul(probs, vf)
    return out, lse


def block_sparse_attn_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_map: torch.Tensor,
    kv_block_sizes: torch.Tensor,
    block_size: Union[int, Tuple[int, int]] = 64,
    sm_scale: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Block-sparse attention, BHSD, fp32 out and natural-log LSE ``[B, H, Sq]``."""
    q_block, kv_block = (block_size, block_size) if isinstance(block_size, int) else block_size
    block_map = _as_4d_map(block_map, q.shape[0]).to(q.device)
    vbs = kv_block_sizes.to(q.device)
    token_mask = block_token_mask(block_map, vbs, q_block, kv_block)
    pos = torch.arange(kv_block, device=q.device)
    kv_valid = (pos[None, :] < vbs.to(torch.int64)[:, None]).reshape(-1)
    return masked_attention_reference(q, k, v, token_mask, kv_valid, sm_scale)


def block_mean_reference(x: torch.Tensor, block_sizes: torch.Tensor, block_elements: int) -> torch.Tensor:
    """Per-block mean over the valid tokens of BHSD ``x`` -> ``[B, H, nblocks, D]`` fp32.

    Tokens at or past ``block_sizes[j]`` are excluded (they are padding). A block with
    size 0 has mean 0.
    """
    b, h, s, d = x.shape
    n = s // block_elements
    xf = x.float().reshape(b, h, n, block_elements, d)
    pos = torch.arange(block_elements, device=x.device)
    sizes = block_sizes.to(x.device).to(torch.int64)
    valid = (pos[None, :] < sizes[:, None]).view(1, 1, n, block_elements, 1)
    xf = torch.where(valid, xf, torch.zeros((), dtype=xf.dtype, device=xf.device))
    return xf.sum(dim=3) / sizes.clamp(min=1).view(1, 1, n, 1).to(xf.dtype)


def topk_block_map_reference(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """Exactly ``topk`` True entries per row of ``scores``: the largest, ties to the lowest index.
    Rows must be NaN-free (NaN has no rank)."""
    n = scores.shape[-1]
    k = min(int(topk), n)
    # Walk the row in index order and keep an entry when fewer than k entries beat it
    # (strictly larger, or equal with a lower index): an O(n^2) definition, no sort.
    s = scores.unsqueeze(-1)  # [..., i, 1]
    t = scores.unsqueeze(-2)  # [..., 1, j]
    idx = torch.arange(n, device=scores.device)
    beats = (t > s) | ((t == s) & (idx.view(1, n) < idx.view(n, 1)))
    rank = beats.sum(dim=-1)
    return rank < k


def video_sparse_attn_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    variable_block_sizes: torch.Tensor,
    q_variable_block_sizes: torch.Tensor,
    topk: int,
    block_size: Union[int, Sequence[int]] = (4, 4, 4),
    compress_attn_weight: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """VSA (compression branch + top-k sparse branch + gate), BHSD, fp32 result.

    - compression: per-block means over valid tokens; coarse attention over blocks
      (kv blocks of size 0 are excluded); ``out_c`` broadcast to every token of its q block.
    - selection: top-k on the coarse pre-softmax scores, exactly ``min(topk, KVb)`` per row.
    - sparse: block-sparse attention with the selected map and ``variable_block_sizes``.
    - result: ``out_c * compress_attn_weight + out_s`` (or ``out_c + out_s``).
    """
    if isinstance(block_size, int):
        block_elements = block_size
    else:
        block_elements = math.prod(block_size)
    b, h, sq, d = q.shape
    qc = block_mean_reference(q, q_variable_block_sizes, block_elements)
    kc = block_mean_reference(k, variable_block_sizes, block_elements)
    vc = block_mean_reference(v, variable_block_sizes, block_elements)
    scores = torch.matmul(qc, kc.transpose(-2, -1)) * d ** -0.5
    kv_present = (variable_block_sizes.to(q.device) > 0).view(1, 1, 1, -1)
    scores = scores.masked_fill(~kv_present, float("-inf"))
    if kv_present.any():
        attn = torch.softmax(scores, dim=-1)
    else:  # nothing to attend to: the compression branch contributes 0
        attn = torch.zeros_like(scores)
    out_c = torch.matmul(attn, vc).repeat_interleave(block_elements, dim=2)
    block_map = topk_block_map_reference(scores.detach(), topk)
    out_s, _ = block_sparse_attn_reference(q, k, v, block_map, variable_block_sizes, block_elements)
    if compress_attn_weight is not None:
        return out_c * compress_attn_weight.float() + out_s
    return out_c + out_s


# ---------------------------------------------------------------- VSA glue, one op at a time
# (the pieces of video_sparse_attn_reference, for testing the fused kernels one by one; block
# means are block_mean_reference above)


def _float_at_least_32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def coarse_attention_reference(
    qc: torch.Tensor,
    kc: torch.Tensor,
    vc: torch.Tensor,
    kv_block_sizes: torch.Tensor,
    sm_scale: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """VSA's coarse attention over block means ``[B, H, n, D]`` (fp32, or fp64 for fp64 input).

    Returns ``(out_c, lse, scores)``: ``scores = qc @ kc^T * sm_scale`` with ``-inf`` columns for
    empty kv blocks (size 0), ``out_c = softmax(scores) @ vc`` (0 when every kv block is empty),
    ``lse`` the natural-log row log-sum-exp of ``scores`` (``-inf`` then). Differentiable.
    """
    qf, kf, vf = _float_at_least_32(qc), _float_at_least_32(kc), _float_at_least_32(vc)
    scale = qc.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    present = (kv_block_sizes.to(qc.device) > 0).view(1, 1, 1, -1)
    scores = torch.matmul(qf, kf.transpose(-2, -1)) * scale
    scores = scores.masked_fill(~present, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    if bool(present.any()):
        probs = torch.softmax(scores, dim=-1)
    else:
        probs = torch.zeros_like(scores)
    return torch.matmul(probs, vf), lse, scores


def topk_indices_reference(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """The ``min(topk, n)`` column indices of each row of ``scores [..., n]`` that a stable
    descending sort puts first, returned ascending (int64 ``[..., k]``).

    Written as a rank, no sort: column j beats column i when it is larger, or equal with a lower
    index. Floats compare as floats (``-0.0 == +0.0``: a tie); NaN is larger than everything and
    equal to every NaN.
    """
    n = scores.shape[-1]
    k = min(int(topk), n)
    nan = torch.isnan(scores)
    s, t = scores.unsqueeze(-1), scores.unsqueeze(-2)  # [..., i, 1], [..., 1, j]
    ns, nt = nan.unsqueeze(-1), nan.unsqueeze(-2)
    idx = torch.arange(n, device=scores.device)
    greater = (nt & ~ns) | (~nt & ~ns & (t > s))
    equal = (nt & ns) | (t == s)
    beats = greater | (equal & (idx.view(1, n) < idx.view(n, 1)))
    selected = beats.sum(dim=-1) < k
    ranked = torch.where(selected, idx.expand_as(selected), torch.full_like(selected, n, dtype=torch.int64))
    return ranked.sort(dim=-1).values[..., :k]


def gate_compose_reference(
    out_s: torch.Tensor,
    out_c: torch.Tensor,
    gate: Optional[torch.Tensor],
    block_elements: int,
) -> torch.Tensor:
    """``out_s + gate * out_c`` (``out_s + out_c`` without a gate), BHSD, fp32: row i of
    ``out_c [B, H, Qb, D]`` is broadcast to every token of q block i (padding tokens too)."""
    oc = _float_at_least_32(out_c).repeat_interleave(block_elements, dim=2)
    if gate is not None:
        oc = oc * _float_at_least_32(gate)
    return _float_at_least_32(out_s) + oc
