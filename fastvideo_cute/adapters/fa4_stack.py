"""FA4 (flash-attn-4, CuTe DSL) stack: exact pins, the version check, and the lazy import.

A mismatched CuTe DSL stack imports fine and then breaks when a kernel JIT-compiles, so the
route checks the installed versions against the pins before it imports FA4 (:func:`load_fa4`,
once), and its errors carry the fix and the symptoms a mismatch shows.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import types
import warnings
from typing import Optional, Tuple

__all__ = ["FA4_PINS", "FA4_JIT_SYMPTOMS", "load_fa4", "fa4_version_problems", "fa4_arch"]


#: Exact pins: a mismatched CuTe DSL stack imports fine and then breaks when a kernel JIT-compiles.
FA4_PINS = {
    "flash-attn-4": "4.0.0b36",
    "nvidia-cutlass-dsl": "4.8.1",
    "quack-kernels": "0.6.5",
}

#: Symptoms that a mismatched stack shows at JIT time (first CuTe call), with their cause.
FA4_JIT_SYMPTOMS = (
    ("TypeError: fmax() missing 1 required positional argument: 'b'",
     "nvidia-cutlass-dsl 4.5.x: a CuTe DSL older than the one flash-attn-4 was written against"),
    ("AttributeError: module 'cutlass.cute.core' has no attribute 'ThrMma'",
     "quack-kernels too old for the installed CuTe DSL / flash-attn-4"),
    ("ImportError: cannot import name 'alloc_reserved_mbarrier'",
     "quack-kernels too new for the installed flash-attn-4"),
)

_ALLOW_MISMATCH_ENV = "FASTVIDEO_CUTE_FA4_ALLOW_VERSION_MISMATCH"

_INSTALL_HINT = (
    "pip install 'fastvideo-cute[cute]' (CUDA 13 wheels: 'fastvideo-cute[cu13]'), i.e. exactly "
    "pip install 'flash-attn-4==4.0.0b36' 'nvidia-cutlass-dsl==4.8.1' 'quack-kernels==0.6.5'"
)


def _symptom_table() -> str:
    rows = [f"  {symptom}\n      -> {cause}" for symptom, cause in FA4_JIT_SYMPTOMS]
    return "Errors a mismatched stack raises on the first CuTe call, and their causes:\n" + "\n".join(rows)


def _installed_versions() -> dict:
    found = {}
    for name in FA4_PINS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def fa4_version_problems() -> list:
    """``["name: installed X, pinned Y", ...]`` for every package off its pin (empty if none)."""
    problems = []
    for name, have in _installed_versions().items():
        want = FA4_PINS[name]
        if have is None:
            problems.append(f"{name}: not installed, pinned {want}")
        elif have != want:
            problems.append(f"{name}: installed {have}, pinned {want}")
    return problems


def _import_error_message(problems: list, cause: Optional[BaseException]) -> str:
    lines = ["The FA4 (CuTe DSL) route of fastvideo-cute needs its 'cute' extra, exactly: "
             + ", ".join(f"{n}=={v}" for n, v in FA4_PINS.items()) + "."]
    if problems:
        lines.append("Mismatched: " + "; ".join(problems) + ".")
    if cause is not None:
        lines.append(f"Import failed: {type(cause).__name__}: {cause}")
    lines.append(f"Fix: {_INSTALL_HINT}.")
    lines.append("Without it, unset FASTVIDEO_VSA_CUTEDSL (or set FASTVIDEO_VSA_TRITON=1): the Triton route "
                 "serves every call.")
    lines.append(_symptom_table())
    lines.append(f"(Set {_ALLOW_MISMATCH_ENV}=1 to try a mismatched stack anyway.)")
    return "\n".join(lines)


@functools.lru_cache(maxsize=1)
def load_fa4() -> types.SimpleNamespace:
    """Import FA4 lazily, once. Raises :class:`ImportError` with the fix when it cannot.

    Returns a namespace with ``fwd`` (``_flash_attn_fwd``), ``bwd`` (``_flash_attn_bwd``),
    ``flash_attn_func``, ``BlockSparseTensorsTorch``, ``interface`` (the module), ``arch()``
    (FA4's own arch, as the int it uses: 90, 100, ...), ``mask_mod(kv_tile)`` (the cached
    mask_mod factory) and ``versions``.
    """
    problems = fa4_version_problems()
    if problems and os.environ.get(_ALLOW_MISMATCH_ENV, "") != "1":
        raise ImportError(_import_error_message(problems, None))
    if problems:
        warnings.warn("FA4 stack off its pins (" + "; ".join(problems) + "); " + _symptom_table(),
                      RuntimeWarning, stacklevel=2)
    try:
        interface = importlib.import_module("flash_attn.cute.interface")
        block_sparsity = importlib.import_module("flash_attn.cute.block_sparsity")
        masks = importlib.import_module("fastvideo_cute.adapters.fa4_masks")
    except ImportError as exc:
        raise ImportError(_import_error_message(problems, exc)) from exc
    return types.SimpleNamespace(
        interface=interface,
        fwd=interface._flash_attn_fwd,
        bwd=interface._flash_attn_bwd,
        flash_attn_func=interface.flash_attn_func,
        BlockSparseTensorsTorch=block_sparsity.BlockSparseTensorsTorch,
        arch=interface._get_device_arch,
        mask_mod=masks.kv_valid_len_mask,
        versions=_installed_versions(),
    )


def fa4_arch() -> Tuple[int, int]:
    """The arch FA4 itself will pick kernels for (honours ``FLASH_ATTENTION_ARCH``)."""
    arch = int(load_fa4().arch())
    return arch // 10, arch % 10
