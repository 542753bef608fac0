"""Importing the package is light (no CuTe DSL, FA4 or kernel modules) and honours the cache root."""

import json
import os
import subprocess
import sys

_TOOL_CACHE_VARS = ("TRITON_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "FASTVIDEO_CUTE_CACHE_DIR")


def _run(code, **extra_env):
    env = {k: v for k, v in os.environ.items() if k not in _TOOL_CACHE_VARS}
    env.update(extra_env)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_does_not_load_cute_fa4_or_kernels():
    mods = _run("import json, sys, fastvideo_cute; print(json.dumps(sorted(sys.modules)))")
    heavy = [m for m in mods if m.startswith(("cutlass", "flash_attn", "quack", "fastvideo_cute.kernels", "triton",
                                              "torch._dynamo", "cudnn", "fastvideo_cute.warmup"))]
    assert heavy == []


def test_cache_root_env_configures_the_tool_caches(tmp_path):
    got = _run("import json, os, fastvideo_cute; "
               "print(json.dumps({k: os.environ.get(k) for k in ('TRITON_CACHE_DIR', "
               "'FLASH_ATTENTION_CUTE_DSL_CACHE_DIR')}))", FASTVIDEO_CUTE_CACHE_DIR=str(tmp_path))
    for var, path in got.items():
        assert path and path.startswith(str(tmp_path)), (var, path)
