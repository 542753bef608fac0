"""The measured route table: for each call class, the backends in the order they measured.

A call class is (arch, logical block size, direction, full vs partial kv tiles, head_dim). The
table is a JSON file written by the benchmark CLI (``benchmarks/bench_vsa.py
--write-route-table``) from one device run, shipped as ``fastvideo_cute/data/route_table.json``
(its results JSON is committed under ``benchmarks/results/`` and named in the table's
``source``); ``FASTVIDEO_VSA_ROUTE_TABLE=<path>`` loads another one, ``=off`` none.

Format (``schema`` 1)::

    {"schema": 1, "source": "benchmarks/results/<run>.json",
     "measured_with": {"gpu": "...", "commit": "...", "<dist name>": "<version>", ...},
     "entries": [{"arch": "sm_90", "block_size": 64, "direction": "fwd", "tiles": "full",
                  "head_dim": 128, "order": ["cudnn", "fa4", "triton"],
                  "ms": {"cudnn": 1.23, ...}}, ...]}

:func:`load_route_table` rejects a malformed table (missing or mistyped fields, unknown
directions/tiles, duplicate classes, an ``order`` that is empty or repeats a backend) and a stale
one (a package in ``measured_with`` installed at another version, or an ``order`` naming a
backend this library does not have) with :class:`RouteTableError` saying what and how to fix it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import json
import os
from pathlib import Path
from typing import Dict, Iterable, Mapping, Optional, Tuple

from .errors import RouteError

__all__ = ["RouteTable", "RouteTableError", "load_route_table", "active_route_table", "class_key", "SCHEMA",
           "DEFAULT_PATH", "TABLE_ENV", "TRACKED_DISTS"]

SCHEMA = 1
DEFAULT_PATH = Path(__file__).resolve().parent / "data" / "route_table.json"
TABLE_ENV = "FASTVIDEO_VSA_ROUTE_TABLE"
#: distributions whose installed version must equal the measured one for the table to hold: the
#: library and the exactly pinned CuTe stack (Triton follows torch, so it is recorded, not required)
TRACKED_DISTS = ("fastvideo-cute", "flash-attn-4", "nvidia-cutlass-dsl", "nvidia-cudnn-frontend")

_DIRECTIONS = ("fwd", "bwd")
_TILES = ("full", "partial")

ClassKey = Tuple[str, int, str, str, int]


class RouteTableError(RouteError, ValueError):
    """A route table that is malformed or stale (the message says what, and how to fix it)."""


def class_key(arch: str, block_size: int, direction: str, all_full: bool, head_dim: int) -> ClassKey:
    return (arch, int(block_size), direction, "full" if all_full else "partial", int(head_dim))


@dataclasses.dataclass(frozen=True)
class RouteTable:
    source: str
    measured_with: Mapping[str, str]
    orders: Mapping[ClassKey, Tuple[str, ...]]
    path: str = ""

    def order(self, key: ClassKey) -> Optional[Tuple[str, ...]]:
        return self.orders.get(key)


def _installed(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _fail(path, what: str) -> RouteTableError:
    return RouteTableError(f"route table {path}: {what}; re-run `python benchmarks/bench_vsa.py ... "
                           f"--write-route-table` on the target GPU, or set {TABLE_ENV}=off")


def parse_route_table(data, path: str = "<table>", known_backends: Optional[Iterable[str]] = None,
                      installed=_installed) -> RouteTable:
    """Validate a decoded table (see the module docstring); ``installed(name)`` gives a
    distribution's installed version (None if absent), for the staleness check."""
    if not isinstance(data, dict):
        raise _fail(path, f"must be a JSON object, got {type(data).__name__}")
    if data.get("schema") != SCHEMA:
        raise _fail(path, f"schema must be {SCHEMA}, got {data.get('schema')!r}")
    source, measured, entries = data.get("source"), data.get("measured_with"), data.get("entries")
    if not isinstance(source, str) or not source:
        raise _fail(path, "'source' must name the results JSON the table was made from")
    if not isinstance(measured, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in measured.items()):
        raise _fail(path, "'measured_with' must map names to version strings")
    if not isinstance(entries, list) or not entries:
        raise _fail(path, "'entries' must be a non-empty list")
    known = set(known_backends) if known_backends is not None else None
    orders: Dict[ClassKey, Tuple[str, ...]] = {}
    for i, e in enumerate(entries):
        where = f"entry {i}"
        if not isinstance(e, dict):
            raise _fail(path, f"{where} must be an object")
        arch, block, direction, tiles, head_dim, order = (e.get(f) for f in
                                                          ("arch", "block_size", "direction", "tiles", "head_dim",
                                                           "order"))
        if not isinstance(arch, str) or not arch.startswith("sm_"):
            raise _fail(path, f"{where}: 'arch' must look like 'sm_90', got {arch!r}")
        if block not in (64, 128, 256) or isinstance(block, bool):
            raise _fail(path, f"{where}: 'block_size' must be 64, 128 or 256, got {block!r}")
        if direction not in _DIRECTIONS:
            raise _fail(path, f"{where}: 'direction' must be one of {_DIRECTIONS}, got {direction!r}")
        if tiles not in _TILES:
            raise _fail(path, f"{where}: 'tiles' must be one of {_TILES}, got {tiles!r}")
        if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0:
            raise _fail(path, f"{where}: 'head_dim' must be a positive int, got {head_dim!r}")
        if not isinstance(order, list) or not order or not all(isinstance(n, str) for n in order) \
                or len(set(order)) != len(order):
            raise _fail(path, f"{where}: 'order' must be a non-empty list of distinct backend names, got {order!r}")
        if known is not None and set(order) - known:
            raise _fail(path, f"{where}: 'order' names backends this library does not have: "
                              f"{sorted(set(order) - known)} (stale table)")
        key = (arch, block, direction, tiles, head_dim)
        if key in orders:
            raise _fail(path, f"{where}: duplicate call class {key}")
        orders[key] = tuple(order)
    for name in TRACKED_DISTS:
        if name in measured and installed(name) is not None and installed(name) != measured[name]:
            raise _fail(path, f"stale: measured with {name}=={measured[name]}, installed {installed(name)}")
    return RouteTable(source, dict(measured), orders, path)


def load_route_table(path: os.PathLike, known_backends: Optional[Iterable[str]] = None) -> RouteTable:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise RouteTableError(f"route table {path}: cannot be read ({exc})") from exc
    except json.JSONDecodeError as exc:
        raise _fail(path, f"is not valid JSON ({exc})") from exc
    return parse_route_table(data, str(path), known_backends)


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, known: Tuple[str, ...]) -> RouteTable:
    return load_route_table(path, known)


def active_route_table(known_backends: Iterable[str]) -> Optional[RouteTable]:
    """The table routing uses: ``$FASTVIDEO_VSA_ROUTE_TABLE`` (a path, or ``off``), else the
    shipped one when it exists. Raises :class:`RouteTableError` for a malformed or stale table."""
    chosen = os.environ.get(TABLE_ENV, "").strip()
    if chosen.lower() in ("off", "none", "0"):
        return None
    if not chosen:
        if not _shipped():
            return None
        return _load_cached(str(DEFAULT_PATH), tuple(sorted(known_backends)))
    return _load_cached(str(Path(chosen).expanduser()), tuple(sorted(known_backends)))


@functools.lru_cache(maxsize=1)
def _shipped() -> bool:
    """Whether the package ships a table (asked once: routing runs on every call, a stat need not)."""
    return DEFAULT_PATH.is_file()
