"""kernels/triton/sizes_backstop: the device-side backstop is compiled with its assert in.

The kernel only matters on a GPU (the interpreter ignores ``tl.device_assert``); what a CPU box
can prove is that the kernel is jitted with ``debug=True`` and that, so compiled for sm_90, its
PTX calls ``__assertfail`` with the message (a kernel compiled without debug drops the assert
silently, and the backstop would check nothing). The compile runs in a child process without
``TRITON_INTERPRET`` (see test_triton_compile_sm90.py). That a violated range really raises on
the device is tests/test_gpu_validation.py::test_write_through_data_trips_the_device_assert."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

_CHILD = r"""
import json, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fastvideo_cute.kernels.triton.sizes_backstop import _sizes_backstop_kernel as k
sig = {"Sizes": "*i32", "N": "i32", "LO": "i32", "HI": "i32", "MSG": "constexpr", "BLOCK": "constexpr"}
src = ASTSource(fn=k, signature=sig, constexprs={"MSG": "sizes-left-range", "BLOCK": 1024})
ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"debug": bool(k.debug)}).asm["ptx"]
as_bytes = ", ".join(str(b) for b in b"sizes-left-range")  # PTX spells strings as .b8 arrays
print(json.dumps({"debug": k.debug, "assertfail": "__assertfail" in ptx, "message": as_bytes in ptx}))
"""


def test_backstop_compiles_with_its_assert_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"debug": True, "assertfail": True, "message": True}, got
