"""The static facts Triton specialises the block-sparse kernels on, for the warm-up's compile keys:
the launch config, the physical tile, and how each int argument is specialised."""

from __future__ import annotations

from typing import Tuple

from ..call import CallInfo

__all__ = ["triton_detail", "int_class"]


def int_class(n: int) -> str:
    """How Triton 3.x specializes an int argument: ``1`` is a constant, multiples of 16 carry a
    divisibility hint, and values past int32 are i64 (tests cross-check it against Triton)."""
    if n == 1:
        return "1"
    width = "i64" if not -(2 ** 31) <= n < 2 ** 31 else "i32"
    return f"{width}/16" if n % 16 == 0 else width


def triton_detail(call: CallInfo, direction: str, q_tile: int, kv_tile: int) -> Tuple[Tuple[str, str], ...]:
    try:
        from ..kernels.triton._common import default_config

        cfg = default_config(call.head_dim, call.dtype, q_tile, kv_tile)
        sections = ("fwd",) if direction == "fwd" else ("bwd_pre", "bwd_dq", "bwd_dkdv")
        cfg_txt = ";".join(f"{s}:" + ",".join(f"{k}={v}" for k, v in sorted(cfg[s].items())) for s in sections)
    except Exception as exc:  # noqa: BLE001 - the key stays usable without the kernel package
        cfg_txt = f"unknown ({type(exc).__name__})"
    h, s, d = call.heads, call.q_len, call.head_dim
    strides = (s * h * d, d, h * d) if call.bshd else (h * s * d, s * d, d)
    ints = {"H": h, "S": s, "Qb": s // q_tile, "KVb": call.kv_len // kv_tile, "sb": strides[0], "sh": strides[1],
            "sm": strides[2]}
    spec = ",".join(f"{k}:{int_class(v)}" for k, v in ints.items())
    return (("tile", f"{q_tile}x{kv_tile}"), ("config", cfg_txt), ("ints", spec))
