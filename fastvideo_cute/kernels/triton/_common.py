"""Shared helpers for the Triton block-sparse attention kernels: launch configs and checks.

Config override (``config=`` of the launch helpers) is a dict. Per-kernel sections:

    {
        "fwd":      {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
        "bwd_pre":  {"BLOCK_M": 128, "num_warps": 4},
        "bwd_dq":   {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2},
        "bwd_dkdv": {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2},
        "fp32_precision": "ieee",   # tl.dot input_precision for fp32 inputs ("ieee" | "tf32")
    }

Any key may be left out (defaults fill it in). For the forward helper the "fwd" keys may also
be given flat (``{"BLOCK_M": 64, "num_warps": 4}``). Meaning of the tile sizes:

- fwd / bwd_dq: one program per ``BLOCK_M`` query rows (must divide ``q_block``); the kv list
  is walked in ``BLOCK_N`` key tiles (must divide ``kv_block``).
- bwd_dkdv: one program per ``BLOCK_N`` key rows (must divide ``kv_block``); the q list is
  walked in ``BLOCK_M`` query tiles (must divide ``q_block``).

All tile sizes are powers of two >= 16.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

_SECTIONS = ("fwd", "bwd_pre", "bwd_dq", "bwd_dkdv")
_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")


def _is_16bit(dtype: torch.dtype) -> bool:
    return dtype in (torch.float16, torch.bfloat16)


def default_config(head_dim: int, dtype: torch.dtype, q_block: int, kv_block: int) -> Dict[str, Any]:
    """Default launch config by (head_dim, dtype, q_block, kv_block).

    Tuned on H200 (sm_90, Triton 3.6) for bf16/fp16; fp32 gets small tiles that fit the
    shared memory / registers (fp32 is a correctness path, not a speed path).
    """
    if _is_16bit(dtype) and head_dim >= 128:
        # Measured on H200 (Triton 3.6), bf16, B=1 H=12 S=32768 D=128, 12.5% density, BSHD views.
        if q_block >= 128 and kv_block >= 128:
            # fwd 412 TF/s; dq 2.21 ms, dkdv 3.15 ms -> bwd 378 TF/s (S=65536: 428 / 379)
            fwd = dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2)
            dq = dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2)
        else:
            # q_block or kv_block 64: fwd 384 TF/s, bwd 332-370 TF/s
            fwd = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
            dq = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
        if kv_block >= 128:
            dkdv = dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3)
        else:
            dkdv = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
    elif _is_16bit(dtype):
        # D <= 64 (measured at D=64, H=24, S=32768): 128/128 fwd 356 TF/s, bwd ~300 TF/s;
        # 64/64 fwd 331 TF/s.
        if q_block >= 128 and kv_block >= 128:
            fwd = dict(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=3)
            dq = dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2)
        else:
            fwd = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
            dq = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
        dkdv = dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2)
    else:
        fwd = dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
        dq = dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
        dkdv = dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2)
    # q tiles never cross a q block; key tiles never cross a kv block.
    for c in (fwd, dq, dkdv):
        c["BLOCK_M"] = min(c["BLOCK_M"], q_block)
        c["BLOCK_N"] = min(c["BLOCK_N"], kv_block)
    pre = dict(BLOCK_M=min(128, q_block), num_warps=4)
    return {"fwd": fwd, "bwd_pre": pre, "bwd_dq": dq, "bwd_dkdv": dkdv, "fp32_precision": "ieee"}


def resolve_config(
    config: Optional[Dict[str, Any]],
    head_dim: int,
    dtype: torch.dtype,
    q_block: int,
    kv_block: int,
    flat_section: Optional[str] = None,
) -> Dict[str, Any]:
    """Defaults overlaid with ``config``; validates tile sizes against the block sizes."""
    cfg = default_config(head_dim, dtype, q_block, kv_block)
    if config:
        unknown = set(config) - set(_SECTIONS) - set(_KEYS) - {"fp32_precision"}
        if unknown:
            raise ValueError(f"unknown config keys {sorted(unknown)}")
        for sec in _SECTIONS:
            if sec in config and config[sec]:
                bad = set(config[sec]) - set(_KEYS)
                if bad:
                    raise ValueError(f"unknown keys {sorted(bad)} in config[{sec!r}]")
                cfg[sec] = {**cfg[sec], **config[sec]}
        if flat_section is not None:
            flat = {k: config[k] for k in _KEYS if k in config}
            if flat:
                cfg[flat_section] = {**cfg[flat_section], **flat}
        if "fp32_precision" in config:
            cfg["fp32_precision"] = config["fp32_precision"]
    if cfg["fp32_precision"] not in ("ieee", "tf32"):
        raise ValueError("fp32_precision must be 'ieee' or 'tf32'")
    for sec in ("fwd", "bwd_dq", "bwd_dkdv"):
        bm, bn = cfg[sec]["BLOCK_M"], cfg[sec]["BLOCK_N"]
        _check_tile(bm, q_block, f"{sec}.BLOCK_M", "q_block")
        _check_tile(bn, kv_block, f"{sec}.BLOCK_N", "kv_block")
    _check_tile(cfg["bwd_pre"]["BLOCK_M"], q_block, "bwd_pre.BLOCK_M", "q_block")
    return cfg


def _check_tile(tile: int, block: int, name: str, block_name: str) -> None:
    if tile < 16 or tile & (tile - 1) or block % tile:
        raise ValueError(f"{name}={tile} must be a power of two >= 16 dividing {block_name}={block}")


def input_precision(dtype: torch.dtype, cfg: Dict[str, Any]) -> str:
    """``tl.dot`` input_precision: fp16/bf16 ignore it; fp32 uses ``cfg['fp32_precision']``."""
    if dtype == torch.float32:
        return cfg["fp32_precision"]
    return "tf32"  # Triton's default; ignored for 16-bit operands


def check_last_stride(*tensors: torch.Tensor) -> None:
    for t in tensors:
        assert t.stride(-1) == 1, "last dim must have stride 1"


def check_meta(idx: torch.Tensor, num: torch.Tensor, b: int, h: int, rows: int) -> None:
    assert idx.dtype == torch.int32 and num.dtype == torch.int32, "index lists must be int32"
    assert idx.is_contiguous() and num.is_contiguous(), "index lists must be contiguous"
    assert idx.dim() == 4 and tuple(idx.shape[:3]) == (b, h, rows), f"idx shape {tuple(idx.shape)}"
    assert tuple(num.shape) == (b, h, rows), f"num shape {tuple(num.shape)}"

