"""Host side of our sm_90a 64-token forward (``kernels/cute/block_sparse_fwd64/block_sparse_fwd64_sm90``).

Verified on the H200 (tests/kernels/cute/test_block_sparse_fwd64_sm90_gpu.py over the default,
``q_regs=112``, eager-rescale and no-vote builds, the fused-gate epilogue included:
tests/logs/h200_2026-12-03_suites_vote_fe1b35c.log). Served by the ``sm90`` backend
(:mod:`fastvideo_cute.backends.sm90_backend`): the route table's sm_90 64-token forward and
128/256-token partial-tile forwards (1.06-1.10x cuDNN BSA's blk64 kernel with the lazy rescale and
its vote, ``benchmarks/results/fwd64_sm90_h200_v11.json``), and ``video_sparse_attn``'s gated inference calls,
where the fused gate also saves cuDNN's padding-zeroed V copy and the separate gate pass.

:func:`sm90_fwd64` takes the library's q2k lists (``q2k_idx`` int32 ``[B, H, Qb, W]``, first
``q2k_num`` entries selected, the rest never read; ``q2k_num`` int32 ``[B, H, Qb]``) and the kv
block sizes (int32 ``[KVb]``, or None when every block is full), already validated by the
library's checks, and returns ``(out, lse)``: out in the call layout (BHSD or BSHD, contiguous),
lse natural-log fp32 ``[B, H, S_q]``. Padded K/V rows may hold anything (NaN/Inf included): the
kernel masks them itself. :func:`sm90_fwd64_problems` says why a call cannot be served (None when
it can), without a GPU sync; :func:`tma_problem` is its per-tensor part (base alignment, strides),
also what a gate must pass. Where one head's K/V outgrow the L2 (Wan2.1-14B 720p on the H200) the
forward runs split by kv range (``kv_splits``, :func:`auto_kv_splits`, :func:`split_lists_by_kv_range`).

Imports torch; the CuTe DSL only when a kernel is compiled.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..jit import compile_kernel
from .kernel_layout import permutations

__all__ = ["sm90_fwd64_problems", "sm90_fwd64", "tma_problem", "split_lists_by_kv_range", "auto_kv_splits",
           "pack_steps", "HEAD_DIMS", "DTYPES"]

CAPABILITY = (9, 0)
BLOCK = 64
HEAD_DIMS = (64, 128)  # the kernel module's, repeated so the predicate never imports the CuTe DSL
DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
BASE_ALIGN = 128
STRIDE_ALIGN = 16

_COMPILED: Dict[tuple, Any] = {}


@functools.lru_cache(maxsize=None)
def _capability(device_index: int) -> Tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(device_index))


def sm90_fwd64_problems(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, bshd: bool) -> Optional[str]:
    """None when :func:`sm90_fwd64` serves these tensors, else a one-line reason."""
    if not q.is_cuda:
        return "not a CUDA tensor"
    cc = _capability(q.get_device())
    if cc != CAPABILITY:
        return f"compute capability {cc[0]}.{cc[1]}: the kernel is sm_90a only"
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"q/k/v must share one dtype of {sorted(str(d) for d in DTYPES)}, got {q.dtype}/{k.dtype}/{v.dtype}"
    if q.dim() != 4 or k.shape != v.shape or q.shape[3] != k.shape[3]:
        return "q, k, v must be 4-D with k and v of one shape and one head_dim"
    if q.shape[3] not in HEAD_DIMS:
        return f"head_dim {q.shape[3]}: one of {HEAD_DIMS}"
    heads = (q.shape[2], k.shape[2]) if bshd else (q.shape[1], k.shape[1])
    if heads[0] != heads[1]:
        return f"{heads[0]} query heads and {heads[1]} kv heads: MHA only"
    sq = q.shape[1] if bshd else q.shape[2]
    if sq % BLOCK:
        return f"q_len {sq} is not a multiple of {BLOCK}"
    if q.numel() == 0 or k.numel() == 0:
        return "an empty tensor"
    for name, t in (("q", q), ("k", k), ("v", v)):
        problem = tma_problem(name, t)
        if problem is not None:
            return problem
    return None


def tma_problem(name: str, t: torch.Tensor) -> Optional[str]:
    """None when ``t``'s base and strides suit the kernel's TMA descriptors (q, k, v, the gate),
    else a one-line reason naming it. Fresh contiguous allocations always pass."""
    if t.data_ptr() % BASE_ALIGN:
        return f"{name}'s base address is not {BASE_ALIGN}-byte aligned (TMA)"
    if t.stride(-1) != 1:
        return f"{name} has a non-unit last stride {t.stride(-1)}"
    if any((st * t.element_size()) % STRIDE_ALIGN for st in t.stride()[:-1]):
        return f"{name} has an outer stride that is not a multiple of {STRIDE_ALIGN} bytes (TMA)"
    return None


def _kernel_fn(dtype: torch.dtype, head_dim: int, has_sizes: bool, fuse_gate: bool, variant: Tuple = ()):
    """``variant``: sorted ``(keyword, value)`` pairs of the kernel's configuration."""
    key = (dtype, head_dim, has_sizes, fuse_gate, variant)
    fn = _COMPILED.get(key)
    if fn is None:
        from ..kernels.cute.block_sparse_fwd64 import sm90_kernel

        kernel = sm90_kernel(DTYPES[dtype], head_dim, has_sizes, fuse_gate, **dict(variant))
        fn = _COMPILED[key] = compile_kernel(kernel, "sm_90a")[0]
    return fn


def sm90_fwd64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k_idx: torch.Tensor, q2k_num: torch.Tensor,
               block_sizes: Optional[torch.Tensor], *, bshd: bool, softmax_scale: Optional[float] = None,
               gate: Optional[torch.Tensor] = None,
               out_c: Optional[torch.Tensor] = None,
               variant: Optional[Dict[str, Any]] = None,
               out: Optional[torch.Tensor] = None,
               out_s: Optional[torch.Tensor] = None,
               kv_splits: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """Our sm_90a 64-token forward: ``(out, lse)`` (module docstring). The call must pass
    :func:`sm90_fwd64_problems`; the lists are int32 and contiguous.

    ``gate`` (q's shape, layout and dtype; 128-byte aligned) with ``out_c`` (``[B, H, Qb, D]``,
    q's dtype, unit last stride): the kernel's epilogue returns ``out_s + gate * out_c`` (out_c's
    row of each q tile broadcast over its rows; fp32, rounded once) instead of ``out_s``, the VSA
    gate composition without a pass of its own; the LSE stays the sparse branch's. Verified on the
    H200 (tests/kernels/cute/test_block_sparse_fwd64_sm90_gpu.py::test_fused_gate_matches_reference).

    ``variant``: the kernel's configuration (``k_stages``, ``v_stages``, ``ctas_per_sm``,
    ``stmatrix_epilogue``, ``q_regs``, ``lazy_rescale``, ``lazy_vote`` of ``BlockSparseFwd64Sm90``), for the
    benchmarks' sweeps and the GPU tests; None is the kernel's default. With ``packed_steps`` the
    lists (each kv range's) are packed by :func:`pack_steps` first (one Triton launch per range).

    ``out``: where the output goes (q's shape, dtype and layout, any strides that pass
    :func:`tma_problem`, e.g. a head slice of a bigger tensor); None allocates it.

    ``out_s`` (with ``gate``; the training forward, whose backward needs the sparse branch's own
    output): a tensor like ``out`` that also receives ``out_s`` (the kernel's ``store_out_s``: the
    same bits as the call without the gate returns), so the gate composition needs no pass of its
    own in training either.

    ``kv_splits`` (>= 1; the lists must be ascending, as the library's are): the kv tiles in that
    many ranges, one launch per range, each over the entries of every list in its range: all heads'
    first range, then the second, so the K/V that the resident CTAs of one head touch is one
    range's (one head's K/V past ~0.6 of the L2 slows the kernel: ``auto_kv_splits``). The first
    launch writes its output and LSE as usual (into ``out_s`` when given, else ``out``); each later
    one merges its own with them by the LSEs in its epilogue (the kernel's ``merge_prev``), the last
    one also composing the gate. The earlier ranges' output passes through bf16 once per range."""
    if (gate is None) != (out_c is None):
        raise ValueError("gate and out_c are given together or not at all")
    if out_s is not None and gate is None:
        raise ValueError("sm90_fwd64: out_s is the sparse branch beside out_s + gate * out_c; it needs gate and out_c")
    for name, t in (("out", out), ("out_s", out_s)):  # checked before anything is compiled or launched
        if t is None:
            continue
        if t.shape != q.shape or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"sm90_fwd64: {name} must have q's shape, dtype and device {tuple(q.shape)}, {q.dtype}, "
                             f"{q.device}; got {tuple(t.shape)}, {t.dtype}, {t.device}")
        problem = tma_problem(name, t)
        if problem is not None:
            raise ValueError(f"sm90_fwd64: {problem}")
    if not isinstance(kv_splits, int) or kv_splits < 1:
        raise ValueError(f"sm90_fwd64: kv_splits must be an int >= 1, got {kv_splits!r}")
    d = q.shape[3]
    variant = dict(variant or {})
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    b, h, sq, qko, vp = permutations(q.shape, bshd)  # -> (S, D, H, B) / (D, S, H, B)
    lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    qk = (q.permute(qko), k.permute(qko), v.permute(vp))
    kvb = -(-(k.shape[1] if bshd else k.shape[2]) // BLOCK)
    parts = split_lists_by_kv_range(q2k_idx, q2k_num, kvb, kv_splits)
    packed = bool(variant.get("packed_steps"))
    kv_len = k.shape[1] if bshd else k.shape[2]
    running = out_s if out_s is not None else out  # where the earlier ranges' output waits
    for i, (idx, num) in enumerate(parts):
        last, first = i == len(parts) - 1, i == 0
        var = dict(variant)
        if last and out_s is not None:
            var["store_out_s"] = True
        if not first:
            var["merge_prev"] = True
        gated = last and gate is not None
        sizes = block_sizes
        if packed:  # the tiles' sizes go into the step words; the kernel reads no sizes
            idx, num = pack_steps(idx, num, block_sizes, kv_len)
            sizes = None
        fn = _kernel_fn(q.dtype, d, sizes is not None, gated, tuple(sorted(var.items())))
        dst = out if last else running
        fn(*qk, dst.permute(qko), lse.permute(2, 1, 0), idx.permute(3, 2, 1, 0), num.permute(2, 1, 0), sizes,
           gate.permute(qko) if gated else None, out_c.permute(3, 2, 1, 0) if gated else None,
           out_s.permute(qko) if last and out_s is not None else None,
           None if first else running.permute(qko), scale)
    return out, lse


def pack_steps(q2k_idx: torch.Tensor, q2k_num: torch.Tensor, block_sizes: Optional[torch.Tensor],
               kv_len: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The q2k lists (int32 ``[B, H, Qb, W]``, counts ``[B, H, Qb]``) as the kernel's packed step lists
    (``packed_steps``): int32 ``[B, H, Qb, 4 W]`` (four words a step) and step counts ``[B, H, Qb]``, by
    one Triton launch (``kernels/triton/packed_steps``: its module docstring has the word format).
    Every whole tile stays one step; the 16-key pieces of the partial tiles (``block_sizes``, and the
    tile cut by ``kv_len``) go four to a step, so a row's partial tiles cost the steps their keys fill."""
    from ..kernels.triton.packed_steps import packed_steps

    idx = q2k_idx.to(torch.int32).contiguous()
    num = q2k_num.to(torch.int32).contiguous()
    w = idx.shape[-1]
    steps = torch.empty(tuple(idx.shape[:-1]) + (4 * w,), dtype=torch.int32, device=idx.device)
    nsteps = torch.empty(tuple(num.shape), dtype=torch.int32, device=idx.device)
    sizes = None if block_sizes is None else block_sizes.to(torch.int32).contiguous()
    packed_steps(idx.view(-1, w), num.view(-1), sizes, int(kv_len), steps.view(-1, 4 * w), nsteps.view(-1))
    return steps, nsteps


#: the kv-range lists by one Triton launch on CUDA instead of ~11 torch launches (~270 us a call at
#: Wan2.1-14B 720p). On since it ran on the H200 (2026-12-03): its GPU test (lists and forward bitwise
#: against the torch ops, tests/kernels/cute/test_block_sparse_fwd64_sm90_kvsplit_gpu.py) passed and
#: benchmarks/ab_vsa_glue.py's "sm90-lists-triton" measured the 14B forward 40.15 -> 39.80 ms with the
#: same output (benchmarks/results/ab_vsa_glue_h200_lists_14b.json). False: the torch ops.
_TRITON_LISTS = True


def split_lists_by_kv_range(q2k_idx: torch.Tensor, q2k_num: torch.Tensor, kvb: int,
                            splits: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """The q2k lists (ascending; int32 ``[B, H, Qb, W]`` and counts ``[B, H, Qb]``) cut into
    ``splits`` lists by kv range: range ``s`` is tiles ``[ceil(s * kvb / splits), ceil((s + 1) *
    kvb / splits))``; list ``s`` holds each row's entries in it, in order, from its first slot
    (``(idx, num)`` like the input's; ``splits == 1``: the input itself). The torch ops below;
    with ``_TRITON_LISTS`` on CUDA one Triton launch (``kernels/triton/kv_range_lists``; slots past
    a list's count differ between the two, never read)."""
    if splits == 1:
        return [(q2k_idx, q2k_num)]
    if _TRITON_LISTS and q2k_idx.is_cuda:
        return _split_lists_triton(q2k_idx, q2k_num, kvb, splits)
    return _split_lists_torch(q2k_idx, q2k_num, kvb, splits)


def _split_lists_triton(q2k_idx: torch.Tensor, q2k_num: torch.Tensor, kvb: int,
                        splits: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    from ..kernels.triton.kv_range_lists import kv_range_lists

    idx = q2k_idx.to(torch.int32).contiguous()
    num = q2k_num.to(torch.int32).contiguous()
    w = idx.shape[-1]
    out = torch.empty((splits - 1,) + tuple(idx.shape), dtype=torch.int32, device=idx.device)
    cnt = torch.empty((splits,) + tuple(num.shape), dtype=torch.int32, device=idx.device)
    kv_range_lists(idx.view(-1, w), num.view(-1), kvb, splits, out.view(splits - 1, -1, w),
                   cnt.view(splits, -1))
    return [(idx, cnt[0])] + [(out[s - 1], cnt[s]) for s in range(1, splits)]


def _split_lists_torch(q2k_idx: torch.Tensor, q2k_num: torch.Tensor, kvb: int,
                       splits: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    w = q2k_idx.shape[-1]
    slots = torch.arange(w, device=q2k_idx.device, dtype=torch.int32)
    num = q2k_num.clamp(0, w)
    valid = slots < num[..., None]
    cuts = [torch.zeros_like(num)]
    for s in range(1, splits):
        bound = -(-s * kvb // splits)
        cuts.append((valid & (q2k_idx < bound)).sum(-1, dtype=torch.int32))
    cuts.append(num)
    out = []
    for s in range(splits):
        start = cuts[s]
        idx = q2k_idx if s == 0 else q2k_idx.gather(-1, (slots + start[..., None]).clamp(max=w - 1).long())
        out.append((idx.contiguous(), (cuts[s + 1] - start).to(torch.int32).contiguous()))
    return out


#: one head's K/V past this share of the L2 is split. The H200 (60 MiB of L2 as the driver reports it):
#: the kernel over half the kv range ran 1.09x faster with 45 MiB of K/V per head and 1.02x with 32 MiB
#: (benchmarks/results/kv_working_set_h200.json); end to end at Wan2.1-14B 720p (45 MiB per head) two
#: ranges were faster in every interleaved round (ab_vsa_glue_h200_kv_14b*.json). 0.6 splits 45 MiB,
#: not 32 MiB (cuDNN's wrapper uses 3/4 of the L2, which at 60 MiB leaves Wan-14B unsplit).
KV_SPLIT_L2_SHARE = 0.6
#: how many ranges: the fewest that keep one range's K/V within this share of the L2. Measured end to
#: end (ab_vsa_glue_h200_kvn_{14b,hunyuan}.json, five interleaved rounds, 2, 3 and 4 ranges): the
#: fastest range held 0.375 of the L2 both at Wan2.1-14B 720p (45 MiB per head: two ranges, three and
#: four slower) and at HunyuanVideo 720p (67.5 MiB: three ranges, 4.6 % / 1.5 % faster than two at
#: 87.5 % / 90 %, four slower); 0.25-0.28 and >= 0.56 of the L2 per range were slower.
KV_RANGE_L2_SHARE = 0.4
#: at most this many ranges (the most measured; each range's launch rounds the merged output to the
#: output dtype once more)
KV_SPLITS_MAX = 4


def auto_kv_splits(device: torch.device, q_len: int, kv_len: int, head_dim: int, elem_size: int,
                   lists_width: int) -> int:
    """When one head's K/V (``kv_len`` x ``head_dim`` x 2 tensors) exceed ``KV_SPLIT_L2_SHARE`` of
    the device's L2, the fewest ranges (at least 2, at most ``KV_SPLITS_MAX``) whose K/V each fit
    ``KV_RANGE_L2_SHARE`` of it, provided each head has at least three waves of query tiles (three
    CTAs per SM; fewer would put several heads in one wave, a footprint this rule does not model)
    and the lists are at least 32 wide; else 1."""
    if device.type != "cuda" or lists_width < 32:
        return 1
    l2, sms = _props(device.index if device.index is not None else torch.cuda.current_device())
    kv_bytes = 2 * kv_len * head_dim * elem_size
    if l2 <= 0 or q_len // BLOCK < 3 * sms or kv_bytes <= KV_SPLIT_L2_SHARE * l2:
        return 1
    return min(KV_SPLITS_MAX, max(2, math.ceil(kv_bytes / (KV_RANGE_L2_SHARE * l2))))


@functools.lru_cache(maxsize=None)
def _props(device_index: int) -> Tuple[int, int]:
    p = torch.cuda.get_device_properties(device_index)
    return int(getattr(p, "L2_cache_size", 0)), int(p.multi_processor_count)
