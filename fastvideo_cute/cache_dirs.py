"""Cache roots: where FA4's, Triton's, the CuTe DSL's and our own CuTe kernels' compile caches live
under one root, and the environment variables that point each tool there.

    root = $FASTVIDEO_CUTE_CACHE_DIR (else ~/.cache/fastvideo-cute, or $XDG_CACHE_HOME/fastvideo-cute)
      fa4/                              FLASH_ATTENTION_CUTE_DSL_CACHE_DIR (+ _ENABLED=1)
      triton/                           TRITON_CACHE_DIR
      cute-dsl/                         CUTE_DSL_CACHE_DIR
      fastvideo-cute-<version>/cute/    our CuTe kernels (fastvideo_cute.jit)

A leaf: it imports only the standard library and ``_version``, so ``import fastvideo_cute`` can
call :func:`configure_cache_from_env` without loading the warm-up CLI or any kernel. The tool
variables take effect only if set before the tool reads them (FA4: when ``flash_attn.cute`` is
imported; Triton and the CuTe DSL: at first compile).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from pathlib import Path
from typing import Dict, Optional

from . import _version

__all__ = [
    "CACHE_ROOT_ENV",
    "FA4_CACHE_ENABLED_ENV",
    "FA4_CACHE_DIR_ENV",
    "TRITON_CACHE_DIR_ENV",
    "CUTE_DSL_CACHE_DIR_ENV",
    "CachePaths",
    "library_version",
    "cache_root_configured",
    "default_cache_root",
    "cache_paths",
    "cache_env",
    "configure_cache",
    "configure_cache_from_env",
]

CACHE_ROOT_ENV = "FASTVIDEO_CUTE_CACHE_DIR"
FA4_CACHE_ENABLED_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
FA4_CACHE_DIR_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
TRITON_CACHE_DIR_ENV = "TRITON_CACHE_DIR"
CUTE_DSL_CACHE_DIR_ENV = "CUTE_DSL_CACHE_DIR"


def library_version() -> str:
    """``fastvideo_cute.__version__`` (read at call time, from the leaf that defines it)."""
    return _version.__version__


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


def cache_root_configured() -> bool:
    """Whether ``$FASTVIDEO_CUTE_CACHE_DIR`` names a cache root (our kernels then use the disk cache)."""
    return bool(os.environ.get(CACHE_ROOT_ENV, "").strip())


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
    if not cache_root_configured():
        return None
    return configure_cache(None, override=False)
