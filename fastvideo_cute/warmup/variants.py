"""What a warm-up plans for: the target GPU, the workloads (call shapes), and the
:class:`VariantKey` each route compiles one kernel variant on."""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

from fastvideo_cute.backends.base import CompileKey
from fastvideo_cute.kernels.cute import block_sparse_fwd128 as _fwd128  # mode names only (no CuTe import)


def parse_arch(text: str) -> Tuple[int, int]:
    """"sm_90", "sm_90a", "90", "9.0", "sm_121a", "12.1" -> (major, minor)."""
    s = str(text).strip().lower()
    if s.startswith("sm_"):
        s = s[3:]
    s = s.rstrip("af")
    if "." in s:
        major, minor = s.split(".", 1)
        return int(major), int(minor)
    if not s.isdigit() or len(s) < 2:
        raise ValueError(f"not a GPU arch: {text!r} (expected e.g. sm_90, sm_100, sm_120, 12.1)")
    return int(s[:-1]), int(s[-1])


def arch_str(arch: Optional[Tuple[int, int]]) -> str:
    return "cpu" if arch is None else f"sm_{arch[0]}{arch[1]}"


def cute_arch_str(arch: Tuple[int, int]) -> str:
    """The ``--gpu-arch`` string our CuTe kernels are built for (arch-specific "a" targets)."""
    return f"sm_{arch[0]}{arch[1]}a"


@dataclasses.dataclass(frozen=True)
class Target:
    """What the plan is for: CUDA with a compute capability, or CPU tensors (Triton interpreter)."""

    device_type: str  # "cuda" or "cpu"
    arch: Optional[Tuple[int, int]]
    runnable: bool  # this process can launch on it (else: plan only, and ours cross-compile)

    @property
    def label(self) -> str:
        return arch_str(self.arch) if self.device_type == "cuda" else "cpu (Triton interpreter)"


@dataclasses.dataclass(frozen=True)
class Workload:
    """One attention call shape: what the model calls VSA's sparse branch with."""

    label: str
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    block_size: int
    dtype: str
    layout: str = "bhsd"
    grid: Optional[Tuple[int, int, int]] = None  # latent grid -> ragged block sizes (None: all full)
    tile: Optional[Tuple[int, int, int]] = None
    topk: int = 1
    entry: str = "vsa"  # "vsa": video_sparse_attn (LSE discarded), "bsa": block_sparse_attn_* (LSE returned)
    #: (``vsa``) the call passes ``compress_attn_weight``, as FastVideo's VSA layers do; gated
    #: inference may run another kernel (the sm90 forward with the gate fused, routes.select_vsa_routes)
    gated: bool = True

    @property
    def name(self) -> str:
        return f"{self.label}/{self.entry}/b{self.block_size}/{self.dtype}/{self.layout}"

    @property
    def all_full(self) -> bool:
        """Every kv block full (what the op's cached range check reports for these sizes)."""
        if self.grid is None:
            return True
        from ..tiling import variable_block_sizes

        return bool((variable_block_sizes(self.grid, self.tile) == self.block_size).all())

    @property
    def num_blocks(self) -> int:
        return self.seq_len // self.block_size

    def shape(self) -> Tuple[int, int, int, int]:
        if self.layout == "bshd":
            return (self.batch, self.seq_len, self.heads, self.head_dim)
        return (self.batch, self.heads, self.seq_len, self.head_dim)


# The static facts a backend compiles one variant on (the backends' ``compile_keys`` build them).
VariantKey = CompileKey


@dataclasses.dataclass
class PlanUnit:
    """One workload in one mode: a forward (and, in ``train``, its backward) on one route."""

    workload: Workload
    mode: str  # "train" (fwd + bwd, need_grad) or "infer" (fwd, no grad)
    route: Optional[str]
    error: Optional[str] = None
    keys: Dict[str, VariantKey] = dataclasses.field(default_factory=dict)
    note: str = ""  # why a CuTe request fell back to Triton, when it did

    @property
    def directions(self) -> Tuple[str, ...]:
        return ("fwd", "bwd") if self.mode == "train" else ("fwd",)

    def row_id(self, direction: str) -> str:
        return f"{self.workload.name}/{self.mode}/{direction}"


_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def torch_dtype(name: str):
    import torch

    return getattr(torch, _TORCH_DTYPES[name])


def synthetic_call_info(w: Workload, target: Target, need_grad: bool):
    """The ``CallInfo`` the op would build for this workload on the target (no tensors)."""
    from ..call import CallInfo

    fields = {f.name for f in dataclasses.fields(CallInfo)}
    extra = {"batch": w.batch, "heads": w.heads, "q_len": w.seq_len, "kv_len": w.seq_len,
             "bshd": w.layout == "bshd",
             # newer CallInfo fields, passed when this version of the router has them:
             "need_lse": w.entry == "bsa",  # video_sparse_attn discards the sparse branch's LSE
             "kv_all_full": w.all_full}
    return CallInfo("block_sparse", target.device_type, target.arch if target.device_type == "cuda" else None,
                    torch_dtype(w.dtype), w.head_dim, w.block_size, need_grad,
                    **{k: v for k, v in extra.items() if k in fields})


def variant_key(route: str, w: Workload, direction: str, target: Target) -> VariantKey:
    """The compile key of one direction of a workload on ``route`` (asks the backend)."""
    from ..backends import BACKENDS

    return BACKENDS[route].compile_keys(synthetic_call_info(w, target, direction == "bwd"))[direction]


#: sm120 adapter variant (the kernel's mode) -> its registry name (``fastvideo_cute.kernels.cute.REGISTRY``)
SM120_REGISTRY_NAMES = {v: _fwd128.registry_name(v) for v in _fwd128.MODES}


def sm120_variant(arch: Optional[Tuple[int, int]]) -> str:
    """The variant the sm120 adapter compiles on a GPU of compute capability ``arch``:
    ``$FASTVIDEO_CUTE_SM120_KERNEL`` if set, else its measured default for that arch ("w4r3" on
    sm_90, "simple_split" on sm_120/sm_121). Raises ``ValueError`` for a bad variable value."""
    from ..adapters.cute_sm120 import default_variant

    return default_variant(cute_arch_str(arch) if arch is not None else None)
