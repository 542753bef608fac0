"""Static input checks shared by the adapters of our own CuTe kernels (sm120, sm100 fwd/bwd).

Each returns ``(True, "")`` or ``(False, reason)`` and never reads tensor values, so a support
predicate built from them never synchronises with the GPU. The launch limits are the kernels' own
(:class:`fastvideo_cute.kernels.cute.limits.LaunchLimits`, one per op package), passed in.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Iterable, Mapping, Optional, Tuple

import torch

from fastvideo_cute.kernels.cute.limits import LaunchLimits  # noqa: F401 (each kernel's limits are one of these)

INT_DTYPES = (torch.int32, torch.int64, torch.int16, torch.uint8)

Verdict = Tuple[bool, str]


@functools.lru_cache(maxsize=None)
def cute_dsl_importable() -> bool:
    return importlib.util.find_spec("cutlass") is not None and importlib.util.find_spec("cuda") is not None


def device_arch(device: torch.device, capabilities: Mapping[Tuple[int, int], str]) -> Optional[str]:
    """The arch string ``capabilities`` maps this device's compute capability to, else None."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return capabilities.get(torch.cuda.get_device_capability(device))


def check_bhsd_bf16(named: Iterable[Tuple[str, object]], head_dim: int) -> Verdict:
    """Every tensor: CUDA, bf16, ``[B, H, S, head_dim]`` contiguous, 16-byte aligned (TMA),
    on the first one's device and of the first one's shape."""
    first = None
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            return False, f"{name} is not a tensor"
        if not t.is_cuda:
            return False, f"{name} is not a CUDA tensor"
        if t.dtype != torch.bfloat16:
            return False, f"{name} must be bfloat16, got {t.dtype}"
        if t.dim() != 4:
            return False, f"{name} must be [B, H, S, {head_dim}], got {tuple(t.shape)}"
        if not t.is_contiguous():
            return False, f"{name} must be contiguous (BHSD)"
        if t.data_ptr() % 16 != 0:
            return False, f"{name} must be 16-byte aligned (TMA)"
        if first is None:
            first = (name, t)
            continue
        if t.device != first[1].device:
            return False, f"{name} is on {t.device}, {first[0]} on {first[1].device}"
        if t.shape != first[1].shape:
            return False, f"{name} has shape {tuple(t.shape)}, {first[0]} {tuple(first[1].shape)}"
    if first is not None and first[1].shape[-1] != head_dim:
        return False, f"head_dim must be {head_dim}, got {first[1].shape[-1]}"
    return True, ""


def check_block_lists(q: torch.Tensor, idx_name: str, idx: Optional[torch.Tensor], num_name: str,
                      num: torch.Tensor, kv_block_sizes: torch.Tensor, block: int, min_width: int = 0) -> Verdict:
    """Integer index lists ``idx [B, H, nb, W >= min_width]`` (may be None), ``num [B, H, nb]``
    and sizes ``[nb]`` on q's device, with ``S == nb * block``."""
    for name, t in ((idx_name, idx), (num_name, num), ("kv_block_sizes", kv_block_sizes)):
        if t is None and name == idx_name:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype not in INT_DTYPES:
            return False, f"{name} must be an integer tensor"
        if t.device != q.device:
            return False, f"{name} is on {t.device}, q on {q.device}"
    if kv_block_sizes.dim() != 1:
        return False, f"kv_block_sizes must be [num_blocks], got {tuple(kv_block_sizes.shape)}"
    batch, heads, seq = q.shape[0], q.shape[1], q.shape[2]
    blocks = kv_block_sizes.numel()
    if blocks == 0 or seq != blocks * block:
        return False, f"seqlen {seq} must equal num_blocks ({blocks}) * {block}"
    if idx is not None and (idx.dim() != 4 or tuple(idx.shape[:3]) != (batch, heads, blocks)
                            or idx.shape[3] < min_width):
        return False, f"{idx_name} must be [{batch}, {heads}, {blocks}, width >= {min_width}], got {tuple(idx.shape)}"
    if tuple(num.shape) != (batch, heads, blocks):
        return False, f"{num_name} must be [{batch}, {heads}, {blocks}], got {tuple(num.shape)}"
    return True, ""


def check_list_forward(q, k, v, q2k_idx, q2k_num, kv_block_sizes, *, head_dim: int, block: int,
                       capabilities: Mapping[Tuple[int, int], str], arch_hint: str,
                       limits: LaunchLimits) -> Verdict:
    """The whole static support predicate of a q2k-list-driven forward kernel (BHSD bf16)."""
    ok, reason = check_bhsd_bf16((("q", q), ("k", k), ("v", v)), head_dim)
    if not ok:
        return False, reason
    if device_arch(q.device, capabilities) is None:
        return False, f"needs {arch_hint}, got compute capability {torch.cuda.get_device_capability(q.device)}"
    if not cute_dsl_importable():
        return False, ("the CuTe DSL (nvidia-cutlass-dsl, cuda-bindings) is not installed "
                       "(pip install 'fastvideo-cute[cute]')")
    ok, reason = check_block_lists(q, "q2k_idx", q2k_idx, "q2k_num", q2k_num, kv_block_sizes, block)
    if not ok:
        return False, reason
    batch, heads, seq, _ = q.shape
    if not limits.fits(batch, heads, seq, kv_block_sizes.numel(), q2k_idx.shape[3]):
        return False, limits.describe()
    return True, ""
