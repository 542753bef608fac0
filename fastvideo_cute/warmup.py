"""JIT warm-up: compile every kernel variant a model will hit once, into a persistent cache.

    fastvideo-cute-warmup --preset wan2.1-1.3b-480p --route cute --cache-dir /opt/fvc-cache --check
    python -m fastvideo_cute.warmup --shape 1 2 256 32 --block 64 --dtype fp32      # CPU (interpreter)
    fastvideo-cute-warmup --preset wan2.1-14b-720p --arch sm_100 --list              # plan only, any box
    fastvideo-cute-warmup --cute-kernels all --arch sm_121a                          # cross-compile ours
    fastvideo-cute-warmup --print-env docker --cache-dir /opt/fvc-cache              # ENV lines

What it does:

1. Points all three JIT caches at one root (``--cache-dir``, else ``$FASTVIDEO_CUTE_CACHE_DIR``,
   else ``~/.cache/fastvideo-cute``): FA4's disk cache (``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``,
   ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=<root>/fa4``), Triton's (``TRITON_CACHE_DIR=<root>/triton``),
   the CuTe DSL's (``CUTE_DSL_CACHE_DIR=<root>/cute-dsl``) and our own CuTe kernels' AOT cache
   (``<root>/fastvideo-cute-<version>/cute``, see :class:`CuteKernelCache`).
2. Enumerates the variants: for every workload (a model preset at a block size, or an explicit
   ``--shape``), dtype and mode (``train``: forward + backward with grad; ``infer``: forward
   without), which route serves it on the target GPU, decided by the routes' own support
   predicates (:func:`fastvideo_cute.routes.select_route` on a synthetic ``CallInfo``), and the
   static facts each route compiles on (:class:`VariantKey`).
3. Runs each workload once through the public API (forward, then backward), which JIT-compiles
   into the caches, times the first call against the steady state, and prints one table row per
   (workload, mode, direction): route, seconds, cache hit/miss, bytes written.
4. ``--check`` starts a fresh ``python -m fastvideo_cute.warmup --verify-only`` process with the
   same arguments, which runs everything again and reports, per variant, whether it loaded from
   the cache (no compile, no new cache file) or had to compile (a miss: exit status 1).

The app must see the same cache: set the variables of ``--print-env`` in its environment (or call
:func:`configure_cache_from_env` before the first CuTe/Triton call). FA4 reads its two variables
when ``flash_attn.cute`` is imported, so they must be set before that.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from .warmup_presets import PRESETS, get_preset, tile_for_block

__all__ = [
    "CACHE_ROOT_ENV",
    "CachePaths",
    "default_cache_root",
    "cache_paths",
    "cache_env",
    "configure_cache",
    "configure_cache_from_env",
    "CuteKernelCache",
    "cute_kernel_cache",
    "compile_registry_kernel",
    "Target",
    "Workload",
    "VariantKey",
    "PlanUnit",
    "parse_arch",
    "route_env",
    "enumerate_plan",
    "own_kernels_for",
    "main",
]

CACHE_ROOT_ENV = "FASTVIDEO_CUTE_CACHE_DIR"
FA4_CACHE_ENABLED_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
FA4_CACHE_DIR_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
TRITON_CACHE_DIR_ENV = "TRITON_CACHE_DIR"
CUTE_DSL_CACHE_DIR_ENV = "CUTE_DSL_CACHE_DIR"

_DTYPES = ("bf16", "fp16", "fp32")
_MODES = ("train", "infer")
_ROUTE_ENV_VARS = ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND")


def library_version() -> str:
    from . import __version__

    return __version__


# ==============================================================================================
# Cache directories
# ==============================================================================================


@dataclasses.dataclass(frozen=True)
class CachePaths:
    """Where each JIT cache lives under one root."""

    root: Path
    fa4: Path  # FLASH_ATTENTION_CUTE_DSL_CACHE_DIR (FA4 adds its own source-fingerprint subdir)
    triton: Path  # TRITON_CACHE_DIR
    cute_dsl: Path  # CUTE_DSL_CACHE_DIR (only @cute.jit direct calls use it; see docs/warmup.md)
    own: Path  # our CuTe kernels' exported objects, keyed with the library version

    def components(self) -> Dict[str, Path]:
        return {"fa4": self.fa4, "triton": self.triton, "cute-dsl": self.cute_dsl, "fastvideo-cute": self.own}


def default_cache_root() -> Path:
    env = os.environ.get(CACHE_ROOT_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fastvideo-cute"


def cache_paths(root: Optional[os.PathLike] = None) -> CachePaths:
    root = Path(root).expanduser() if root is not None else default_cache_root()
    root = root.absolute()
    versioned = root / f"fastvideo-cute-{library_version()}"
    return CachePaths(root=root, fa4=root / "fa4", triton=root / "triton", cute_dsl=root / "cute-dsl",
                      own=versioned / "cute")


def cache_env(root: Optional[os.PathLike] = None) -> Dict[str, str]:
    """The environment variables that point every cache at ``root``."""
    p = cache_paths(root)
    return {
        CACHE_ROOT_ENV: str(p.root),
        FA4_CACHE_ENABLED_ENV: "1",
        FA4_CACHE_DIR_ENV: str(p.fa4),
        TRITON_CACHE_DIR_ENV: str(p.triton),
        CUTE_DSL_CACHE_DIR_ENV: str(p.cute_dsl),
    }


def _fa4_cache_problem(paths: CachePaths) -> Optional[str]:
    """FA4 freezes its cache settings when ``flash_attn.cute`` is imported; say so if it already
    was, with other settings (its caches can then not be redirected in this process)."""
    mod = sys.modules.get("flash_attn.cute.cache_utils")
    if mod is None:
        return None
    enabled = getattr(mod, "CUTE_DSL_CACHE_ENABLED", None)
    directory = getattr(mod, "CUTE_DSL_CACHE_DIR", None)
    if enabled is True and directory is not None and Path(directory).absolute() == paths.fa4:
        return None
    return (f"flash_attn.cute was imported before the cache was configured (its disk cache is "
            f"enabled={enabled}, dir={directory}); FA4 kernels of this process do not go to {paths.fa4}. "
            f"Set the variables of `fastvideo-cute-warmup --print-env` before importing flash_attn.")


def configure_cache(root: Optional[os.PathLike] = None, *, override: bool = True) -> CachePaths:
    """Point FA4, Triton and the CuTe DSL at ``root`` (through ``os.environ``) and create the dirs.

    ``override=False`` keeps any of the variables already set (the runtime hook's behaviour).
    Call it before anything imports ``flash_attn.cute``: FA4 reads its variables at import.
    """
    paths = cache_paths(root)
    for name, value in cache_env(paths.root).items():
        if override or not os.environ.get(name):
            os.environ[name] = value
    for d in paths.components().values():
        d.mkdir(parents=True, exist_ok=True)
    problem = _fa4_cache_problem(paths)
    if problem:
        warnings.warn(problem, RuntimeWarning, stacklevel=2)
    return paths


def configure_cache_from_env() -> Optional[CachePaths]:
    """Runtime hook for apps: if ``$FASTVIDEO_CUTE_CACHE_DIR`` is set, fill in the per-tool cache
    variables that are not set yet (never overriding one that is). Returns the paths or None."""
    if not os.environ.get(CACHE_ROOT_ENV, "").strip():
        return None
    return configure_cache(None, override=False)


def _scan(directory: Path) -> Dict[str, int]:
    """Relative path -> size of every cache file under ``directory`` (lock and temp files skipped)."""
    found: Dict[str, int] = {}
    if not directory.is_dir():
        return found
    for dirpath, _, files in os.walk(directory):
        for name in files:
            if name == "lock" or name.endswith(".lock") or ".tmp" in name:
                continue
            path = os.path.join(dirpath, name)
            try:
                found[os.path.relpath(path, directory)] = os.path.getsize(path)
            except OSError:
                pass
    return found


def _snapshot(paths: CachePaths) -> Dict[str, Dict[str, int]]:
    return {name: _scan(d) for name, d in paths.components().items()}


def _diff(before: Dict[str, Dict[str, int]], after: Dict[str, Dict[str, int]]) -> Dict[str, Tuple[int, int]]:
    """component -> (new files, new bytes)."""
    out = {}
    for name, files in after.items():
        old = before.get(name, {})
        new = [size for rel, size in files.items() if rel not in old]
        if new:
            out[name] = (len(new), sum(new))
    return out


def cache_sizes(paths: CachePaths) -> Dict[str, Dict[str, int]]:
    return {name: {"files": len(files), "bytes": sum(files.values())} for name, files in _snapshot(paths).items()}


# ==============================================================================================
# Our CuTe kernels: in-process + on-disk (AOT export) compile cache
# ==============================================================================================


def _dist_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def own_sources_fingerprint() -> str:
    """sha256 over every ``.py`` of ``fastvideo_cute.kernels.cute`` (paths and contents): editing
    any of our CuTe kernels (or the registry's static configs) changes it."""
    spec = importlib.util.find_spec("fastvideo_cute.kernels.cute")
    h = hashlib.sha256()
    for base in (spec.submodule_search_locations or []) if spec else []:
        root = Path(base)
        for src in sorted(root.rglob("*.py")):
            h.update(src.relative_to(root).as_posix().encode())
            data = src.read_bytes()
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
    return h.hexdigest()


_PRELOADED = False


def _preload_cute_runtime() -> None:
    """Load the CuTe DSL runtime libraries with RTLD_GLOBAL once, so exported objects loaded from
    disk resolve their symbols (what flash_attn.cute.cache_utils does for FA4's cache)."""
    global _PRELOADED
    if _PRELOADED:
        return
    import cutlass.cute as cute

    for lib in cute.runtime.find_runtime_libraries(enable_tvm_ffi=False):
        if Path(lib).exists():
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    _PRELOADED = True


class CuteKernelCache:
    """Compile cache for our own CuTe DSL kernels (compiled with ``--enable-tvm-ffi``).

    In process: a dict keyed on :meth:`key`. On disk: ``<dir>/<name>/<arch>-<key>.o``, written
    with ``JitCompiledFunction.export_to_c`` and read with ``cute.runtime.load_module`` (the same
    AOT path FA4's persistent cache uses), under ``<root>/fastvideo-cute-<version>/cute``.

    The key covers everything that changes the code: the kernel name, the target arch, the
    caller's static configuration (dtype, block sizes, head_dim, stages, static shapes...), the
    source fingerprint of ``fastvideo_cute.kernels.cute``, the library version, the CuTe DSL and
    tvm-ffi versions and the Python minor version. Shapes that are dynamic in the kernel (the
    fake tensors' ``sym_int`` dims) do not belong in it.
    """

    EXPORT_NAME = "func"
    _memory: Dict[str, Any] = {}  # shared by every instance: one compiled object per key per process
    stats: Dict[str, int] = {"memory": 0, "disk": 0, "compiled": 0}  # this process's lookups

    def __init__(self, directory: os.PathLike):
        self.directory = Path(directory)

    @staticmethod
    def key_fields(name: str, arch: str, static: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        return {
            "name": name,
            "arch": arch,
            "static": {str(k): repr(v) for k, v in sorted((static or {}).items())},
            "fastvideo-cute": library_version(),
            "sources": own_sources_fingerprint(),
            "nvidia-cutlass-dsl": _dist_version("nvidia-cutlass-dsl"),
            "apache-tvm-ffi": _dist_version("apache-tvm-ffi"),
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        }

    @classmethod
    def key(cls, name: str, arch: str, static: Optional[Mapping[str, Any]] = None) -> str:
        blob = json.dumps(cls.key_fields(name, arch, static), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    def path(self, name: str, arch: str, key: str) -> Path:
        return self.directory / name / f"{arch}-{key[:40]}.o"

    def get_or_compile(self, name: str, arch: str, compile_fn: Callable[[], Any],
                       static: Optional[Mapping[str, Any]] = None) -> Tuple[Any, str]:
        """``(callable, status)``; status is ``"memory"`` (this process had it), ``"disk"`` (loaded
        from the cache) or ``"compiled"`` (compiled now, and exported for the next process)."""
        key = self.key(name, arch, static)
        fn = self._memory.get(key)
        if fn is not None:
            self.stats["memory"] += 1
            return fn, "memory"
        path = self.path(name, arch, key)
        if path.is_file() and path.stat().st_size > 0:
            try:
                fn = self._load(path)
            except Exception as exc:  # noqa: BLE001 - a bad entry is a miss; recompile and replace it
                warnings.warn(f"unloadable CuTe kernel cache entry {path} ({type(exc).__name__}: {exc}); recompiling",
                              RuntimeWarning, stacklevel=2)
            else:
                self._memory[key] = fn
                self.stats["disk"] += 1
                return fn, "disk"
        compiled = compile_fn()
        self._memory[key] = compiled
        self.stats["compiled"] += 1
        self._export(compiled, path)
        return compiled, "compiled"

    def _load(self, path: Path):
        import cutlass.cute as cute

        _preload_cute_runtime()
        module = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
        return getattr(module, self.EXPORT_NAME)

    def _export(self, compiled, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            compiled.export_to_c(object_file_path=str(tmp), function_name=self.EXPORT_NAME)
            if tmp.stat().st_size == 0:
                raise OSError(f"empty object file {tmp}")
            os.replace(tmp, path)  # atomic: a reader never sees a partial entry
        except Exception as exc:  # noqa: BLE001 - the compiled kernel still serves this process
            tmp.unlink(missing_ok=True)
            warnings.warn(f"could not export CuTe kernel to {path} ({type(exc).__name__}: {exc})",
                          RuntimeWarning, stacklevel=3)


def cute_kernel_cache(root: Optional[os.PathLike] = None) -> CuteKernelCache:
    """The cache for our CuTe kernels under ``root`` (default: :func:`default_cache_root`)."""
    return CuteKernelCache(cache_paths(root).own)


def compile_registry_kernel(name: str, arch: str, cache: Optional[CuteKernelCache] = None) -> Tuple[Any, str]:
    """Compile (or load) the ``fastvideo_cute.kernels.cute.REGISTRY`` variant ``name`` for
    ``arch`` ("sm_90a", "sm_121a", ...) through the cache. Works without a GPU (fake tensors)."""
    from .kernels.cute import find

    spec = find(name)
    if arch not in spec.archs:
        raise ValueError(f"{name} does not target {arch} (targets {', '.join(spec.archs)})")
    cache = cache or cute_kernel_cache()

    def compile_fn():
        import cutlass.cute as cute

        fn, args = spec.build()
        return cute.compile(fn, *args, options=f"--enable-tvm-ffi --gpu-arch {arch}")

    return cache.get_or_compile(name, arch, compile_fn, static={"registry": name})


# ==============================================================================================
# Targets, workloads, variants
# ==============================================================================================


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
        from .tiling import variable_block_sizes

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


@contextlib.contextmanager
def route_env(route: str = "auto", backend: Optional[str] = None) -> Iterator[None]:
    """Set the route variables for the duration: ``auto`` leaves them as they are (what the app
    will see), ``triton`` / ``cute`` ask for that route, ``backend`` forces one named backend."""
    if backend:
        wanted: Dict[str, Optional[str]] = {"FASTVIDEO_VSA_TRITON": None, "FASTVIDEO_VSA_CUTEDSL": None,
                                            "FASTVIDEO_VSA_BACKEND": backend}
    elif route == "triton":
        wanted = {"FASTVIDEO_VSA_TRITON": "1", "FASTVIDEO_VSA_CUTEDSL": None, "FASTVIDEO_VSA_BACKEND": None}
    elif route == "cute":
        wanted = {"FASTVIDEO_VSA_TRITON": None, "FASTVIDEO_VSA_CUTEDSL": "1", "FASTVIDEO_VSA_BACKEND": None}
    elif route == "auto":
        wanted = {}
    else:
        raise ValueError(f"route must be auto, triton or cute, got {route!r}")
    saved = {name: os.environ.get(name) for name in wanted}
    try:
        for name, value in wanted.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _int_class(n: int) -> str:
    """How Triton 3.x specializes an int argument: ``1`` is a constant, multiples of 16 carry a
    divisibility hint, and values past int32 are i64 (tests cross-check it against Triton)."""
    if n == 1:
        return "1"
    width = "i64" if not -(2 ** 31) <= n < 2 ** 31 else "i32"
    return f"{width}/16" if n % 16 == 0 else width


def _triton_detail(w: Workload, direction: str) -> Tuple[Tuple[str, str], ...]:
    from .backends.triton_backend import PHYSICAL_TILES

    q_tile, kv_tile = PHYSICAL_TILES[w.block_size]
    try:
        from .kernels.triton._common import default_config

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
    from .adapters.fa4 import _sm90_bwd_tile_m, fa4_bwd_plan, fa4_fwd_plan

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
        variant = sm120_variant()
        detail = (("kernel", SM120_REGISTRY_NAMES.get(variant, variant)), ("tile", "128x128"),
                  ("target", cute_arch_str(target.arch)))
    else:  # a backend this module does not know the compile facts of: key on the call's statics
        detail = (("layout", w.layout),)
    # sm120 runs 256-token blocks as 2x2 128-token tiles: one compiled kernel for both block sizes.
    block = 128 if route == "sm120" else w.block_size
    return VariantKey(route, direction, arch_str(target.arch) if target.device_type == "cuda" else "cpu",
                      w.dtype, w.head_dim, block, detail)


#: sm120 adapter variant -> its registry name (``fastvideo_cute.kernels.cute.REGISTRY``)
SM120_REGISTRY_NAMES = {"simple": "block_sparse_fwd128_sm120", "ws": "block_sparse_fwd128_sm120_ws"}


def sm120_variant() -> str:
    """The sm120 adapter's kernel variant for this environment (``$FASTVIDEO_CUTE_SM120_KERNEL``)."""
    try:
        from .adapters.cute_sm120 import default_variant

        return default_variant()
    except Exception:  # noqa: BLE001 - an adapter without variants: its one kernel
        return "simple"


def synthetic_call_info(w: Workload, target: Target, need_grad: bool):
    """The ``CallInfo`` the op would build for this workload on the target (no tensors)."""
    from .routes import CallInfo

    fields = {f.name for f in dataclasses.fields(CallInfo)}
    extra = {"batch": w.batch, "heads": w.heads, "q_len": w.seq_len, "kv_len": w.seq_len,
             "bshd": w.layout == "bshd",
             # newer CallInfo fields, passed when this version of the router has them:
             "need_lse": w.entry == "bsa",  # video_sparse_attn discards the sparse branch's LSE
             "kv_all_full": w.all_full}
    return CallInfo("block_sparse", target.device_type, target.arch if target.device_type == "cuda" else None,
                    torch_dtype(w.dtype), w.head_dim, w.block_size, need_grad,
                    **{k: v for k, v in extra.items() if k in fields})


def enumerate_plan(workloads: Sequence[Workload], target: Target, modes: Sequence[str] = _MODES,
                   route: str = "auto", backend: Optional[str] = None) -> List[PlanUnit]:
    """Which route serves each (workload, mode) on ``target``, and the variant keys it compiles.

    Uses :func:`fastvideo_cute.routes.select_route` itself (the routes' support predicates and
    the environment variables, set by ``route``/``backend`` as :func:`route_env` does), so the
    plan is the decision the op will make. In ``train`` the backward runs on the forward's route
    (``ops._setup_context`` selects once with ``need_grad=True``)."""
    from . import ops  # noqa: F401 - registers the backends' routes
    from .routes import _ROUTES, RouteError, _cute_preferences, env_flag, select_route

    units: List[PlanUnit] = []
    with route_env(route, backend), _quiet_route_log():
        for w in workloads:
            for mode in modes:
                need_grad = mode == "train"
                info = synthetic_call_info(w, target, need_grad)
                try:
                    chosen = select_route(info).name
                except RouteError as exc:
                    units.append(PlanUnit(w, mode, None, error=str(exc)))
                    continue
                unit = PlanUnit(w, mode, chosen)
                if env_flag("FASTVIDEO_VSA_CUTEDSL") and chosen == "triton":
                    reasons = [f"{name}: {_ROUTES[name].support(info)[1]}" for name in _cute_preferences(info)
                               if name in _ROUTES]
                    unit.note = "CuTe falls back: " + ("; ".join(reasons) or "no CuTe backend is registered")
                for direction in unit.directions:
                    unit.keys[direction] = variant_key(chosen, w, direction, target)
                units.append(unit)
    return units


@contextlib.contextmanager
def _quiet_route_log() -> Iterator[None]:
    """The plan carries the fallback reasons; keep the route logger's WARNINGs off the console."""
    import logging

    log = logging.getLogger("fastvideo_cute")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def own_kernels_for(target: Target, policy: str = "auto", route: str = "auto",
                    names: Optional[Sequence[str]] = None) -> List[Tuple[str, str]]:
    """Our registry kernels to compile for the target: ``[(registry name, --gpu-arch)]``.

    ``names``: exactly these registry kernels. ``all``: every registry kernel that targets the
    arch. ``none``: nothing. ``auto``: the sm120 adapter's variant (``$FASTVIDEO_CUTE_SM120_KERNEL``,
    default ``simple``) when the CuTe route is asked for (``--route cute`` or
    ``FASTVIDEO_VSA_CUTEDSL=1``) on a GPU FA4 does not serve (sm_120/sm_121: there the mma.sync
    kernel is the CuTe route; its sm_90a build is a verification target, not the H200's route)."""
    if target.arch is None or (policy == "none" and not names):
        return []
    from .kernels.cute import REGISTRY
    from .routes import env_flag

    arch = cute_arch_str(target.arch)
    targeted = [spec.name for spec in REGISTRY if arch in spec.archs]
    if names:
        unknown = [n for n in names if n not in {spec.name for spec in REGISTRY}]
        if unknown:
            raise ValueError(f"no CuTe kernel named {unknown}; known: {[spec.name for spec in REGISTRY]}")
        return [(n, arch) for n in names if n in targeted]
    if policy == "all":
        return [(n, arch) for n in targeted]
    if policy != "auto":
        raise ValueError(f"cute-kernels policy must be auto, all or none, got {policy!r}")
    wants_cute = route == "cute" or (route == "auto" and env_flag("FASTVIDEO_VSA_CUTEDSL"))
    if not wants_cute or target.arch[0] in (9, 10):
        return []
    wanted = SM120_REGISTRY_NAMES.get(sm120_variant())
    return [(n, arch) for n in targeted if n == wanted]


# ==============================================================================================
# Workloads from the command line
# ==============================================================================================


def preset_workloads(name: str, blocks: Optional[Sequence[int]], dtypes: Optional[Sequence[str]], layout: str,
                     batch: int, sparsity: Optional[float], entries: Sequence[str] = ("vsa",)) -> List[Workload]:
    p = get_preset(name)
    out = []
    for block in blocks or (p.block_size,):
        tile = tile_for_block(block)
        seq = p.seq_len(block)
        kvb = seq // block
        sp = p.sparsity if sparsity is None else sparsity
        topk = max(1, math.ceil((1.0 - sp) * kvb))
        for dtype in dtypes or (p.dtype,):
            for entry in entries:
                out.append(Workload(p.name, batch, p.heads, seq, p.head_dim, block, dtype, layout, p.latent_grid,
                                    tile, topk, entry))
    return out


def shape_workloads(shape: Sequence[int], blocks: Optional[Sequence[int]], dtypes: Optional[Sequence[str]],
                    layout: str, sparsity: Optional[float], entries: Sequence[str] = ("vsa",)) -> List[Workload]:
    b, h, s, d = (int(x) for x in shape)
    if min(b, h, s, d) < 1:
        raise ValueError(f"--shape B H S D must be positive, got {tuple(shape)}")
    out = []
    for block in blocks or (64,):
        if s % block:
            raise ValueError(f"--shape: S={s} is not a multiple of block size {block}")
        kvb = s // block
        topk = max(1, math.ceil((1.0 - (0.5 if sparsity is None else sparsity)) * kvb))
        for dtype in dtypes or ("bf16",):
            for entry in entries:
                out.append(Workload(f"shape-{b}x{h}x{s}x{d}", b, h, s, d, block, dtype, layout, None, None, topk,
                                    entry))
    return out


# ==============================================================================================
# Running: first call vs steady state, cache evidence
# ==============================================================================================


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _entry_call(w: Workload, q, k, v, block_map, sizes) -> Callable[[], Any]:
    """The public call a model makes for this workload; returns ``out``."""
    from . import api

    suffix = "_bshd" if w.layout == "bshd" else ""
    if w.entry == "vsa":
        fn = getattr(api, "video_sparse_attn" + suffix)
        block = w.tile if w.tile is not None else w.block_size
        return lambda: fn(q, k, v, sizes, sizes, min(w.topk, w.num_blocks), block_size=block)
    base = {64: "block_sparse_attn", 128: "block_sparse_attn_128", 256: "block_sparse_attn_256"}[w.block_size]
    fn = getattr(api, base + suffix)
    return lambda: fn(q, k, v, block_map, sizes)[0]


def _triton_jit_count() -> Optional[int]:
    """Compiled Triton kernels held in this process (None under the interpreter / unknown)."""
    total, seen = 0, False
    for modname in ("fastvideo_cute.kernels.triton.block_sparse_fwd", "fastvideo_cute.kernels.triton.block_sparse_bwd"):
        mod = sys.modules.get(modname)
        if mod is None:
            continue
        for obj in vars(mod).values():
            caches = getattr(obj, "device_caches", None)
            if isinstance(caches, dict):
                seen = True
                try:
                    total += sum(len(entry[0]) for entry in caches.values())
                except Exception:  # noqa: BLE001 - Triton internals moved: no count
                    return None
    return total if seen else None


def _fa4_cache_state() -> Optional[Tuple[int, bool]]:
    """(compiled FA4 kernels held in this process, whether FA4's disk cache is on), or None if FA4
    was not imported."""
    iface = sys.modules.get("flash_attn.cute.interface")
    utils = sys.modules.get("flash_attn.cute.cache_utils")
    if iface is None or utils is None:
        return None
    total = 0
    for obj in vars(iface).values():
        cache = getattr(obj, "compile_cache", None)
        inner = getattr(cache, "cache", None)
        if isinstance(inner, dict):
            total += len(inner)
    return total, bool(getattr(utils, "CUTE_DSL_CACHE_ENABLED", False))


def _own_state() -> Dict[str, int]:
    """Our CuTe kernels compiled in this process: :class:`CuteKernelCache` statuses, and the sm120
    adapter's own ``lru_cache`` (which does not go through the disk cache yet)."""
    state = dict(CuteKernelCache.stats)
    adapter = sys.modules.get("fastvideo_cute.adapters.cute_sm120")
    info = getattr(getattr(adapter, "compiled_kernel", None), "cache_info", None)
    state["adapter_lru"] = info().currsize if callable(info) else 0
    return state


def _interpreting() -> bool:
    from .routes import env_flag

    return env_flag("TRITON_INTERPRET")


def classify(route: Optional[str], new: Dict[str, Tuple[int, int]], triton_delta: Optional[int],
             fa4_delta: Optional[int], fa4_disk: bool, on_cpu: bool,
             own_delta: Optional[Mapping[str, int]] = None) -> Tuple[str, str]:
    """(status, note) of one first call, from what it left behind.

    ``miss``: something was compiled (new cache files, or new in-memory kernels with no disk
    cache behind them). ``hit``: new kernels came up and no cache file was written: they were
    loaded from the disk cache. ``shared``: nothing new: an earlier row of this process already
    had the variant. ``n/a``: nothing is compiled (the Triton interpreter)."""
    files = sum(n for n, _ in new.values())
    if files:
        return "miss", "compiled: " + ", ".join(f"{k} +{n} files" for k, (n, _) in sorted(new.items()))
    if route == "triton":
        if on_cpu and _interpreting():
            return "n/a", "Triton interpreter: nothing compiled, nothing cached"
        if triton_delta is None:
            return "unknown", "no Triton kernel count (Triton internals)"
        if triton_delta > 0:
            return "hit", "loaded from the Triton cache"
        return "shared", "compiled earlier in this process"
    if route == "fa4":
        if fa4_delta is None:
            return "unknown", "FA4 not imported"
        if fa4_delta > 0 and not fa4_disk:
            return "miss", "FA4 disk cache disabled: compiled in memory only"
        if fa4_delta > 0:
            return "hit", "loaded from the FA4 cache"
        return "shared", "compiled earlier in this process"
    if route == "sm120":
        own = own_delta or {}
        if own.get("disk", 0) > 0:
            return "hit", "loaded from the fastvideo-cute cache"
        if own.get("compiled", 0) > 0:
            return "miss", "compiled (fastvideo-cute cache)"
        if own.get("adapter_lru", 0) > 0:
            return "miss", "compiled in memory: the sm120 adapter does not use the disk cache yet"
        return "shared", "compiled earlier in this process"
    return "unknown", f"route {route}: no cache evidence beyond files (none written)"


def prepare_process(units: Sequence[PlanUnit], device, own: bool = False) -> Dict[str, float]:
    """One-off per-process costs, timed apart from the variants: CUDA context, imports."""
    import torch

    times: Dict[str, float] = {}
    if device.type == "cuda" and units:
        t0 = time.perf_counter()
        torch.cuda.init()
        torch.empty(1, device=device)
        _sync(device)
        times["cuda_init_s"] = time.perf_counter() - t0
    routes = {u.route for u in units if u.route}
    if "triton" in routes:
        t0 = time.perf_counter()
        importlib.import_module("fastvideo_cute.kernels.triton.block_sparse_fwd")
        importlib.import_module("fastvideo_cute.kernels.triton.block_sparse_bwd")
        if device.type == "cuda":
            try:  # Triton's driver utilities (compiled into / loaded from the Triton cache once per process)
                from triton.runtime import driver

                driver.active.get_current_device()
            except Exception:  # noqa: BLE001 - the first kernel call will do it instead
                pass
        times["import_triton_kernels_s"] = time.perf_counter() - t0
    if "fa4" in routes:
        t0 = time.perf_counter()
        from .adapters.fa4 import load_fa4

        load_fa4()
        times["import_fa4_s"] = time.perf_counter() - t0
    if own:
        t0 = time.perf_counter()
        importlib.import_module("cutlass.cute")
        times["import_cute_dsl_s"] = time.perf_counter() - t0
    return times


def _make_inputs(w: Workload, device, need_grad: bool):
    import torch

    from .api import topk_block_map
    from .tiling import variable_block_sizes

    # Generated on the device: a 720p preset's q/k/v are ~10^8 elements each.
    gen = torch.Generator(device=device).manual_seed(0)
    dtype = torch_dtype(w.dtype)

    def rand():
        return torch.randn(w.shape(), generator=gen, device=device, dtype=dtype)

    q, k, v = rand(), rand(), rand()
    if need_grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    n = w.num_blocks
    scores = torch.rand((w.batch, w.heads, n, n), generator=gen, device=device)
    block_map = topk_block_map(scores, min(w.topk, n))
    if w.grid is not None:
        sizes = variable_block_sizes(w.grid, w.tile, device=device)
    else:
        sizes = torch.full((n,), w.block_size, dtype=torch.int32, device=device)
    return q, k, v, block_map, sizes


def execute_unit(unit: PlanUnit, device, paths: CachePaths, iters: int, seen: set,
                 backend: Optional[str], route: str) -> List[Dict[str, Any]]:
    """Run one unit's first call (timed, with cache evidence per direction) and ``iters`` more
    (the steady state). Returns one result row per direction."""
    import torch

    w = unit.workload
    need_grad = unit.mode == "train"
    rows: List[Dict[str, Any]] = []
    on_cpu = device.type == "cpu"

    def first(direction: str, call: Callable[[], Any]):
        before = _snapshot(paths)
        tri0, fa0, own0 = _triton_jit_count(), _fa4_cache_state(), _own_state()
        _sync(device)
        t0 = time.perf_counter()
        result = call()
        _sync(device)
        secs = time.perf_counter() - t0
        new = _diff(before, _snapshot(paths))
        tri1, fa1, own1 = _triton_jit_count(), _fa4_cache_state(), _own_state()
        tri_delta = None if tri1 is None else tri1 - (tri0 or 0)
        fa_delta = None if fa1 is None else fa1[0] - (fa0[0] if fa0 else 0)
        own_delta = {k: own1[k] - own0[k] for k in own1}
        status, note = classify(unit.route, new, tri_delta, fa_delta, bool(fa1 and fa1[1]), on_cpu, own_delta)
        key = unit.keys[direction]
        rows.append({
            "id": unit.row_id(direction), "workload": w.name, "mode": unit.mode, "direction": direction,
            "route": unit.route, "variant": key.label, "key": key.digest(), "first_s": secs,
            "cache": status, "note": note, "new_files": sum(n for n, _ in new.values()),
            "new_bytes": sum(b for _, b in new.values()), "repeat_of_key": key.digest() in seen,
            "shape": list(w.shape()), "topk": w.topk,
        })
        seen.add(key.digest())
        return result

    with route_env(route, backend):
        q, k, v, block_map, sizes = _make_inputs(w, device, need_grad)
        call = _entry_call(w, q, k, v, block_map, sizes)
        grad_ctx = contextlib.nullcontext() if need_grad else torch.no_grad()
        with grad_ctx:
            out = first("fwd", call)
        dout = torch.randn_like(out) if need_grad else None
        if need_grad:
            first("bwd", lambda: torch.autograd.backward(out, dout))
        fwd_t, bwd_t = [], []
        for _ in range(max(1, iters)):
            for t in (q, k, v):
                t.grad = None
            with grad_ctx:
                _sync(device)
                t0 = time.perf_counter()
                out = call()
                _sync(device)
                fwd_t.append(time.perf_counter() - t0)
            if need_grad:
                t0 = time.perf_counter()
                torch.autograd.backward(out, dout)
                _sync(device)
                bwd_t.append(time.perf_counter() - t0)
    steady = {"fwd": min(fwd_t), "bwd": min(bwd_t) if bwd_t else None}
    for row in rows:
        row["steady_s"] = steady[row["direction"]]
        row["overhead_s"] = row["first_s"] - row["steady_s"]
    return rows


def execute_own(names: Sequence[Tuple[str, str]], paths: CachePaths) -> List[Dict[str, Any]]:
    """Compile (or load) our registry kernels into the AOT cache (no launch: works without a GPU)."""
    cache = CuteKernelCache(paths.own)
    rows = []
    for name, arch in names:
        before = _snapshot(paths)
        t0 = time.perf_counter()
        try:
            _, how = compile_registry_kernel(name, arch, cache)
            err = None
        except Exception as exc:  # noqa: BLE001 - one failed kernel is a failed row, not a crash
            how, err = "error", f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        secs = time.perf_counter() - t0
        new = _diff(before, _snapshot(paths))
        status = {"disk": "hit", "memory": "shared", "compiled": "miss", "error": "error"}[how]
        rows.append({
            "id": f"cute-own/{name}/{arch}", "workload": name, "mode": "compile", "direction": "fwd",
            "route": "cute-own", "variant": f"cute-own {name} {arch}", "key": CuteKernelCache.key(name, arch,
                                                                                               {"registry": name})[:12],
            "first_s": secs, "steady_s": None, "overhead_s": None, "cache": status,
            "note": err or {"hit": "loaded from the fastvideo-cute cache",
                            "miss": "compiled and exported (not launched)",
                            "shared": "compiled earlier in this process"}[status],
            "new_files": sum(n for n, _ in new.values()), "new_bytes": sum(b for _, b in new.values()),
            "repeat_of_key": False,
        })
    return rows


# ==============================================================================================
# Output
# ==============================================================================================


class Progress:
    """A progress bar on stderr (one line per step when stderr is not a terminal)."""

    def __init__(self, total: int, enabled: bool = True, width: int = 24):
        self.total, self.enabled, self.width, self.done = max(total, 1), enabled, width, 0
        self.tty = enabled and sys.stderr.isatty()

    def step(self, label: str) -> None:
        if not self.enabled:
            return
        filled = int(self.width * self.done / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        line = f"[{bar}] {self.done + 1}/{self.total} {label}"
        if self.tty:
            sys.stderr.write("\r\033[K" + line[:150])
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
        self.done += 1

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _fmt_bytes(n: Optional[int]) -> str:
    if not n:
        return "0"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _fmt_s(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3f}"


def format_plan(units: Sequence[PlanUnit], own: Sequence[Tuple[str, str]], target: Target) -> str:
    lines = [f"plan for {target.label}:", f"{'workload':<44} {'mode':<6} {'dir':<4} {'route':<8} variant"]
    for u in units:
        if u.error:
            lines.append(f"{u.workload.name:<44} {u.mode:<6} {'-':<4} {'ERROR':<8} {u.error}")
            continue
        for d in u.directions:
            key = u.keys[d]
            lines.append(f"{u.workload.name:<44} {u.mode:<6} {d:<4} {u.route:<8} {key.label} [{key.digest()}]")
        if u.note:
            lines.append(f"{'':<44} {'':<6} {'':<4} {'':<8} ({u.note})")
    for name, arch in own:
        lines.append(f"{name:<44} {'-':<6} {'fwd':<4} {'cute-own':<8} registry kernel for {arch}")
    distinct = {k.digest() for u in units for k in u.keys.values()}
    lines.append(f"{len(distinct)} distinct route variants over {sum(len(u.keys) for u in units)} calls"
                 + (f", {len(own)} own CuTe kernels" if own else ""))
    return "\n".join(lines)


def format_table(rows: Sequence[Dict[str, Any]]) -> str:
    head = (f"{'#':>3}  {'variant':<46} {'workload':<36} {'mode':<6} {'first s':>8} {'steady s':>9} "
            f"{'compile s':>9}  {'cache':<7} {'bytes':>9}")
    lines = [head, "-" * len(head)]
    for i, r in enumerate(rows, 1):
        compile_s = r.get("overhead_s") if r.get("cache") == "miss" else None
        if r.get("route") == "cute-own" and r.get("cache") == "miss":
            compile_s = r.get("first_s")
        lines.append(f"{i:>3}  {str(r.get('variant'))[:46]:<46} {str(r.get('workload'))[:36]:<36} "
                     f"{str(r.get('mode')):<6} {_fmt_s(r.get('first_s')):>8} {_fmt_s(r.get('steady_s')):>9} "
                     f"{_fmt_s(compile_s):>9}  {str(r.get('cache')):<7} {_fmt_bytes(r.get('new_bytes')):>9}")
    return "\n".join(lines)


def format_sizes(sizes: Mapping[str, Mapping[str, int]], paths: CachePaths) -> str:
    parts = [f"{name} {_fmt_bytes(v['bytes'])} ({v['files']} files)" for name, v in sizes.items()]
    total = sum(v["bytes"] for v in sizes.values())
    return f"cache {paths.root}: " + ", ".join(parts) + f"; total {_fmt_bytes(total)}"


def _environment() -> Dict[str, Any]:
    env: Dict[str, Any] = {"python": sys.version.split()[0], "fastvideo-cute": library_version()}
    for dist in ("torch", "triton", "nvidia-cutlass-dsl", "flash-attn-4", "quack-kernels", "apache-tvm-ffi"):
        env[dist] = _dist_version(dist)
    try:
        import torch

        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name()
            env["capability"] = list(torch.cuda.get_device_capability())
    except Exception:  # noqa: BLE001
        pass
    env["TRITON_INTERPRET"] = os.environ.get("TRITON_INTERPRET")
    for name in _ROUTE_ENV_VARS:
        env[name] = os.environ.get(name)
    return env


# ==============================================================================================
# CLI
# ==============================================================================================


def _int_list(text: str) -> List[int]:
    if text.strip().lower() == "all":
        return [64, 128, 256]
    out = [int(x) for x in text.replace(",", " ").split()]
    for b in out:
        if b not in (64, 128, 256):
            raise argparse.ArgumentTypeError(f"block size must be 64, 128 or 256 (or all), got {b}")
    return out


def _dtype_list(text: str) -> List[str]:
    out = [x.strip().lower() for x in text.replace(",", " ").split()]
    for d in out:
        if d not in _DTYPES:
            raise argparse.ArgumentTypeError(f"dtype must be one of {_DTYPES}, got {d!r}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fastvideo-cute-warmup",
        description="Compile every fastvideo-cute kernel variant a model uses into a persistent cache.",
        epilog="Presets: " + "; ".join(f"{n} ({PRESETS[n].description})" for n in PRESETS),
    )
    what = p.add_argument_group("what to warm up")
    what.add_argument("--preset", action="append", default=[], metavar="NAME",
                      help="model preset (repeatable): " + ", ".join(PRESETS))
    what.add_argument("--shape", action="append", nargs=4, type=int, default=[], metavar=("B", "H", "S", "D"),
                      help="explicit q/k/v shape (repeatable); every kv block full")
    what.add_argument("--block", type=_int_list, action="append", metavar="64,128,256|all",
                      help="logical block sizes (default: the preset's tile, 64 for --shape)")
    what.add_argument("--dtype", type=_dtype_list, action="append", metavar="bf16,fp16,fp32",
                      help="dtypes (default: the preset's, bf16 for --shape)")
    what.add_argument("--layout", choices=("bhsd", "bshd"), default="bhsd")
    what.add_argument("--entry", choices=("vsa", "bsa", "both"), default="vsa",
                      help="vsa: video_sparse_attn, what a VSA model calls (its sparse branch discards the LSE); "
                           "bsa: block_sparse_attn_* (returns the LSE). Routes may differ (default vsa)")
    what.add_argument("--mode", choices=("train", "infer", "both"), default="both",
                      help="train: forward + backward with grad; infer: forward without (default both)")
    what.add_argument("--batch", type=int, default=1, help="batch size for presets (default 1)")
    what.add_argument("--sparsity", type=float, default=None,
                      help="fraction of kv blocks dropped (default: the preset's 0.9; 0.5 for --shape)")
    where = p.add_argument_group("route and target")
    where.add_argument("--route", choices=("auto", "triton", "cute"), default="auto",
                       help="auto: the route variables of this environment, as the app will see them")
    where.add_argument("--backend", default=None, help="force one named backend (FASTVIDEO_VSA_BACKEND)")
    where.add_argument("--arch", default=None,
                       help="plan for this GPU arch (sm_90, sm_100, sm_120, sm_121a...); without that GPU "
                            "here the routes are planned only and our CuTe kernels are cross-compiled")
    where.add_argument("--cute-kernels", choices=("auto", "all", "none"), default="auto",
                       help="our registry CuTe kernels to compile for the arch (default auto: the sm120 "
                            "adapter's variant, when the CuTe route is asked for on sm_120/sm_121)")
    where.add_argument("--cute-kernel", action="append", default=None, metavar="NAME",
                       help="exactly these registry CuTe kernels (repeatable; overrides --cute-kernels)")
    out = p.add_argument_group("cache and output")
    out.add_argument("--cache-dir", default=None,
                     help=f"cache root (default ${CACHE_ROOT_ENV}, else ~/.cache/fastvideo-cute)")
    out.add_argument("--list", action="store_true", help="print the plan (route per variant) and exit")
    out.add_argument("--list-presets", action="store_true", help="print the presets and their shapes and exit")
    out.add_argument("--print-env", choices=("shell", "docker"), default=None,
                     help="print the cache variables for the app's environment and exit")
    out.add_argument("--check", action="store_true",
                     help="after warming up, prove in a fresh process that every variant loads from the cache")
    out.add_argument("--verify-only", action="store_true",
                     help="run every variant and fail if one had to compile (what --check runs)")
    out.add_argument("--allow-miss", action="store_true", help="with --verify-only: report misses, do not fail")
    out.add_argument("--max-overhead", type=float, default=None, metavar="S",
                     help="with --verify-only: also fail a variant whose first call is more than S seconds "
                          "over its steady state")
    out.add_argument("--iters", type=int, default=3, help="steady-state repetitions (default 3)")
    out.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON")
    out.add_argument("--no-progress", action="store_true")
    return p


def _flatten(groups: Optional[List[List[Any]]]) -> Optional[List[Any]]:
    if not groups:
        return None
    out: List[Any] = []
    for g in groups:
        for x in g:
            if x not in out:
                out.append(x)
    return out


def resolve_target(arch_arg: Optional[str]) -> Target:
    import torch

    if torch.cuda.is_available():
        here = tuple(torch.cuda.get_device_capability())
        if arch_arg is None:
            return Target("cuda", here, True)
        want = parse_arch(arch_arg)
        return Target("cuda", want, want == here)
    if arch_arg is not None:
        return Target("cuda", parse_arch(arch_arg), False)
    return Target("cpu", None, True)


def build_workloads(args, target: Target) -> List[Workload]:
    blocks, dtypes = _flatten(args.block), _flatten(args.dtype)
    entries = ("vsa", "bsa") if args.entry == "both" else (args.entry,)
    workloads: List[Workload] = []
    for name in args.preset:
        workloads += preset_workloads(name, blocks, dtypes, args.layout, args.batch, args.sparsity, entries)
    for shape in args.shape:
        workloads += shape_workloads(shape, blocks, dtypes, args.layout, args.sparsity, entries)
    return workloads


def _child_argv(argv: Sequence[str]) -> List[str]:
    """The arguments of this run minus --check / --json / --no-progress (the check adds its own)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--check", "--no-progress", "--verify-only", "--allow-miss"):
            continue
        if a == "--json":
            skip = True
            continue
        if a.startswith("--json="):
            continue
        out.append(a)
    return out


def run_check(argv: Sequence[str], paths: CachePaths, timeout: Optional[float] = None) -> Tuple[int, Dict[str, Any]]:
    """``python -m fastvideo_cute.warmup --verify-only`` in a fresh process, same arguments and cache."""
    with tempfile.TemporaryDirectory(prefix="fvc_warmup_check_") as tmp:
        report = os.path.join(tmp, "verify.json")
        cmd = [sys.executable, "-m", "fastvideo_cute.warmup", *_child_argv(argv), "--verify-only",
               "--no-progress", "--json", report]
        env = dict(os.environ)
        env.update(cache_env(paths.root))
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        data: Dict[str, Any] = {}
        if os.path.exists(report):
            with open(report) as f:
                data = json.load(f)
        data["returncode"] = proc.returncode
        data["stdout"] = proc.stdout
        data["stderr"] = proc.stderr[-4000:]
        return proc.returncode, data


def verify_failures(rows: Sequence[Dict[str, Any]], allow_miss: bool, max_overhead: Optional[float]) -> List[str]:
    bad = []
    for r in rows:
        if r.get("cache") in ("error",) or r.get("error"):
            bad.append(f"{r['id']}: error {r.get('note') or r.get('error')}")
        elif r.get("cache") == "miss" and not allow_miss:
            bad.append(f"{r['id']}: not in the cache ({r.get('note')})")
        elif (max_overhead is not None and r.get("overhead_s") is not None and r.get("cache") != "n/a"
              and r["overhead_s"] > max_overhead):
            bad.append(f"{r['id']}: first call {r['overhead_s']:.3f} s over steady state (> {max_overhead} s)")
    return bad


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)

    if args.list_presets:
        for p in PRESETS.values():
            t, h, w = p.latent_grid
            per_block = ", ".join(f"b{b}: S={p.seq_len(b)} ({p.num_blocks(b)} blocks, topk {p.topk(b)})"
                                  for b in (64, 128, 256))
            print(f"{p.name:<20} {p.description}; heads {p.heads} x {p.head_dim}; latent ({t}, {h}, {w}) = "
                  f"{p.tokens} tokens; {per_block}")
        return 0

    paths = configure_cache(args.cache_dir)  # before anything imports FA4 or Triton's cache
    if args.print_env:
        for name, value in cache_env(paths.root).items():
            print(f"ENV {name}={value}" if args.print_env == "docker" else f"export {name}={value}")
        return 0

    target = resolve_target(args.arch)
    if target.device_type == "cpu" and not _interpreting():
        os.environ["TRITON_INTERPRET"] = "1"  # before any Triton kernel module is imported
        print("no CUDA GPU: running the Triton route under the interpreter (TRITON_INTERPRET=1)", file=sys.stderr)
    try:
        workloads = build_workloads(args, target)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        own = own_kernels_for(target, args.cute_kernels, args.route, args.cute_kernel)
    except ValueError as exc:
        parser.error(str(exc))
    if not workloads and not own:
        parser.error("nothing to warm up: give --preset and/or --shape (or --cute-kernels all with --arch)")
    if target.device_type == "cpu" and args.preset and not args.list:
        parser.error("presets are GPU-sized: on a CPU box use --shape (tiny shapes, interpreter) or --list")
    modes = _MODES if args.mode == "both" else (args.mode,)
    units = enumerate_plan(workloads, target, modes, args.route, args.backend)

    if args.list:
        print(format_plan(units, own, target))
        return 0

    import torch

    device = torch.device("cuda" if target.device_type == "cuda" and target.runnable else "cpu")
    runnable = [u for u in units if u.route and target.runnable]
    rows: List[Dict[str, Any]] = []
    for u in units:
        if u.error:
            rows.append({"id": f"{u.workload.name}/{u.mode}", "workload": u.workload.name, "mode": u.mode,
                         "route": None, "variant": "-", "cache": "error", "error": u.error, "note": u.error})
    if units and not target.runnable:
        print(format_plan(units, own, target))
        print(f"no {target.label} GPU in this process: the routes above are planned, not compiled"
              + ("; compiling our CuTe kernels (cross-compile)" if own else ""), file=sys.stderr)
    setup = prepare_process(runnable, device, own=bool(own)) if (runnable or own) else {}
    progress = Progress(len(runnable) + len(own), enabled=not args.no_progress)
    seen: set = set()
    for u in runnable:
        progress.step(f"{u.workload.name} {u.mode} ({u.route})")
        try:
            rows += execute_unit(u, device, paths, args.iters, seen, args.backend, args.route)
        except Exception as exc:  # noqa: BLE001 - a failed variant is a failed row
            msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            rows.append({"id": f"{u.workload.name}/{u.mode}", "workload": u.workload.name, "mode": u.mode,
                         "route": u.route, "variant": u.keys["fwd"].label, "cache": "error", "error": msg,
                         "note": msg})
    if own:
        for name, arch in own:
            progress.step(f"{name} {arch} (cute-own)")
            rows += execute_own([(name, arch)], paths)
    progress.close()

    sizes = cache_sizes(paths)
    title = "verify (fresh process)" if args.verify_only else "warm-up"
    print(f"fastvideo-cute {title} on {target.label}, route={args.backend or args.route}"
          + ("; process setup (not in the rows): " + ", ".join(f"{k}={v:.2f}" for k, v in setup.items())
             if setup else ""))
    print(format_table(rows))
    print(format_sizes(sizes, paths))
    if any(r.get("cache") == "n/a" for r in rows):
        print("n/a: the Triton interpreter compiles nothing, so it writes no Triton cache files; "
              "run on a GPU to fill the Triton cache")

    status = 0
    report: Dict[str, Any] = {
        "kind": "verify" if args.verify_only else "warmup", "argv": argv, "target": dataclasses.asdict(target),
        "cache_root": str(paths.root), "cache_env": cache_env(paths.root), "cache_sizes": sizes,
        "setup_s": setup, "rows": rows, "environment": _environment(),
    }
    if args.verify_only:
        failures = verify_failures(rows, args.allow_miss, args.max_overhead)
        report["failures"] = failures
        for f in failures:
            print("FAIL", f)
        status = 1 if failures else 0
    elif any(r.get("cache") == "error" for r in rows):
        status = 1
    if args.check and not args.verify_only:
        rc, child = run_check(argv, paths)
        report["check"] = {k: v for k, v in child.items() if k != "stdout"}
        child_rows = {r["id"]: r for r in child.get("rows", [])}
        print("\n--check: a fresh process ran every variant again with the same cache")
        sys.stdout.write(child.get("stdout", ""))
        counts: Dict[str, int] = {}
        for r in child_rows.values():
            counts[r.get("cache")] = counts.get(r.get("cache"), 0) + 1
        verdict = "PASS" if rc == 0 else "FAIL"
        if rc == 0 and counts and set(counts) <= {"n/a", "shared"}:
            verdict = "PASS (nothing cacheable ran: the Triton interpreter compiles nothing)"
        print("check summary: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items(), key=lambda kv: str(kv[0])))
              + f"; {verdict}")
        if rc != 0:
            if not child_rows:
                print(child.get("stderr", ""), file=sys.stderr)
            status = 1
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2, default=str)
    return status


if __name__ == "__main__":
    sys.exit(main())
