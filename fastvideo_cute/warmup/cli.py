"""``fastvideo-cute-warmup`` / ``python -m fastvideo_cute.warmup``: arguments, the run, and
``--check`` (the same arguments again in a fresh ``--verify-only`` process)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..warmup_presets import PRESETS
from .cache import CACHE_ROOT_ENV, CachePaths, cache_env, cache_sizes, configure_cache
from .plan import _MODES, enumerate_plan, own_kernels_for, preset_workloads, shape_workloads
from .report import Progress, _environment, format_plan, format_sizes, format_table
from .run import _interpreting, execute_own, execute_unit, prepare_process
from .variants import Target, Workload, parse_arch


_DTYPES = ("bf16", "fp16", "fp32")


def _int_list(text: str) -> List[int]:
    if text.strip().lower() == "all":
        return [64, 128, 256]
    out = [int(x) for x in text.replace(",", " ").split()]
    for b in out:
        if b not in (64, 128, 256):
            raise argparse.ArgumentTypeError(f"block size must be 64, 128 or 256 (or all), got {b}")
    return out


def _dtype_list(text: str) -> List[str]:
    out = [x.strip().lower() for x in text.replace(",", " ").split()]
    for d in out:
        if d not in _DTYPES:
            raise argparse.ArgumentTypeError(f"dtype must be one of {_DTYPES}, got {d!r}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fastvideo-cute-warmup",
        description="Compile every fastvideo-cute kernel variant a model uses into a persistent cache.",
        epilog="Presets: " + "; ".join(f"{n} ({PRESETS[n].description})" for n in PRESETS),
    )
    what = p.add_argument_group("what to warm up")
    what.add_argument("--preset", action="append", default=[], metavar="NAME",
                      help="model preset (repeatable): " + ", ".join(PRESETS))
    what.add_argument("--shape", action="append", nargs=4, type=int, default=[], metavar=("B", "H", "S", "D"),
                      help="explicit q/k/v shape (repeatable); every kv block full")
    what.add_argument("--block", type=_int_list, action="append", metavar="64,128,256|all",
                      help="logical block sizes (default: the preset's tile, 64 for --shape)")
    what.add_argument("--dtype", type=_dtype_list, action="append", metavar="bf16,fp16,fp32",
                      help="dtypes (default: the preset's, bf16 for --shape)")
    what.add_argument("--layout", choices=("bhsd", "bshd"), default="bhsd")
    what.add_argument("--entry", choices=("vsa", "bsa", "both"), default="vsa",
                      help="vsa: video_sparse_attn, what a VSA model calls (its sparse branch discards the LSE); "
                           "bsa: block_sparse_attn_* (returns the LSE). Routes may differ (default vsa)")
    what.add_argument("--no-gate", dest="gated", action="store_false",
                      help="vsa: call video_sparse_attn without compress_attn_weight (default: with one, as "
                           "FastVideo's VSA layers do; gated inference on sm_90 at 64-token tiles runs "
                           "another kernel, the sm90 forward with the gate fused)")
    what.add_argument("--mode", choices=("train", "infer", "both"), default="both",
                      help="train: forward + backward with grad; infer: forward without (default both)")
    what.add_argument("--batch", type=int, default=1, help="batch size for presets (default 1)")
    what.add_argument("--sparsity", type=float, default=None,
                      help="fraction of kv blocks dropped (default: the preset's 0.9; 0.5 for --shape)")
    where = p.add_argument_group("route and target")
    where.add_argument("--route", choices=("auto", "triton", "cute"), default="auto",
                       help="auto: the route variables of this environment, as the app will see them")
    where.add_argument("--backend", default=None, help="force one named backend (FASTVIDEO_VSA_BACKEND)")
    where.add_argument("--arch", default=None,
                       help="plan for this GPU arch (sm_90, sm_100, sm_120, sm_121a...); without that GPU "
                            "here the routes are planned only and our CuTe kernels are cross-compiled")
    where.add_argument("--cute-kernels", choices=("auto", "all", "none"), default="auto",
                       help="our registry CuTe kernels to compile for the arch (default auto: the sm120 "
                            "adapter's variant, when the CuTe route is asked for on sm_120/sm_121)")
    where.add_argument("--cute-kernel", action="append", default=None, metavar="NAME",
                       help="exactly these registry CuTe kernels (repeatable; overrides --cute-kernels)")
    out = p.add_argument_group("cache and output")
    out.add_argument("--cache-dir", default=None,
                     help=f"cache root (default ${CACHE_ROOT_ENV}, else ~/.cache/fastvideo-cute)")
    out.add_argument("--list", action="store_true", help="print the plan (route per variant) and exit")
    out.add_argument("--list-presets", action="store_true", help="print the presets and their shapes and exit")
    out.add_argument("--print-env", choices=("shell", "docker"), default=None,
                     help="print the cache variables for the app's environment and exit")
    out.add_argument("--check", action="store_true",
                     help="after warming up, prove in a fresh process that every variant loads from the cache")
    out.add_argument("--verify-only", action="store_true",
                     help="run every variant and fail if one had to compile (what --check runs)")
    out.add_argument("--allow-miss", action="store_true", help="with --verify-only: report misses, do not fail")
    out.add_argument("--max-overhead", type=float, default=None, metavar="S",
                     help="with --verify-only: also fail a variant whose first call is more than S seconds "
                          "over its steady state")
    out.add_argument("--iters", type=int, default=3, help="steady-state repetitions (default 3)")
    out.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON")
    out.add_argument("--no-progress", action="store_true")
    return p


def _flatten(groups: Optional[List[List[Any]]]) -> Optional[List[Any]]:
    if not groups:
        return None
    out: List[Any] = []
    for g in groups:
        for x in g:
            if x not in out:
                out.append(x)
    return out


def resolve_target(arch_arg: Optional[str]) -> Target:
    import torch

    if torch.cuda.is_available():
        here = tuple(torch.cuda.get_device_capability())
        if arch_arg is None:
            return Target("cuda", here, True)
        want = parse_arch(arch_arg)
        return Target("cuda", want, want == here)
    if arch_arg is not None:
        return Target("cuda", parse_arch(arch_arg), False)
    return Target("cpu", None, True)


def build_workloads(args, target: Target) -> List[Workload]:
    blocks, dtypes = _flatten(args.block), _flatten(args.dtype)
    entries = ("vsa", "bsa") if args.entry == "both" else (args.entry,)
    workloads: List[Workload] = []
    for name in args.preset:
        workloads += preset_workloads(name, blocks, dtypes, args.layout, args.batch, args.sparsity, entries)
    for shape in args.shape:
        workloads += shape_workloads(shape, blocks, dtypes, args.layout, args.sparsity, entries)
    if not getattr(args, "gated", True):
        workloads = [dataclasses.replace(w, gated=False) if w.entry == "vsa" else w for w in workloads]
    return workloads


def _child_argv(argv: Sequence[str]) -> List[str]:
    """The arguments of this run minus --check / --json / --no-progress (the check adds its own)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--check", "--no-progress", "--verify-only", "--allow-miss"):
            continue
        if a == "--json":
            skip = True
            continue
        if a.startswith("--json="):
            continue
        out.append(a)
    return out


def run_check(argv: Sequence[str], paths: CachePaths, timeout: Optional[float] = None) -> Tuple[int, Dict[str, Any]]:
    """``python -m fastvideo_cute.warmup --verify-only`` in a fresh process, same arguments and cache."""
    with tempfile.TemporaryDirectory(prefix="fvc_warmup_check_") as tmp:
        report = os.path.join(tmp, "verify.json")
        cmd = [sys.executable, "-m", "fastvideo_cute.warmup", *_child_argv(argv), "--verify-only",
               "--no-progress", "--json", report]
        env = dict(os.environ)
        env.update(cache_env(paths.root))
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        data: Dict[str, Any] = {}
        if os.path.exists(report):
            with open(report) as f:
                data = json.load(f)
        data["returncode"] = proc.returncode
        data["stdout"] = proc.stdout
        data["stderr"] = proc.stderr[-4000:]
        return proc.returncode, data


def verify_failures(rows: Sequence[Dict[str, Any]], allow_miss: bool, max_overhead: Optional[float]) -> List[str]:
    bad = []
    for r in rows:
        if r.get("cache") in ("error",) or r.get("error"):
            bad.append(f"{r['id']}: error {r.get('note') or r.get('error')}")
        elif r.get("cache") == "miss" and not allow_miss:
            bad.append(f"{r['id']}: not in the cache ({r.get('note')})")
        elif (max_overhead is not None and r.get("overhead_s") is not None and r.get("cache") != "n/a"
              and r["overhead_s"] > max_overhead):
            bad.append(f"{r['id']}: first call {r['overhead_s']:.3f} s over steady state (> {max_overhead} s)")
    return bad


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)

    if args.list_presets:
        for p in PRESETS.values():
            t, h, w = p.latent_grid
            per_block = ", ".join(f"b{b}: S={p.seq_len(b)} ({p.num_blocks(b)} blocks, topk {p.topk(b)})"
                                  for b in (64, 128, 256))
            print(f"{p.name:<20} {p.description}; heads {p.heads} x {p.head_dim}; latent ({t}, {h}, {w}) = "
                  f"{p.tokens} tokens; {per_block}")
        return 0

    paths = configure_cache(args.cache_dir)  # before anything imports FA4 or Triton's cache
    if args.print_env:
        for name, value in cache_env(paths.root).items():
            print(f"ENV {name}={value}" if args.print_env == "docker" else f"export {name}={value}")
        return 0

    target = resolve_target(args.arch)
    if target.device_type == "cpu" and not _interpreting():
        os.environ["TRITON_INTERPRET"] = "1"  # before any Triton kernel module is imported
        print("no CUDA GPU: running the Triton route under the interpreter (TRITON_INTERPRET=1)", file=sys.stderr)
    try:
        workloads = build_workloads(args, target)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        own = own_kernels_for(target, args.cute_kernels, args.route, args.cute_kernel)
    except ValueError as exc:
        parser.error(str(exc))
    if not workloads and not own:
        parser.error("nothing to warm up: give --preset and/or --shape (or --cute-kernels all with --arch)")
    if target.device_type == "cpu" and args.preset and not args.list:
        parser.error("presets are GPU-sized: on a CPU box use --shape (tiny shapes, interpreter) or --list")
    modes = _MODES if args.mode == "both" else (args.mode,)
    units = enumerate_plan(workloads, target, modes, args.route, args.backend)

    if args.list:
        print(format_plan(units, own, target))
        return 0

    import torch

    device = torch.device("cuda" if target.device_type == "cuda" and target.runnable else "cpu")
    runnable = [u for u in units if u.route and target.runnable]
    rows: List[Dict[str, Any]] = []
    for u in units:
        if u.error:
            rows.append({"id": f"{u.workload.name}/{u.mode}", "workload": u.workload.name, "mode": u.mode,
                         "route": None, "variant": "-", "cache": "error", "error": u.error, "note": u.error})
    if units and not target.runnable:
        print(format_plan(units, own, target))
        print(f"no {target.label} GPU in this process: the routes above are planned, not compiled"
              + ("; compiling our CuTe kernels (cross-compile)" if own else ""), file=sys.stderr)
    setup = prepare_process(runnable, device, own=bool(own)) if (runnable or own) else {}
    progress = Progress(len(runnable) + len(own), enabled=not args.no_progress)
    seen: set = set()
    for u in runnable:
        progress.step(f"{u.workload.name} {u.mode} ({u.route})")
        try:
            rows += execute_unit(u, device, paths, args.iters, seen, args.backend, args.route)
        except Exception as exc:  # noqa: BLE001 - a failed variant is a failed row
            msg = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            rows.append({"id": f"{u.workload.name}/{u.mode}", "workload": u.workload.name, "mode": u.mode,
                         "route": u.route, "variant": u.keys["fwd"].label, "cache": "error", "error": msg,
                         "note": msg})
    if own:
        for name, arch in own:
            progress.step(f"{name} {arch} (cute-own)")
            rows += execute_own([(name, arch)], paths)
    progress.close()

    sizes = cache_sizes(paths)
    title = "verify (fresh process)" if args.verify_only else "warm-up"
    print(f"fastvideo-cute {title} on {target.label}, route={args.backend or args.route}"
          + ("; process setup (not in the rows): " + ", ".join(f"{k}={v:.2f}" for k, v in setup.items())
             if setup else ""))
    print(format_table(rows))
    print(format_sizes(sizes, paths))
    if any(r.get("cache") == "n/a" for r in rows):
        print("n/a: the Triton interpreter compiles nothing, so it writes no Triton cache files; "
              "run on a GPU to fill the Triton cache")

    status = 0
    report: Dict[str, Any] = {
        "kind": "verify" if args.verify_only else "warmup", "argv": argv, "target": dataclasses.asdict(target),
        "cache_root": str(paths.root), "cache_env": cache_env(paths.root), "cache_sizes": sizes,
        "setup_s": setup, "rows": rows, "environment": _environment(),
    }
    if args.verify_only:
        failures = verify_failures(rows, args.allow_miss, args.max_overhead)
        report["failures"] = failures
        for f in failures:
            print("FAIL", f)
        status = 1 if failures else 0
    elif any(r.get("cache") == "error" for r in rows):
        status = 1
    if args.check and not args.verify_only:
        rc, child = run_check(argv, paths)
        report["check"] = {k: v for k, v in child.items() if k != "stdout"}
        child_rows = {r["id"]: r for r in child.get("rows", [])}
        print("\n--check: a fresh process ran every variant again with the same cache")
        sys.stdout.write(child.get("stdout", ""))
        counts: Dict[str, int] = {}
        for r in child_rows.values():
            counts[r.get("cache")] = counts.get(r.get("cache"), 0) + 1
        verdict = "PASS" if rc == 0 else "FAIL"
        if rc == 0 and counts and set(counts) <= {"n/a", "shared"}:
            verdict = "PASS (nothing cacheable ran: the Triton interpreter compiles nothing)"
        print("check summary: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items(), key=lambda kv: str(kv[0])))
              + f"; {verdict}")
        if rc != 0:
            if not child_rows:
                print(child.get("stderr", ""), file=sys.stderr)
            status = 1
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2, default=str)
    return status
