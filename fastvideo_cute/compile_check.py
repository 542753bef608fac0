"""Cross-compile every CuTe DSL kernel of the library for an arch, without a GPU.

    python -m fastvideo_cute.compile_check --arch sm_121a [--arch sm_90a ...] [--kernel NAME] [--keep DIR]

For each variant in ``fastvideo_cute.kernels.cute.REGISTRY`` it prints one line: name, arch,
compile seconds, registers, spill (stack) bytes, and the counts of the key SASS instructions
(HMMA, HGMMA, UTCHMMA, UTMALDG, LDTM), then OK or FAIL with the reason. A variant that does not
target the arch prints ``skipped (not targeted)``. The exit status is 1 if a variant failed to
build or its SASS lacks an instruction it must use (or has one it must not), else 0.

Each kernel compiles through :func:`fastvideo_cute.jit.compile_kernel` (``need_cubin=True``: the
cubin is kept in memory; compiler output goes to ``$CUTE_DSL_DUMP_DIR`` or a temporary directory,
never the working directory). SASS comes from nvdisasm and the register/stack figures from
cuobjdump: the first found of ``$CUDA_HOME/bin``, the ``nvidia-cuda-nvdisasm`` wheel, triton's
bundled CUDA binaries and PATH. Importing this module sets no environment variable.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

__all__ = ["main", "check_kernel", "build_report", "KernelReport", "sass_counts", "find_tool", "inflight_operand_writes"]

_PREFIX = r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?"  # a SASS line's address and predicate
_OPCODE_RE = re.compile(_PREFIX + r"([A-Z][A-Z0-9_.]*)", re.M)
_RES_RE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


def find_tool(name: str) -> Optional[str]:
    """Path of a CUDA binary tool (nvdisasm, cuobjdump), or None."""
    candidates = []
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            candidates.append(os.path.join(os.environ[env], "bin", name))
    for base in sys.path:
        if base and os.path.isdir(base):
            candidates += glob.glob(os.path.join(base, "nvidia", "cu*", "bin", name))
            candidates += glob.glob(os.path.join(base, "nvidia", "cuda_nvdisasm", "bin", name))
            candidates.append(os.path.join(base, "triton", "backends", "nvidia", "bin", name))
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return shutil.which(name)


def sass_counts(sass: str) -> Dict[str, int]:
    """Opcode (with modifiers, e.g. ``HMMA.16816.F32.BF16``) -> count."""
    return collections.Counter(_OPCODE_RE.findall(sass))


def sass_is_for_arch(sass: str, arch: str) -> bool:
    """Whether disassembled SASS was built for ``arch`` ("sm_90a", "sm_100a", ...). Disassemblers
    differ: some print ``.target sm_90a``, others only the ELF header flags (``EF_CUDA_SM90``, and
    ``EF_CUDA_ACCELERATORS`` for an arch-specific "a" target)."""
    if f".target\t{arch}" in sass or f".target {arch}" in sass:
        return True
    digits = arch[len("sm_"):].rstrip("af")
    flags = re.findall(r"EF_CUDA_[A-Z_0-9]+", sass)
    return f"EF_CUDA_SM{digits}" in flags and (not arch.endswith("a") or "EF_CUDA_ACCELERATORS" in flags)


_RS_WGMMA = re.compile(r"HGMMA\.[\w.]+ R\d+, R(\d+), gdesc")
_DEST = re.compile(_PREFIX + r"([A-Z][A-Z0-9_.]*)\s+R(\d+)[,\s]")
_NO_REGISTER_DEST = ("ST", "RED", "HGMMA", "ISETP", "FSETP", "BRA", "VOTE")


def inflight_operand_writes(sass: str) -> List[str]:
    """sm_90a SASS lines that write a register of an RS wgmma's A operand while that wgmma may still
    run: after each partial wait (``WARPGROUP.DEPBAR.LE gsb0, n``, n > 0), the A registers of the
    register-operand HGMMAs issued since the wait before, and every write to them up to the next
    wait. PTX leaves those registers to the program until the wgmma's wait and ptxas does not keep
    other values off them (a forward build that computed the next P into fresh registers while
    P V ran had them placed there, and its output changed from run to run), so a kernel that
    computes beside an RS wgmma in flight must not be compiled into such writes. The A operand of a
    wgmma is four consecutive registers; a destination's width is read from ``.64`` / ``.128`` /
    ``.WIDE``."""
    lines = sass.splitlines()
    hits: List[str] = []
    for i, line in enumerate(lines):
        if not re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x[1-9]", line):
            continue
        operand = set()
        for back in range(i - 1, -1, -1):
            if "WARPGROUP.DEPBAR" in lines[back]:
                break
            m = _RS_WGMMA.search(lines[back])
            if m:
                operand.update(range(int(m.group(1)), int(m.group(1)) + 4))
        if not operand:
            continue
        for later in lines[i + 1:]:
            if "WARPGROUP.DEPBAR" in later or "EXIT" in later:
                break
            m = _DEST.match(later)
            if m and not m.group(1).startswith(_NO_REGISTER_DEST):
                op = m.group(1)
                width = 4 if ".128" in op else 2 if (".64" in op or ".WIDE" in op) else 1
                if operand & set(range(int(m.group(2)), int(m.group(2)) + width)):
                    hits.append(later.strip())
    return hits


def _count_prefix(counts: Dict[str, int], prefix: str) -> int:
    return sum(n for op, n in counts.items() if op == prefix or op.startswith(prefix + "."))


def _resource_usage(cubin_path: str) -> Tuple[Optional[int], Optional[int]]:
    """(registers, stack bytes) of the cubin's kernel, the largest over its functions."""
    tool = find_tool("cuobjdump")
    if tool is None:
        return None, None
    out = subprocess.run([tool, "-res-usage", cubin_path], capture_output=True, text=True).stdout
    found = [(int(r), int(s) + int(loc)) for r, s, _, loc in _RES_RE.findall(out)]
    if not found:
        return None, None
    return max(r for r, _ in found), max(s for _, s in found)


@dataclasses.dataclass
class KernelReport:
    """One registry kernel built for one arch: the printed line, whether it passed, and (when it
    built) the cubin, its SASS, opcode counts, registers and spill bytes."""

    name: str
    arch: str
    ok: bool
    line: str
    cubin: Optional[bytes] = None
    sass: str = ""
    counts: Dict[str, int] = dataclasses.field(default_factory=dict)
    regs: Optional[int] = None
    spill: Optional[int] = None
    seconds: float = 0.0

    def count(self, prefix: str) -> int:
        """Instructions whose opcode is ``prefix`` or starts with ``prefix + "."``."""
        return _count_prefix(self.counts, prefix)


def build_report(spec, arch: str) -> KernelReport:
    """Compile one registry kernel for ``arch`` (through the jit) and check its SASS."""
    from fastvideo_cute.jit import compile_kernel, cubin_of
    from fastvideo_cute.kernels.cute import SASS_COUNTED

    head = f"{spec.name:<32} {arch:<8}"
    if arch not in spec.archs:
        return KernelReport(spec.name, arch, True, f"{head} skipped (not targeted; targets {', '.join(spec.archs)})")
    t0 = time.perf_counter()
    try:
        compiled, _ = compile_kernel(spec.make(), arch, need_cubin=True)
    except Exception as exc:  # noqa: BLE001 - report any build failure as a failed line
        msg = str(exc).strip().splitlines()
        return KernelReport(spec.name, arch, False,
                            f"{head} FAIL build: {type(exc).__name__}: {msg[-1] if msg else ''}"[:400])
    secs = time.perf_counter() - t0
    report = KernelReport(spec.name, arch, False, "", cubin=cubin_of(compiled), seconds=secs)
    if report.cubin is None:
        report.line = f"{head} {secs:6.1f}s FAIL no cubin kept"
        return report
    nvdisasm = find_tool("nvdisasm")
    if nvdisasm is None:
        report.line = f"{head} {secs:6.1f}s FAIL nvdisasm not found (set CUDA_HOME or install triton)"
        return report
    with tempfile.TemporaryDirectory(prefix="fvc_compile_check_") as tmp:
        cubin_path = os.path.join(tmp, f"{spec.name}.{arch}.cubin")
        with open(cubin_path, "wb") as f:
            f.write(report.cubin)
        report.regs, report.spill = _resource_usage(cubin_path)
        dis = subprocess.run([nvdisasm, "-c", cubin_path], capture_output=True, text=True)
    if dis.returncode != 0 or not dis.stdout:
        report.line = f"{head} {secs:6.1f}s FAIL nvdisasm: {dis.stderr.strip()[:200]}"
        return report
    report.sass = dis.stdout
    report.counts = sass_counts(dis.stdout)
    missing = [p for p in spec.expect if report.count(p) == 0]
    present = [p for p in spec.forbid if report.count(p) > 0]
    shown = " ".join(f"{op}={report.count(op)}" for op in SASS_COUNTED)
    line = (f"{head} {secs:6.1f}s regs={report.regs if report.regs is not None else '?'} "
            f"spill={report.spill if report.spill is not None else '?'}B {shown}")
    wrong_arch = not sass_is_for_arch(dis.stdout, arch)
    if missing or present or wrong_arch:
        why = ["cubin is not for " + arch] if wrong_arch else []
        if missing:
            why.append(f"lacks {', '.join(missing)}")
        if present:
            why.append(f"has {', '.join(present)}")
        report.line = f"{line} FAIL {'; '.join(why)}"
        return report
    report.ok, report.line = True, f"{line} OK"
    return report


def check_kernel(spec, arch: str, keep_dir: Optional[str] = None) -> Tuple[bool, str]:
    """Compile one registry kernel for ``arch``; returns (ok, the printed line). ``keep_dir``:
    also write its cubin and SASS there (``<name>.<arch>.cubin`` / ``.sass``)."""
    report = build_report(spec, arch)
    if keep_dir and report.cubin is not None:
        os.makedirs(keep_dir, exist_ok=True)
        with open(os.path.join(keep_dir, f"{spec.name}.{arch}.cubin"), "wb") as f:
            f.write(report.cubin)
        if report.sass:
            with open(os.path.join(keep_dir, f"{spec.name}.{arch}.sass"), "w") as f:
                f.write(report.sass)
    return report.ok, report.line


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastvideo_cute.compile_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", action="append", required=True,
                        help="target arch, e.g. sm_121a, sm_120a, sm_90a, sm_100a (repeat or comma-separate)")
    parser.add_argument("--kernel", action="append", help="only these registry names (repeatable)")
    parser.add_argument("--keep", metavar="DIR", help="write each variant's cubin and SASS here")
    ns = parser.parse_args(argv)
    archs = [a.strip() for arg in ns.arch for a in arg.split(",") if a.strip()]

    from fastvideo_cute.kernels.cute import REGISTRY, find

    specs = [find(n) for n in ns.kernel] if ns.kernel else list(REGISTRY)
    failed = 0
    for arch in archs:
        for spec in specs:
            ok, line = check_kernel(spec, arch, ns.keep)
            print(line, flush=True)
            failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
