"""The one backend protocol every route implements, and the compile key the warm-up plans with.

A backend is an object with:

- ``name``: what ``FASTVIDEO_VSA_BACKEND`` names it by;
- ``head_dims``: every head_dim it serves on some GPU (validation rejects a head_dim no backend has);
- ``verified_on(arch) -> bool``: whether its kernels have passed their GPU tests on that compute
  capability (the router only picks a backend automatically where it is verified; an unverified
  one serves only when named);
- ``support(call) -> (ok, reason)``: static facts only (never reads tensor values, never syncs);
- ``forward(q, k, v, sparsity, kv_block_sizes, *, block_size, bshd, need_backward, sm_scale)
  -> (out, lse)``: ``out`` shaped and strided as ``torch.empty_like(q,
  memory_format=torch.contiguous_format)``, ``lse`` fp32 ``[B, H, S_q]`` natural log (``-inf`` for
  rows without a valid key), or anything when the caller discards it (``need_lse=False``);
- ``backward(q, k, v, out, dout, lse, sparsity, kv_block_sizes, *, block_size, bshd, sm_scale)
  -> (dq, dk, dv)``, each shaped and strided like ``empty_like(x, contiguous_format)``;
- ``kv_padding_zero`` (keyword, default False): the caller's K/V padding rows are already zero
  (``video_sparse_attn``'s compression pass wrote them so for a backend with
  ``zeroes_kv_padding = True``, one that would otherwise copy K/V to zero it); others ignore it;
- ``sparsity``: a :class:`~fastvideo_cute.metadata.BlockSparsity` (or a bool map, which a backend
  wraps with ``BlockSparsity.of``): the backend asks it for the form its kernels take (q2k lists
  or the map), so lists that reached the op are not turned into a map and back;
- ``fuses_gate`` (optional, default False) with ``forward_gated(q, k, v, sparsity, kv_block_sizes,
  gate, out_c, *, block_size, bshd, sm_scale, out=None, out_s=None) -> (out, lse)``: the forward returns
  ``video_sparse_attn``'s ``out_s + gate * out_c`` itself (``sm90``), so the glue skips its gate
  pass on an inference call; ``out`` (q's shape, dtype, layout; e.g. a head slice of the call's
  output) is written in place when given (``vsa_pipeline``'s head groups); ``out_s`` (a tensor
  like ``out``), when given, also receives the sparse branch's own output (the training forward:
  its backward needs it), so the gate pass is skipped in training too;
- ``compile_keys(call) -> {direction: CompileKey}``: the static facts each direction of the call
  compiles one kernel variant on (the warm-up's plan), for ``"fwd"`` and, with ``need_grad``,
  ``"bwd"``.

Inputs reach a backend validated (``fastvideo_cute.validation``): q/k/v share dtype, device and
head_dim, lengths are multiples of the block, the map is bool ``[B, H, Qb, KVb]`` (lists:
ascending, distinct, in range) and the sizes int32 ``[KVb]`` within ``[0, block]``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
from typing import Dict, Protocol, Tuple, runtime_checkable

import torch

from ..call import CallInfo

__all__ = ["Backend", "CompileKey", "Verdict", "dtype_name", "arch_name", "module_installed", "stack_problems"]

Verdict = Tuple[bool, str]

_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def arch_name(call: CallInfo) -> str:
    return "cpu" if call.arch is None else f"sm_{call.arch[0]}{call.arch[1]}"


@dataclasses.dataclass(frozen=True)
class CompileKey:
    """The static facts a backend compiles one kernel variant on. Two calls with equal keys run
    the same compiled code, so the second is served from the first's compile."""

    route: str  # the backend's name
    direction: str  # "fwd" or "bwd"
    arch: str  # "sm_90", ..., or "cpu"
    dtype: str
    head_dim: int
    block_size: int
    detail: Tuple[Tuple[str, str], ...] = ()

    def digest(self) -> str:
        """Stable across processes and machines (sha256 of the canonical JSON, not ``hash()``)."""
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    @property
    def label(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.detail if k in ("tile", "plan", "kernel"))
        return f"{self.route} {self.direction} {self.dtype} d{self.head_dim} b{self.block_size} {self.arch}" + (
            f" {extra}" if extra else "")


def basic_key(name: str, call: CallInfo, direction: str, block_size: int, detail=()) -> CompileKey:
    return CompileKey(name, direction, arch_name(call), dtype_name(call.dtype), call.head_dim, block_size,
                      tuple(detail))


@runtime_checkable
class Backend(Protocol):
    name: str
    head_dims: Tuple[int, ...]  # every head_dim it can serve on some GPU

    def verified_on(self, arch) -> bool: ...

    def support(self, call: CallInfo) -> Verdict: ...

    def forward(self, q, k, v, sparsity, kv_block_sizes, *, block_size: int, bshd: bool, need_backward: bool,
                sm_scale: float, kv_padding_zero: bool = False): ...

    def backward(self, q, k, v, out, dout, lse, sparsity, kv_block_sizes, *, block_size: int, bshd: bool,
                 sm_scale: float, kv_padding_zero: bool = False): ...

    def compile_keys(self, call: CallInfo) -> Dict[str, CompileKey]: ...


@functools.lru_cache(maxsize=None)
def module_installed(name: str) -> bool:
    """``importlib.util.find_spec(name) is not None``, asked once per process (support predicates
    run on every call; what is installed does not change while the process runs)."""
    return importlib.util.find_spec(name) is not None


@functools.lru_cache(maxsize=None)
def stack_problems(check) -> Tuple[str, ...]:
    """``check()`` (a backend's "what is off its pins" function), asked once per process: it reads
    package metadata, ~0.3 ms per package on the H200 host, and support predicates run on every
    routed call."""
    return tuple(check())
