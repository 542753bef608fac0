"""What a warm-up plans for: the target GPU, the workloads (call shapes), and the
:class:`VariantKey` each route compiles one kernel variant on."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Dict, Optional, Tuple

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


@dataclasses.dataclass(frozen=True)
class VariantKey:
    """The static facts a route compiles one kernel variant on. Two calls with equal keys run the
    same compiled code, so the second is served from the first's compile."""

    route: str
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


def _int_class(n: int) -> str:
    """How Triton 3.x specializes an int argument: ``1`` is a constant, multiples of 16 carry a
    divisibility hint, and values past int32 are i64 (tests cross-check it against Triton)."""
    if n == 1:
        return "1"
    width = "i64" if not -(2 ** 31) <= n < 2 ** 31 else "i32"
    return f"{width}/16" if n % 16 == 0 else width


def _triton_detail(w: Workload, direction: str) -> Tuple[Tuple[str, str], ...]:
    from ..backends.triton_backend import PHYSICAL_TILES

    q_tile, kv_tile = PHYSICAL_TILES[w.block_size]
    try:
        from ..kernels.triton._common import default_config

        cfg = default_config(w.head_dim, torch_dtype(w.dtype), q_tile, kv_tile)
        sections = ("fwd",) if direction == "fwd" else ("bwd_pre", "bwd_dq", "bwd_dkdv")
        cfg_txt = ";".join(f"{s}:" + ",".join(f"{k}={v}" for k, v in sorted(cfg[s].items())) for s in sections)
    except Exception as exc:  # noqa: BLE001 - the key stays usable without the kernel package
        cfg_txt = f"unknown ({type(exc).__name__})"
    h, s, d, b = w.heads, w.seq_len, w.head_dim, w.batch
    strides = (s * h * d, d, h * d) if w.layout == "bshd" else (h * s * d, s * d, d)
    ints = {"H": h, "S": s, "Qb": s // q_tile, "KVb": s // kv_tile, "sb": strides[0], "sh": strides[1],
            "sm": strides[2]}
    spec = ",".join(f"{k}:{_int_class(v)}" for k, v in ints.items())
    return (("tile", f"{q_tile}x{kv_tile}"), ("config", cfg_txt), ("ints", spec))


def _fa4_detail(w: Workload, direction: str, arch: Tuple[int, int]) -> Tuple[Tuple[str, str], ...]:
    from ..adapters.fa4 import _sm90_bwd_tile_m, fa4_bwd_plan, fa4_fwd_plan

    plan = fa4_fwd_plan(arch, w.block_size) if direction == "fwd" else fa4_bwd_plan(arch, w.block_size)
    tile = f"{plan.tile_mn[0]}x{plan.tile_mn[1]}" if plan.tile_mn else "fa4-default"
    if direction == "bwd" and arch[0] == 9:
        tile = f"{_sm90_bwd_tile_m(w.head_dim, plan.q_sparse)}x{plan.kv_tile}"
    detail = [("tile", tile),
              ("plan", f"q{plan.q_sparse}/kv{plan.kv_tile}" + ("/1stage" if plan.single_q_stage else "")),
              # FA4 keys on "one q block" / "one kv block" (TVM stride specialization)
              ("single_blocks", f"{w.seq_len <= plan.q_sparse}/{w.seq_len <= plan.kv_tile}")]
    return tuple(detail)


def variant_key(route: str, w: Workload, direction: str, target: Target) -> VariantKey:
    if route == "triton":
        detail = _triton_detail(w, direction)
    elif route == "fa4":
        detail = _fa4_detail(w, direction, target.arch)
    elif route == "sm120":
        variant = sm120_variant(target.arch)
        detail = (("kernel", SM120_REGISTRY_NAMES.get(variant, variant)), ("tile", "128x128"),
                  ("target", cute_arch_str(target.arch)))
    else:  # a backend this module does not know the compile facts of: key on the call's statics
        detail = (("layout", w.layout),)
    # sm120 runs 256-token blocks as 2x2 128-token tiles: one compiled kernel for both block sizes.
    block = 128 if route == "sm120" else w.block_size
    return VariantKey(route, direction, arch_str(target.arch) if target.device_type == "cuda" else "cpu",
                      w.dtype, w.head_dim, block, detail)


#: sm120 adapter variant (the kernel's mode) -> its registry name (``fastvideo_cute.kernels.cute.REGISTRY``)
SM120_REGISTRY_NAMES = {v: _fwd128.registry_name(v) for v in _fwd128.MODES}


def sm120_variant(arch: Optional[Tuple[int, int]]) -> str:
    """The variant the sm120 adapter compiles on a GPU of compute capability ``arch``:
    ``$FASTVIDEO_CUTE_SM120_KERNEL`` if set, else its measured default for that arch ("w4r3" on
    sm_90, "simple_split" on sm_120/sm_121). Raises ``ValueError`` for a bad variable value."""
    from ..adapters.cute_sm120 import default_variant

    return default_variant(cute_arch_str(arch) if arch is not None else None)
