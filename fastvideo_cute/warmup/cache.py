"""The warm-up's view of the caches: snapshots of the cache directories (what a first call
wrote), their sizes, and :func:`compile_registry_kernel` (a registry kernel through the one
compile path, :mod:`fastvideo_cute.jit`).

The cache roots and their environment live in :mod:`fastvideo_cute.cache_dirs`, our kernels'
compile cache in :mod:`fastvideo_cute.jit`; their names are re-exported here (and from
``fastvideo_cute.warmup``) as before.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from ..cache_dirs import (CACHE_ROOT_ENV, CUTE_DSL_CACHE_DIR_ENV, FA4_CACHE_DIR_ENV,  # noqa: F401 (re-exported)
                          FA4_CACHE_ENABLED_ENV, TRITON_CACHE_DIR_ENV, CachePaths, _fa4_cache_problem, cache_env,
                          cache_paths, configure_cache, configure_cache_from_env, default_cache_root, library_version)
from ..jit import (CuteKernelCache, _dist_version, _preload_cute_runtime, compile_kernel,  # noqa: F401 (re-exported)
                   cute_kernel_cache, own_sources_fingerprint)


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


def registry_kernel(name: str, arch: str):
    """The configured kernel object of the ``fastvideo_cute.kernels.cute.REGISTRY`` entry ``name``,
    checked to target ``arch``."""
    from ..kernels.cute import find

    spec = find(name)
    if arch not in spec.archs:
        raise ValueError(f"{name} does not target {arch} (targets {', '.join(spec.archs)})")
    return spec.make()


def compile_registry_kernel(name: str, arch: str, cache: Optional[CuteKernelCache] = None) -> Tuple[Any, str]:
    """Compile (or load) the registry kernel ``name`` for ``arch`` ("sm_90a", "sm_121a", ...)
    through ``cache`` (default: the one under :func:`default_cache_root`); ``(callable, how)``,
    how = "memory" | "disk" | "compiled". Works without a GPU (fake tensors)."""
    return compile_kernel(registry_kernel(name, arch), arch, cache or cute_kernel_cache())
