"""First-call latency of every kernel variant, cold vs after ``fastvideo-cute-warmup`` (GPU).

Issue 6's target: after the warm-up, the first forward + backward of each variant in a NEW process
is at most 0.3 s over its steady-state time. Three fresh processes, each
``python -m fastvideo_cute.warmup`` with the same workload arguments:

1. cold    -- empty cache root A, ``--verify-only --allow-miss``: every first call JIT-compiles.
2. warm-up -- empty cache root B, the warm-up itself (its wall time is what an image build pays).
3. warm    -- cache root B, ``--verify-only``: every first call must load from the cache.

Rows are matched by id (workload/mode/direction). Per row the JSON has ``cold_first_s``,
``warm_first_s``, ``steady_s`` (the warm process's steady state), ``warm_overhead_s`` =
warm first - steady, and ``target_ok`` (``warm_overhead_s <= --target``). One-off process costs
(CUDA context, importing the Triton kernels / FA4 / the CuTe DSL) are timed apart from the rows
(``setup_s``) and reported too: they are paid once per process, not per variant.

    . /tmp/fvc/env.sh   # the GPU box's environment
    FVC_COMMIT=$(git rev-parse HEAD) python3 benchmarks/warmup_latency.py \\
        --preset wan2.1-1.3b-480p --block all --route cute --mode both \\
        --out benchmarks/results/warmup_latency_h200.json

Any argument this script does not know is passed to ``fastvideo_cute.warmup`` unchanged
(``--preset``, ``--shape``, ``--block``, ``--dtype``, ``--layout``, ``--mode``, ``--route``, ...).
Exit status 1 if a row misses the target or a process failed. Needs CUDA (``--allow-cpu`` runs the
same steps under the Triton interpreter, for testing the script only: nothing is compiled there).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
DEFAULT_WARMUP_ARGS = ["--preset", "wan2.1-1.3b-480p", "--block", "all", "--route", "cute", "--mode", "both"]


def parse_args(argv: Optional[Sequence[str]] = None) -> Tuple[argparse.Namespace, List[str]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Other arguments go to fastvideo_cute.warmup (default: "
                                       + " ".join(DEFAULT_WARMUP_ARGS) + ").")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/warmup_latency_<gpu>.json)")
    p.add_argument("--target", type=float, default=0.3, help="max first-call overhead after warm-up, s (0.3)")
    p.add_argument("--keep-cache", default=None, metavar="DIR",
                   help="use DIR as the warm cache root B (kept); default: a temporary dir, removed")
    p.add_argument("--timeout", type=float, default=540, help="per-process timeout, s")
    p.add_argument("--allow-cpu", action="store_true", help="run without CUDA (interpreter; tests the script)")
    args, rest = p.parse_known_args(argv)
    return args, (rest or list(DEFAULT_WARMUP_ARGS))


def _version(dist: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001
        return None


def environment() -> Dict[str, Any]:
    env: Dict[str, Any] = {"python": platform.python_version(), "host": platform.node()}
    for dist in ("torch", "triton", "nvidia-cutlass-dsl", "flash-attn-4", "quack-kernels", "apache-tvm-ffi",
                 "fastvideo-cute"):
        env[dist] = _version(dist)
    try:
        # The device copy of the tree has no git history: the caller passes the commit in FVC_COMMIT.
        env["git_commit"] = os.environ.get("FVC_COMMIT") or subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001
        env["git_commit"] = None
    try:
        import torch

        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name()
            env["capability"] = list(torch.cuda.get_device_capability())
            env["cuda"] = torch.version.cuda
    except Exception:  # noqa: BLE001
        pass
    return env


def run_warmup(extra: Sequence[str], cache_root: str, json_path: str, timeout: float) -> Dict[str, Any]:
    """One fresh ``python -m fastvideo_cute.warmup`` process; its JSON report plus wall time."""
    cmd = [sys.executable, "-m", "fastvideo_cute.warmup", *extra, "--cache-dir", cache_root, "--json", json_path,
           "--no-progress"]
    env = dict(os.environ)
    for name in ("FASTVIDEO_CUTE_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "TRITON_CACHE_DIR",
                 "CUTE_DSL_CACHE_DIR"):
        env.pop(name, None)  # the child sets them from --cache-dir
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    wall = time.perf_counter() - t0
    report: Dict[str, Any] = {}
    if os.path.exists(json_path):
        with open(json_path) as f:
            report = json.load(f)
    return {"cmd": cmd, "returncode": proc.returncode, "wall_s": wall, "report": report,
            "stdout": proc.stdout, "stderr": proc.stderr[-4000:]}


def combine(cold: Dict[str, Any], warm: Dict[str, Any], target: float) -> List[Dict[str, Any]]:
    """One row per variant id: cold and warm first calls, the warm steady state, the verdict."""
    cold_rows = {r["id"]: r for r in cold.get("report", {}).get("rows", [])}
    rows = []
    for r in warm.get("report", {}).get("rows", []):
        c = cold_rows.get(r["id"], {})
        steady = r.get("steady_s")
        overhead = None if steady is None or r.get("first_s") is None else r["first_s"] - steady
        rows.append({
            "id": r["id"], "variant": r.get("variant"), "route": r.get("route"), "mode": r.get("mode"),
            "direction": r.get("direction"), "shape": r.get("shape"),
            "cold_first_s": c.get("first_s"), "cold_cache": c.get("cache"),
            "warm_first_s": r.get("first_s"), "warm_cache": r.get("cache"), "steady_s": steady,
            "cold_overhead_s": None if steady is None or c.get("first_s") is None else c["first_s"] - steady,
            "warm_overhead_s": overhead,
            "target_ok": None if overhead is None or r.get("cache") == "n/a" else overhead <= target,
        })
    return rows


def format_rows(rows: Sequence[Dict[str, Any]], target: float) -> str:
    def f(x):
        return "-" if x is None else f"{x:.3f}"

    head = (f"{'variant':<50} {'mode':<6} {'cold 1st':>9} {'warm 1st':>9} {'steady':>8} {'warm over':>9} "
            f"{'cache':<7} ok(<= {target}s)")
    lines = [head, "-" * len(head)]
    for r in rows:
        ok = {True: "yes", False: "NO", None: "-"}[r["target_ok"]]
        lines.append(f"{str(r['variant'])[:50]:<50} {str(r['mode']):<6} {f(r['cold_first_s']):>9} "
                     f"{f(r['warm_first_s']):>9} {f(r['steady_s']):>8} {f(r['warm_overhead_s']):>9} "
                     f"{str(r['warm_cache']):<7} {ok}")
    return "\n".join(lines)


def default_out(env: Dict[str, Any]) -> Path:
    gpu = (env.get("gpu") or "cpu").lower()
    slug = "".join(c if c.isalnum() else "_" for c in gpu).strip("_")
    return REPO / "benchmarks" / "results" / f"warmup_latency_{slug}.json"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, extra = parse_args(argv)
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print("warmup_latency.py needs a CUDA GPU (--allow-cpu: interpreter smoke run)", file=sys.stderr)
        return 2
    env = environment()
    out = Path(args.out) if args.out else default_out(env)
    with tempfile.TemporaryDirectory(prefix="fvc_warmup_lat_") as tmp:
        cold_root = os.path.join(tmp, "cold")
        warm_root = args.keep_cache or os.path.join(tmp, "warm")
        if args.keep_cache and any(Path(warm_root).glob("*")):
            print(f"--keep-cache {warm_root} is not empty: the warm-up step will not start cold", file=sys.stderr)
        steps = {}
        steps["cold"] = run_warmup([*extra, "--verify-only", "--allow-miss"], cold_root,
                                   os.path.join(tmp, "cold.json"), args.timeout)
        steps["warmup"] = run_warmup(extra, warm_root, os.path.join(tmp, "warmup.json"), args.timeout)
        steps["warm"] = run_warmup([*extra, "--verify-only"], warm_root, os.path.join(tmp, "warm.json"),
                                   args.timeout)
    rows = combine(steps["cold"], steps["warm"], args.target)
    failed_steps = [name for name, s in steps.items() if s["returncode"] != 0]
    missed = [r["id"] for r in rows if r["target_ok"] is False]
    result = {
        "benchmark": "warmup_latency",
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "environment": env,
        "warmup_args": extra,
        "target_s": args.target,
        "rows": rows,
        "steps": {name: {"wall_s": s["wall_s"], "returncode": s["returncode"], "cmd": s["cmd"],
                         "setup_s": s["report"].get("setup_s"), "cache_sizes": s["report"].get("cache_sizes"),
                         "failures": s["report"].get("failures"), "stderr_tail": s["stderr"][-1500:]}
                  for name, s in steps.items()},
        "cache_bytes": sum(v.get("bytes", 0) for v in (steps["warmup"]["report"].get("cache_sizes") or {}).values()),
        "failed_steps": failed_steps,
        "missed_target": missed,
        # No verdict when no row could be judged (the interpreter compiles nothing).
        "pass": (not failed_steps and not missed) if any(r["target_ok"] is not None for r in rows) else None,
    }
    if result["pass"] is None and failed_steps:
        result["pass"] = False
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print(format_rows(rows, args.target))
    for name, s in steps.items():
        setup = s["report"].get("setup_s") or {}
        print(f"{name:<7} process: {s['wall_s']:.1f} s wall, rc={s['returncode']}, setup "
              + ", ".join(f"{k}={v:.2f}" for k, v in setup.items()))
    verdict = {True: "PASS", False: "FAIL", None: "NO VERDICT (nothing was compiled: interpreter)"}[result["pass"]]
    print(f"warm cache: {result['cache_bytes'] / 2**20:.1f} MiB; {verdict} "
          f"(target <= {args.target} s over steady state, process setup excluded); JSON: {out}")
    for name in failed_steps:
        print(f"--- {name} stderr ---\n{steps[name]['stderr'][-2000:]}", file=sys.stderr)
    return 1 if result["pass"] is False else 0


if __name__ == "__main__":
    sys.exit(main())
