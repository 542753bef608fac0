#!/usr/bin/env python
"""The innermost loops of a kernel's SASS, by instruction class: a static per-step count to put two
kernels' main loops side by side (CPU only; no GPU, no timing).

A loop is a backward branch (``BRA`` to a label at or above it); its body is the instructions from the
label to the branch. Innermost loops (no other loop inside) that hold at least one ``--must`` opcode
(default ``HGMMA``) are printed with their length and a histogram by class (wgmma, shared-memory
loads/stores, fp32 math and converts, uniform-datapath, integer/move/predicate, barriers, branches).
Static counts: a body's alternative paths all count, so compare like with like and read the
dynamic counts (Nsight Compute) before concluding.

  python benchmarks/sass_loops.py ours.sass cudnn.sass [--json out.json]
  python benchmarks/sass_loops.py kernel.cubin   # disassembled first (nvdisasm as compile_check finds it)

SASS of our kernels: ``python -m fastvideo_cute.compile_check --arch sm_90a --keep DIR``; of cuDNN
BSA's: ``tests/adapters/test_cudnn_compile.py sm_90a --out DIR`` with ``CUTE_DSL_DUMP_DIR`` set keeps
its cubins.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_TARGET = re.compile(r"(\.L_x_\d+)")
_PRED = re.compile(r"^@!?U?P[T\d]+\s+")
_MEMORY_ASYNC = {"UTMALDG", "UTMASTG", "UTMAREDG", "UBLKCP", "UBLKRED", "UTMAPF"}

CLASSES = ("wgmma", "shared ld/st", "fp32 / cvt", "uniform", "integer / move / predicate", "sync / barrier",
           "branch", "global / async copy", "other")


def parse(sass: str) -> Tuple[List[str], Dict[str, int]]:
    """The instructions (text without address and ``;``) in order, and each label's index."""
    insns: List[str] = []
    labels: Dict[str, int] = {}
    for line in sass.splitlines():
        m = _LABEL.match(line)
        if m:
            labels[m.group(1)] = len(insns)
            continue
        m = _INSN.match(line)
        if m:
            insns.append(m.group(2))
    return insns, labels


def opcode(insn: str) -> str:
    """The opcode with its modifiers (``HGMMA.64x64x16.F32.BF16``), guard predicate dropped."""
    insn = _PRED.sub("", insn.strip())
    return insn.split()[0] if insn else ""


def op_class(op: str) -> str:
    base = op.split(".")[0]
    if base == "HGMMA":
        return "wgmma"
    if base in ("LDS", "STS", "LDSM", "STSM"):
        return "shared ld/st"
    if base in ("FADD", "FMUL", "FFMA", "FSEL", "MUFU", "F2FP", "FMNMX", "FSETP", "HADD2", "HMUL2", "HFMA2"):
        return "fp32 / cvt"
    if base in _MEMORY_ASYNC or base in ("LDG", "STG", "REDG", "ATOMG", "LDGSTS"):
        return "global / async copy"
    if base.startswith("U"):
        return "uniform"
    if base in ("IMAD", "IADD3", "LOP3", "SHF", "PRMT", "LEA", "VIADD", "SEL", "ISETP", "MOV", "CS2R", "PLOP3",
                "R2UR", "S2R", "S2UR", "IABS", "I2F", "F2I", "SHFL", "VOTE", "P2R", "R2P", "LDC", "IMNMX"):
        return "integer / move / predicate"
    if base in ("BAR", "SYNCS", "WARPGROUP", "WARPSYNC", "NANOSLEEP", "DEPBAR", "FENCE", "MEMBAR", "ELECT"):
        return "sync / barrier"
    if base in ("BRA", "EXIT", "RET", "CALL", "BSYNC", "BSSY", "BREAK", "BMOV"):
        return "branch"
    return "other"


def innermost_loops(insns: List[str], labels: Dict[str, int], must: str = "HGMMA") -> List[dict]:
    """Innermost backward-branch loops holding a ``must`` opcode: ``{start, end, length, classes, opcodes}``."""
    spans = []
    for i, insn in enumerate(insns):
        if opcode(insn).split(".")[0] != "BRA":
            continue
        m = _TARGET.search(insn)
        if m and m.group(1) in labels and labels[m.group(1)] <= i:
            spans.append((labels[m.group(1)], i))
    inner = [(s, e) for s, e in spans if not any((s2, e2) != (s, e) and s <= s2 and e2 <= e for s2, e2 in spans)]
    loops = []
    for s, e in sorted(set(inner)):
        ops = [opcode(x) for x in insns[s:e + 1]]
        if must and not any(o.split(".")[0] == must for o in ops):
            continue
        classes = collections.Counter(op_class(o) for o in ops)
        loops.append({"start": s, "end": e, "length": e - s + 1,
                      "classes": {c: classes[c] for c in CLASSES if classes[c]},
                      "opcodes": dict(collections.Counter(o.split(".")[0] for o in ops).most_common())})
    return loops


def _read(path: str, nvdisasm: str) -> str:
    if path.endswith(".cubin"):
        from fastvideo_cute.compile_check import find_tool

        nvdisasm = nvdisasm or find_tool("nvdisasm")
        if not nvdisasm:
            raise SystemExit(f"{path}: nvdisasm not found (set CUDA_HOME, install triton or pass --nvdisasm)")
        return subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True, check=True).stdout
    with open(path) as f:
        return f.read()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="SASS text (nvdisasm -c) or .cubin files")
    ap.add_argument("--must", default="HGMMA", help="keep loops holding this opcode ('' for all)")
    ap.add_argument("--nvdisasm", default="", help="nvdisasm for .cubin inputs (default: found as compile_check finds it)")
    ap.add_argument("--json", help="write the loops of every file here")
    args = ap.parse_args(argv)
    out = {}
    for path in args.files:
        insns, labels = parse(_read(path, args.nvdisasm))
        loops = innermost_loops(insns, labels, args.must)
        out[path] = loops
        print(f"{path}: {len(insns)} instructions, {len(loops)} innermost loop(s) with {args.must or 'anything'}")
        for lp in loops:
            cls = ", ".join(f"{k} {v}" for k, v in lp["classes"].items())
            print(f"  [{lp['start']}, {lp['end']}] {lp['length']} instructions: {cls}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
