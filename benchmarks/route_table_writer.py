"""Write the measured route table (``fastvideo_cute.route_table``) from a bench_vsa.py run.

For each call class the run measured — (arch, block size, direction, full vs partial kv tiles,
head_dim) — the backends timed by name through the public API (routes ``triton``, ``fa4``,
``cudnn``; ``sm90`` and ``sm100`` if present) are ranked by their total time over
the class's cases (the sequence lengths / grids of that class), fastest first; a backend that failed or was skipped in
any case of the class is left out of that class. The table names the results JSON it came from.
With several runs, a class measured by more than one is taken whole from the first run listed that
measured it (a newer run of some classes listed before the older run of the rest).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Tuple

BACKEND_ROUTES = ("triton", "fa4", "cudnn", "sm90", "sm100")
# the installed versions a table is valid for (fastvideo_cute.route_table.TRACKED_DISTS)
TRACKED = ("fastvideo-cute", "flash-attn-4", "nvidia-cutlass-dsl", "nvidia-cudnn-frontend", "triton", "torch")


def build_route_table(payloads, source: str) -> dict:
    """One table from one or more runs on one GPU (e.g. synthetic lengths and a model grid)."""
    payloads = [payloads] if isinstance(payloads, dict) else list(payloads)
    env = payloads[0]["env"]
    cap = env.get("capability") or [0, 0]
    arch = f"sm_{cap[0]}{cap[1]}"
    classes: Dict[Tuple, Dict[str, List]] = {}
    for payload in payloads:
        if payload["env"].get("capability") != env.get("capability"):
            raise ValueError("results from different GPUs cannot share one route table")
        mine: Dict[Tuple, Dict[str, List]] = {}
        for r in payload["results"]:
            if r["kind"] != "route" or r["name"] not in BACKEND_ROUTES:
                continue
            key = (arch, r["block_size"], r["mode"], r.get("tiles", "full"), r.get("head_dim"))
            mine.setdefault(key, {}).setdefault(r["name"], []).append(r)
        for key, by_backend in mine.items():  # an earlier run's class stays whole
            classes.setdefault(key, by_backend)
    entries = []
    for (arch_, block, direction, tiles, head_dim), by_backend in sorted(classes.items()):
        cases = max(len(v) for v in by_backend.values())
        totals = {name: sum(r["ms"] for r in rows) for name, rows in by_backend.items()
                  if len(rows) == cases and all(r["status"] == "ok" and r.get("ms") for r in rows)}
        if not totals:
            continue
        order = sorted(totals, key=totals.get)
        entries.append({"arch": arch_, "block_size": block, "direction": direction, "tiles": tiles,
                        "head_dim": head_dim, "order": order, "ms": {n: round(totals[n], 4) for n in order},
                        "cases": cases})
    measured = {"gpu": env.get("gpu") or "?", "commit": env.get("tree_commit") or env.get("git_commit") or "?"}
    measured.update({name: env[name] for name in TRACKED if env.get(name)})
    return {"schema": 1, "source": source, "measured_with": measured, "entries": entries}


def _rel(path) -> str:
    repo = Path(__file__).resolve().parents[1]
    path = Path(path).resolve()
    try:
        return str(path.relative_to(repo))
    except ValueError:
        return str(path)


def write_route_table(payloads, results_paths, table_path) -> Path:
    paths = [results_paths] if isinstance(results_paths, (str, Path)) else list(results_paths)
    table = build_route_table(payloads, " + ".join(_rel(p) for p in paths))
    path = Path(table_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1) + "\n")
    return path


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="merge bench_vsa.py results JSONs of one GPU into one route table")
    ap.add_argument("results", nargs="+")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "fastvideo_cute" / "data" /
                                         "route_table.json"))
    ns = ap.parse_args()
    loaded = [json.loads(Path(p).read_text()) for p in ns.results]
    print(write_route_table(loaded, ns.results, ns.out))
