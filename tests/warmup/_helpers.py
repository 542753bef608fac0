"""Shared helpers of the warm-up tests."""

import importlib.util
import os
from pathlib import Path

import pytest

from fastvideo_cute import warmup
from fastvideo_cute.warmup import Workload

ROOT = Path(__file__).resolve().parents[2]
ROUTE_VARS = ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND")


def _fa4_ok():
    from fastvideo_cute.adapters.fa4 import fa4_version_problems

    return importlib.util.find_spec("flash_attn") is not None and not fa4_version_problems()


needs_fa4 = pytest.mark.skipif(not _fa4_ok(), reason="the FA4 route's predicate needs flash-attn-4 at its pins")


def env_for_child(tmp_path):
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    for name in ROUTE_VARS + ("FASTVIDEO_CUTE_CACHE_DIR", "TRITON_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"):
        env.pop(name, None)
    env.pop("CUTE_DSL_KEEP", None)  # no compiler dumps from a developer's environment
    env["CUTE_DSL_DUMP_DIR"] = str(tmp_path)
    env["HOME"] = str(tmp_path)  # nothing may land in the real ~/.cache
    return env


def plan_of(target, route, blocks=(64, 128, 256), dtype="bf16", head_dim=128, backend=None, gated=False):
    """The plan by (block, mode). ``gated=False``: video_sparse_attn calls without a gate, so the
    plan shows the routes alone (gated inference has a rule of its own, tested on its own)."""
    ws = [Workload("m", 1, 12, 4 * b, head_dim, b, dtype, gated=gated) for b in blocks]
    units = warmup.enumerate_plan(ws, target, ("train", "infer"), route, backend)
    return {(u.workload.block_size, u.mode): u for u in units}
