"""FastVideo's route variables, mapped onto ours for the duration of one compat call.

FastVideo's ``fastvideo_kernel`` 0.3.5 reads (on every call):

- ``FASTVIDEO_VSA_TRITON=1`` or the legacy ``FASTVIDEO_KERNEL_VSA_FORCE_TRITON=1``: Triton,
  winning over every other variable;
- ``FASTVIDEO_VSA_CUTEDSL=1``: its CuTe (FA4) path for 128/256-token blocks;
- ``FASTVIDEO_VSA_TK=1``: its sm_90 ThunderKittens kernel for 64-token blocks;
- ``FASTVIDEO_VSA_SM100A=1``: its sm_100a forward.

``FASTVIDEO_VSA_TRITON`` and ``FASTVIDEO_VSA_CUTEDSL`` are also this library's own names, read
by the op itself. What this module adds, per call:

- a force-Triton variable (either spelling) -> ``FASTVIDEO_VSA_TRITON=1`` with
  ``FASTVIDEO_VSA_CUTEDSL`` hidden (Triton wins, as in FastVideo; our own API raises on both);
- ``FASTVIDEO_VSA_TK`` (no force-Triton, no ``FASTVIDEO_VSA_BACKEND``) ->
  ``FASTVIDEO_VSA_CUTEDSL=1``: our fastest route for the call, which falls back to Triton
  (logging why, once) where no CuTe backend serves;
- ``FASTVIDEO_VSA_SM100A`` -> nothing (our sm_100 kernels are reachable only by
  ``FASTVIDEO_VSA_BACKEND=sm100``).

Values count as set when truthy (``1``/``true``/``yes``/``on``), our rule, a superset of
FastVideo's ``== "1"``.

Mechanism and limits: in eager mode, when (and only when) a translation is needed, the call
runs with ``os.environ`` patched under a process-wide lock and restored afterwards. The
backward takes the route its forward took (the op records it), so the patch need not outlive
the call. While ``torch.compile`` traces nothing is patched: compiled code sees only our own
spellings, which the op reads when it executes. Code running our API directly in another
thread during a patched compat call sees the patched variables.
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Dict, Optional

import torch

from ...routes import env_flag

__all__ = ["call_with_fastvideo_env", "overrides"]

_LOCK = threading.RLock()


def overrides() -> Dict[str, Optional[str]]:
    """Our variables to set (``None``: to hide) for FastVideo's current settings; ``{}`` if none."""
    want: Dict[str, Optional[str]] = {}
    if env_flag("FASTVIDEO_VSA_TRITON") or env_flag("FASTVIDEO_KERNEL_VSA_FORCE_TRITON"):
        want = {"FASTVIDEO_VSA_TRITON": "1", "FASTVIDEO_VSA_CUTEDSL": None}
    elif env_flag("FASTVIDEO_VSA_TK") and not os.environ.get("FASTVIDEO_VSA_BACKEND", "").strip():
        want = {"FASTVIDEO_VSA_CUTEDSL": "1"}
    # Keep only what differs from the environment as it is.
    return {name: value for name, value in want.items() if os.environ.get(name) != value}


def call_with_fastvideo_env(fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` with FastVideo's route variables translated to ours (see above)."""
    if torch.compiler.is_compiling():
        return fn(*args, **kwargs)
    patch = overrides()
    if not patch:
        return fn(*args, **kwargs)
    with _LOCK:
        saved = {name: os.environ.get(name) for name in patch}
        try:
            for name, value in patch.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            return fn(*args, **kwargs)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
