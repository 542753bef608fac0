"""Cache roots, the environment that points FA4 / Triton / the CuTe DSL at them, cache-dir
snapshots (what a first call wrote), and :class:`CuteKernelCache`, the in-process + on-disk
(AOT export) compile cache of our own CuTe kernels."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Tuple


CACHE_ROOT_ENV = "FASTVIDEO_CUTE_CACHE_DIR"
FA4_CACHE_ENABLED_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
FA4_CACHE_DIR_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
TRITON_CACHE_DIR_ENV = "TRITON_CACHE_DIR"
CUTE_DSL_CACHE_DIR_ENV = "CUTE_DSL_CACHE_DIR"


def library_version() -> str:
    from .. import __version__

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
    from ..kernels.cute import find

    spec = find(name)
    if arch not in spec.archs:
        raise ValueError(f"{name} does not target {arch} (targets {', '.join(spec.archs)})")
    cache = cache or cute_kernel_cache()

    def compile_fn():
        import cutlass.cute as cute

        fn, args = spec.build()
        return cute.compile(fn, *args, options=f"--enable-tvm-ffi --gpu-arch {arch}")

    return cache.get_or_compile(name, arch, compile_fn, static={"registry": name})
