"""Compatibility layers for code written against other VSA packages.

``fastvideo_cute.compat.fastvideo_kernel`` is a drop-in for FastVideo's ``fastvideo_kernel``
(VSA part); :func:`install_as_fastvideo_kernel` makes ``import fastvideo_kernel`` resolve to it
process-wide. See docs/compat.md.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

__all__ = ["install_as_fastvideo_kernel"]

_OURS = "fastvideo_cute.compat.fastvideo_kernel"


def install_as_fastvideo_kernel(*, replace: bool = False) -> ModuleType:
    """Register the compat module as ``fastvideo_kernel`` (and its submodules as
    ``fastvideo_kernel.<sub>``) in ``sys.modules`` and return it.

    Call it before anything imports ``fastvideo_kernel``. If a different ``fastvideo_kernel``
    (FastVideo's own) is already imported, this raises ``RuntimeError`` unless ``replace=True``:
    modules that already hold its functions would keep calling them. Idempotent.
    """
    module = importlib.import_module(_OURS)
    present = sys.modules.get("fastvideo_kernel")
    if present is not None and present is not module and not replace:
        where = getattr(present, "__file__", present)
        raise RuntimeError(f"a different fastvideo_kernel is already imported ({where!r}); call "
                           f"install_as_fastvideo_kernel() before importing it, or pass replace=True")
    if replace:
        for name in [n for n in sys.modules if n.startswith("fastvideo_kernel.")]:
            if not getattr(sys.modules[name], "__name__", "").startswith(_OURS):
                del sys.modules[name]
    sys.modules["fastvideo_kernel"] = module
    for sub in module.SUBMODULES:
        sys.modules[f"fastvideo_kernel.{sub}"] = importlib.import_module(f"{_OURS}.{sub}")
    return module
