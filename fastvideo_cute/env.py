"""Environment variables the library reads, parsed strictly (a leaf module: stdlib only).

Route variables are read on every eager call (and once, when the graph is traced, under
``torch.compile``). A boolean flag is true for ``1/true/yes/on`` and false for ``0/false/no/off``
or empty/unset (case-insensitive, surrounding blanks ignored); any other value raises
:class:`EnvError` naming the variable, instead of silently reading as unset.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

from .errors import EnvError

__all__ = ["EnvError", "env_flag", "env_str", "TRITON_FLAG", "CUTE_FLAG", "BACKEND_VAR", "ROUTE_VARS",
           "route_request"]

TRITON_FLAG = "FASTVIDEO_VSA_TRITON"
CUTE_FLAG = "FASTVIDEO_VSA_CUTEDSL"
BACKEND_VAR = "FASTVIDEO_VSA_BACKEND"
ROUTE_VARS = (TRITON_FLAG, CUTE_FLAG, BACKEND_VAR)

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def env_str(name: str) -> str:
    """The variable's value, stripped and lower-cased ('' when unset)."""
    return os.environ.get(name, "").strip().lower()


def env_flag(name: str) -> bool:
    value = env_str(name)
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise EnvError(f"{name}={os.environ.get(name)!r}: expected one of 1/true/yes/on or 0/false/no/off (or unset)")


def route_request() -> Tuple[bool, bool, Optional[str]]:
    """``(triton forced, CuTe asked for, backend named or None)`` from the route variables.

    Conflicting requests raise :class:`EnvError`: ``FASTVIDEO_VSA_TRITON`` with
    ``FASTVIDEO_VSA_CUTEDSL``, or either flag with a ``FASTVIDEO_VSA_BACKEND`` naming another
    backend (``FASTVIDEO_VSA_TRITON=1`` with ``FASTVIDEO_VSA_BACKEND=triton`` agrees and is allowed).
    """
    triton, cute, named = env_flag(TRITON_FLAG), env_flag(CUTE_FLAG), env_str(BACKEND_VAR) or None
    if triton and cute:
        raise EnvError(f"{TRITON_FLAG}=1 and {CUTE_FLAG}=1 are both set; set one of them")
    if named is not None and triton and named != "triton":
        raise EnvError(f"{TRITON_FLAG}=1 and {BACKEND_VAR}={named} ask for different backends; set one of them")
    if named is not None and cute and named == "triton":
        raise EnvError(f"{CUTE_FLAG}=1 and {BACKEND_VAR}=triton ask for different routes; set one of them")
    return triton, cute, named
