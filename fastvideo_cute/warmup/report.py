"""Console output of a warm-up: progress bar, plan listing, results table, cache sizes, and
the environment recorded in the JSON report."""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from .cache import CachePaths, _dist_version, library_version
from .variants import PlanUnit, Target


_ROUTE_ENV_VARS = ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND")


class Progress:
    """A progress bar on stderr (one line per step when stderr is not a terminal)."""

    def __init__(self, total: int, enabled: bool = True, width: int = 24):
        self.total, self.enabled, self.width, self.done = max(total, 1), enabled, width, 0
        self.tty = enabled and sys.stderr.isatty()

    def step(self, label: str) -> None:
        if not self.enabled:
            return
        filled = int(self.width * self.done / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        line = f"[{bar}] {self.done + 1}/{self.total} {label}"
        if self.tty:
            sys.stderr.write("\r\033[K" + line[:150])
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
        self.done += 1

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _fmt_bytes(n: Optional[int]) -> str:
    if not n:
        return "0"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _fmt_s(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3f}"


def format_plan(units: Sequence[PlanUnit], own: Sequence[Tuple[str, str]], target: Target) -> str:
    lines = [f"plan for {target.label}:", f"{'workload':<44} {'mode':<6} {'dir':<4} {'route':<8} variant"]
    for u in units:
        if u.error:
            lines.append(f"{u.workload.name:<44} {u.mode:<6} {'-':<4} {'ERROR':<8} {u.error}")
            continue
        for d in u.directions:
            key = u.keys[d]
            lines.append(f"{u.workload.name:<44} {u.mode:<6} {d:<4} {u.route:<8} {key.label} [{key.digest()}]")
        if u.note:
            lines.append(f"{'':<44} {'':<6} {'':<4} {'':<8} ({u.note})")
    for name, arch in own:
        lines.append(f"{name:<44} {'-':<6} {'fwd':<4} {'cute-own':<8} registry kernel for {arch}")
    distinct = {k.digest() for u in units for k in u.keys.values()}
    lines.append(f"{len(distinct)} distinct route variants over {sum(len(u.keys) for u in units)} calls"
                 + (f", {len(own)} own CuTe kernels" if own else ""))
    return "\n".join(lines)


def format_table(rows: Sequence[Dict[str, Any]]) -> str:
    head = (f"{'#':>3}  {'variant':<46} {'workload':<36} {'mode':<6} {'first s':>8} {'steady s':>9} "
            f"{'compile s':>9}  {'cache':<7} {'bytes':>9}")
    lines = [head, "-" * len(head)]
    for i, r in enumerate(rows, 1):
        compile_s = r.get("overhead_s") if r.get("cache") == "miss" else None
        if r.get("route") == "cute-own" and r.get("cache") == "miss":
            compile_s = r.get("first_s")
        lines.append(f"{i:>3}  {str(r.get('variant'))[:46]:<46} {str(r.get('workload'))[:36]:<36} "
                     f"{str(r.get('mode')):<6} {_fmt_s(r.get('first_s')):>8} {_fmt_s(r.get('steady_s')):>9} "
                     f"{_fmt_s(compile_s):>9}  {str(r.get('cache')):<7} {_fmt_bytes(r.get('new_bytes')):>9}")
    return "\n".join(lines)


def format_sizes(sizes: Mapping[str, Mapping[str, int]], paths: CachePaths) -> str:
    parts = [f"{name} {_fmt_bytes(v['bytes'])} ({v['files']} files)" for name, v in sizes.items()]
    total = sum(v["bytes"] for v in sizes.values())
    return f"cache {paths.root}: " + ", ".join(parts) + f"; total {_fmt_bytes(total)}"


def _environment() -> Dict[str, Any]:
    env: Dict[str, Any] = {"python": sys.version.split()[0], "fastvideo-cute": library_version()}
    for dist in ("torch", "triton", "nvidia-cutlass-dsl", "flash-attn-4", "quack-kernels", "apache-tvm-ffi"):
        env[dist] = _dist_version(dist)
    try:
        import torch

        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name()
            env["capability"] = list(torch.cuda.get_device_capability())
    except Exception:  # noqa: BLE001
        pass
    env["TRITON_INTERPRET"] = os.environ.get("TRITON_INTERPRET")
    for name in _ROUTE_ENV_VARS:
        env[name] = os.environ.get(name)
    return env
