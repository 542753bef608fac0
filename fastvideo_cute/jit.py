"""The one compile path of our own CuTe DSL kernels: the :class:`CuteKernel` base and its compile
cache, in process and on disk, under one key.

    kernel = BlockSparseFwd128Sm120("w4r3")      # configuration only: nothing is traced yet
    fn = kernel.compile("sm_90a")                # fake tensors: no GPU needed
    fn, how = compile_kernel(kernel, "sm_90a")   # how: "memory" | "disk" | "compiled"

Dataflow of :func:`compile_kernel`:

1. ``key = CuteKernelCache.key(kernel.name, arch, kernel.config())``: sha256 over the kernel's
   name, the ``--gpu-arch``, its static configuration, the library version, the source
   fingerprint (every ``.py`` of ``fastvideo_cute.kernels.cute`` and this file), the
   nvidia-cutlass-dsl and apache-tvm-ffi versions and the Python minor version;
2. in process: one compiled object per key (shared by every :class:`CuteKernelCache`);
3. on disk, when the cache has a directory (``$FASTVIDEO_CUTE_CACHE_DIR`` names a root, or the
   warm-up passes one): ``<dir>/<name>/<arch>-<key[:40]>.o``, written with ``export_to_c`` and
   read with ``cute.runtime.load_module`` (the AOT path FA4's persistent cache uses), under
   ``<root>/fastvideo-cute-<version>/cute``;
4. otherwise the CuTe DSL compiles ``kernel`` on ``kernel.fake_args()`` with ``--enable-tvm-ffi
   --gpu-arch <arch>`` (:func:`_cute_compile`: the package's only call of the DSL's compile), then
   the object is exported to 3.

Compiler output (cubin, PTX...) goes to ``$CUTE_DSL_DUMP_DIR`` when that is set, else to a private
temporary directory removed after the compile: never into the working directory.
``need_cubin=True`` (compile_check, the compile tests) returns an object whose
``artifacts.CUBIN`` holds the cubin's bytes (compiled now unless this process already has one).

Limits: the key holds only what ``config()`` returns, so a kernel must put there everything it
bakes into the code (the fake tensors' ``sym_int`` dims are dynamic and stay out). A subclass must
not define ``__repr__``/``__str__``: the DSL names the device function after ``str(self)`` (module
path and class name), so those are part of the cubin's bytes. Imports neither torch nor the CuTe
DSL at module level (kernel modules subclass :class:`CuteKernel`, adapters import this module).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, ClassVar, Dict, Iterable, Iterator, Mapping, Optional, Tuple

from . import cache_dirs

__all__ = [
    "CuteKernel",
    "CuteKernelCache",
    "compile_kernel",
    "current_cache",
    "cute_kernel_cache",
    "cubin_of",
    "own_sources_fingerprint",
    "sources_fingerprint",
    "fake_matrix",
    "fake_vector",
    "fake_stream",
]

COMPILE_OPTIONS = "--enable-tvm-ffi"


class CuteKernel:
    """Base of our CuTe DSL kernels (quack style).

    ``__init__`` stores the static configuration only (no tracing, no tensors); :meth:`config`
    returns it, and it is what the compile cache keys on besides ``name`` and the arch.
    :meth:`fake_args` returns the ``__call__`` arguments as fake tensors and a fake stream (the
    TVM-FFI environment's stream: the caller's current torch stream), so :meth:`compile` works
    without a GPU. A subclass sets ``name`` and defines ``__call__`` (``@cute.jit``), its
    ``@cute.kernel`` and these two methods.
    """

    name: ClassVar[str] = ""

    def config(self) -> Mapping[str, Any]:
        """The static configuration baked into the code (part of the cache key)."""
        raise NotImplementedError(f"{type(self).__name__}.config")

    def fake_args(self) -> tuple:
        """Fake (tensor-free) arguments of ``__call__``, the fake stream last."""
        raise NotImplementedError(f"{type(self).__name__}.fake_args")

    def cache_key(self, arch: str) -> str:
        return CuteKernelCache.key(self.name, arch, self.config())

    def compile(self, arch: str):
        """The kernel compiled (TVM-FFI) for ``arch`` ("sm_90a", "sm_100a", "sm_121a", ...),
        through the cache; called with torch tensors in ``__call__``'s order, without the stream."""
        return compile_kernel(self, arch)[0]


# ==============================================================================================
# The key
# ==============================================================================================


def _dist_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def sources_fingerprint(roots: Iterable[os.PathLike], files: Iterable[os.PathLike] = ()) -> str:
    """sha256 over every ``.py`` under ``roots`` (relative paths and contents) and ``files``."""
    h = hashlib.sha256()

    def add(label: str, path: Path) -> None:
        data = path.read_bytes()
        h.update(label.encode())
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)

    for base in roots:
        root = Path(base)
        for src in sorted(root.rglob("*.py")):
            add(src.relative_to(root).as_posix(), src)
    for f in files:
        add(Path(f).name, Path(f))
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def own_sources_fingerprint() -> str:
    """:func:`sources_fingerprint` of ``fastvideo_cute.kernels.cute`` and this module: editing any
    of our CuTe kernels, their shared pieces or the compile options changes it."""
    spec = importlib.util.find_spec("fastvideo_cute.kernels.cute")
    roots = list(spec.submodule_search_locations or []) if spec else []
    return sources_fingerprint(roots, [__file__])


def library_version() -> str:
    return cache_dirs.library_version()


def _canon(config: Optional[Mapping[str, Any]]) -> str:
    """``config`` as canonical JSON, values by ``repr`` (order-free)."""
    return json.dumps({str(k): repr(v) for k, v in sorted((config or {}).items())}, sort_keys=True)


def _fields(name: str, arch: str, config_json: str, version: str, sources: str) -> Dict[str, Any]:
    return {
        "name": name,
        "arch": arch,
        "config": json.loads(config_json),
        "fastvideo-cute": version,
        "sources": sources,
        "nvidia-cutlass-dsl": _dist_version("nvidia-cutlass-dsl"),
        "apache-tvm-ffi": _dist_version("apache-tvm-ffi"),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


@functools.lru_cache(maxsize=4096)
def _key(name: str, arch: str, config_json: str, version: str, sources: str) -> str:
    """Memoized: a launch looks its kernel up by key on every call."""
    blob = json.dumps(_fields(name, arch, config_json, version, sources), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


# ==============================================================================================
# The cache
# ==============================================================================================


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


def cubin_of(compiled) -> Optional[bytes]:
    """The cubin a compile kept (``need_cubin=True``), else None (e.g. loaded from disk)."""
    cubin = getattr(getattr(compiled, "artifacts", None), "CUBIN", None)
    return cubin if isinstance(cubin, (bytes, bytearray)) and cubin else None


@contextlib.contextmanager
def _dump_dir() -> Iterator[Optional[str]]:
    """Where the compiler writes its artifacts: ``$CUTE_DSL_DUMP_DIR`` if set (None: the DSL reads
    it), else a temporary directory that is removed afterwards (the DSL's own default is the
    working directory). The cubin is read into memory when the compiled object is built."""
    if os.environ.get("CUTE_DSL_DUMP_DIR", "").strip():
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="fvc_cute_") as tmp:
        yield tmp


def _cute_compile(kernel: CuteKernel, arch: str, need_cubin: bool):
    import shlex

    import cutlass.cute as cute

    with _dump_dir() as dump:
        options = [COMPILE_OPTIONS, f"--gpu-arch {arch}"]
        if dump is not None:
            options.append(f"--dump-dir {shlex.quote(dump)}")
        if need_cubin:
            options.append("--keep-cubin")
        return cute.compile(kernel, *kernel.fake_args(), options=" ".join(options))


class CuteKernelCache:
    """Compile cache of our CuTe kernels: in process always, on disk when ``directory`` is given.

    The in-process table is shared by every instance: one compiled object per key per process.
    ``stats`` counts this process's lookups by outcome (the warm-up reads it).
    """

    EXPORT_NAME = "func"
    _memory: Dict[str, Any] = {}
    stats: Dict[str, int] = {"memory": 0, "disk": 0, "compiled": 0}

    def __init__(self, directory: Optional[os.PathLike] = None):
        self.directory = Path(directory) if directory is not None else None

    @staticmethod
    def key(name: str, arch: str, config: Optional[Mapping[str, Any]] = None) -> str:
        """The one key (see the module docstring); ``config`` values are keyed by ``repr``."""
        return _key(name, arch, _canon(config), library_version(), own_sources_fingerprint())

    @staticmethod
    def key_fields(name: str, arch: str, config: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """What :meth:`key` hashes, for inspection."""
        return _fields(name, arch, _canon(config), library_version(), own_sources_fingerprint())

    def path(self, name: str, arch: str, key: str) -> Optional[Path]:
        if self.directory is None:
            return None
        return self.directory / name / f"{arch}-{key[:40]}.o"

    def get_or_compile(self, kernel: CuteKernel, arch: str, need_cubin: bool = False) -> Tuple[Any, str]:
        """``(callable, status)``; status is ``"memory"`` (this process had it), ``"disk"`` (loaded
        from the directory) or ``"compiled"`` (compiled now, and exported to the directory)."""
        key = kernel.cache_key(arch)
        fn = self._memory.get(key)
        if fn is not None and (not need_cubin or cubin_of(fn) is not None):
            self.stats["memory"] += 1
            return fn, "memory"
        path = self.path(kernel.name, arch, key)
        if not need_cubin and path is not None and path.is_file() and path.stat().st_size > 0:
            try:
                fn = self._load(path)
            except Exception as exc:  # noqa: BLE001 - a bad entry is a miss; recompile and replace it
                warnings.warn(f"unloadable CuTe kernel cache entry {path} ({type(exc).__name__}: {exc}); recompiling",
                              RuntimeWarning, stacklevel=3)
            else:
                self._memory[key] = fn
                self.stats["disk"] += 1
                return fn, "disk"
        compiled = _cute_compile(kernel, arch, need_cubin)
        self._memory[key] = compiled
        self.stats["compiled"] += 1
        if path is not None:
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
    """The cache under ``root`` (default: :func:`fastvideo_cute.cache_dirs.default_cache_root`)."""
    return CuteKernelCache(cache_dirs.cache_paths(root).own)


def current_cache() -> CuteKernelCache:
    """The cache calls use by default: on disk under ``$FASTVIDEO_CUTE_CACHE_DIR`` when it is set
    (read at each call), in process only otherwise."""
    return cute_kernel_cache() if cache_dirs.cache_root_configured() else CuteKernelCache(None)


def compile_kernel(kernel: CuteKernel, arch: str, cache: Optional[CuteKernelCache] = None,
                   need_cubin: bool = False) -> Tuple[Any, str]:
    """``(compiled, how)`` for ``kernel`` on ``arch`` through ``cache`` (default
    :func:`current_cache`); ``how`` is "memory", "disk" or "compiled"."""
    return (cache if cache is not None else current_cache()).get_or_compile(kernel, arch, need_cubin)


# ==============================================================================================
# Fake arguments (tensor-free compilation)
# ==============================================================================================


def fake_matrix(dtype, rows, cols, align: int):
    """A fake row-major ``[rows, cols]`` tensor (``rows``/``cols``: ints or ``cute.sym_int32()``)."""
    import cutlass.cute as cute

    return cute.runtime.make_fake_compact_tensor(dtype, (rows, cols), stride_order=(1, 0), assumed_align=align)


def fake_vector(dtype, n, align: int):
    """A fake 1-D tensor of ``n`` elements."""
    import cutlass.cute as cute

    return cute.runtime.make_fake_compact_tensor(dtype, (n,), assumed_align=align)


def fake_stream():
    """The fake stream: at call time, the TVM-FFI environment's (the current torch stream)."""
    import cutlass.cute as cute

    return cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
