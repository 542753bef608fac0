"""Running a planned variant: its first call (timed, with cache evidence: new cache files and
in-process compile counts) against the steady state; compiling our registry kernels."""

from __future__ import annotations

import contextlib
import importlib
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .cache import CachePaths, CuteKernelCache, _diff, _snapshot, compile_registry_kernel, registry_kernel
from .plan import route_env
from .variants import PlanUnit, Workload, torch_dtype


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _entry_call(w: Workload, q, k, v, block_map, sizes) -> Callable[[], Any]:
    """The public call a model makes for this workload; returns ``out``."""
    from .. import api

    suffix = "_bshd" if w.layout == "bshd" else ""
    if w.entry == "vsa":
        fn = getattr(api, "video_sparse_attn" + suffix)
        block = w.tile if w.tile is not None else w.block_size
        gate = None
        if w.gated:  # FastVideo's VSA layers pass one (a linear's output: it requires grad in training)
            import torch

            gate = torch.rand_like(q).requires_grad_(q.requires_grad)
        return lambda: fn(q, k, v, sizes, sizes, min(w.topk, w.num_blocks), block_size=block,
                          compress_attn_weight=gate)
    base = {64: "block_sparse_attn", 128: "block_sparse_attn_128", 256: "block_sparse_attn_256"}[w.block_size]
    fn = getattr(api, base + suffix)
    return lambda: fn(q, k, v, block_map, sizes)[0]


def _triton_jit_count() -> Optional[int]:
    """Compiled Triton kernels held in this process (None under the interpreter / unknown)."""
    total, seen = 0, False
    for modname in ("fastvideo_cute.kernels.triton.block_sparse_fwd", "fastvideo_cute.kernels.triton.block_sparse_bwd",
                    "fastvideo_cute.kernels.triton.map_to_index"):
        mod = sys.modules.get(modname)
        if mod is None:
            continue
        for obj in vars(mod).values():
            caches = getattr(obj, "device_caches", None)
            if isinstance(caches, dict):
                seen = True
                try:
                    total += sum(len(entry[0]) for entry in caches.values())
                except Exception:  # noqa: BLE001 - Triton internals moved: no count
                    return None
    return total if seen else None


def _fa4_cache_state() -> Optional[Tuple[int, bool]]:
    """(compiled FA4 kernels held in this process, whether FA4's disk cache is on), or None if FA4
    was not imported."""
    iface = sys.modules.get("flash_attn.cute.interface")
    utils = sys.modules.get("flash_attn.cute.cache_utils")
    if iface is None or utils is None:
        return None
    total = 0
    for obj in vars(iface).values():
        cache = getattr(obj, "compile_cache", None)
        inner = getattr(cache, "cache", None)
        if isinstance(inner, dict):
            total += len(inner)
    return total, bool(getattr(utils, "CUTE_DSL_CACHE_ENABLED", False))


def _own_state() -> Dict[str, int]:
    """Our CuTe kernels' lookups in this process by outcome (:class:`CuteKernelCache` statuses:
    every adapter compiles through it)."""
    return dict(CuteKernelCache.stats)


def _interpreting() -> bool:
    from ..backends.triton_backend import interpreting

    return interpreting()


def classify(route: Optional[str], new: Dict[str, Tuple[int, int]], triton_delta: Optional[int],
             fa4_delta: Optional[int], fa4_disk: bool, on_cpu: bool,
             own_delta: Optional[Mapping[str, int]] = None) -> Tuple[str, str]:
    """(status, note) of one first call, from what it left behind.

    ``miss``: something was compiled (new cache files, or new in-memory kernels with no disk
    cache behind them). ``hit``: new kernels came up and no cache file was written: they were
    loaded from the disk cache. ``shared``: nothing new: an earlier row of this process already
    had the variant. ``n/a``: nothing is compiled (the Triton interpreter)."""
    files = sum(n for n, _ in new.values())
    if files:
        return "miss", "compiled: " + ", ".join(f"{k} +{n} files" for k, (n, _) in sorted(new.items()))
    if route == "triton":
        if on_cpu and _interpreting():
            return "n/a", "Triton interpreter: nothing compiled, nothing cached"
        if triton_delta is None:
            return "unknown", "no Triton kernel count (Triton internals)"
        if triton_delta > 0:
            return "hit", "loaded from the Triton cache"
        return "shared", "compiled earlier in this process"
    if route == "fa4":
        if fa4_delta is None:
            return "unknown", "FA4 not imported"
        if fa4_delta > 0 and not fa4_disk:
            return "miss", "FA4 disk cache disabled: compiled in memory only"
        if fa4_delta > 0:
            return "hit", "loaded from the FA4 cache"
        return "shared", "compiled earlier in this process"
    if route == "sm120":
        own = own_delta or {}
        if own.get("disk", 0) > 0:
            return "hit", "loaded from the fastvideo-cute cache"
        if own.get("compiled", 0) > 0:
            return "miss", "compiled (fastvideo-cute cache)"
        return "shared", "compiled earlier in this process"
    return "unknown", f"route {route}: no cache evidence beyond files (none written)"


def prepare_process(units: Sequence[PlanUnit], device, own: bool = False) -> Dict[str, float]:
    """One-off per-process costs, timed apart from the variants: CUDA context, imports."""
    import torch

    times: Dict[str, float] = {}
    if device.type == "cuda" and units:
        t0 = time.perf_counter()
        torch.cuda.init()
        torch.empty(1, device=device)
        _sync(device)
        times["cuda_init_s"] = time.perf_counter() - t0
    routes = {u.route for u in units if u.route}
    if "triton" in routes:
        t0 = time.perf_counter()
        importlib.import_module("fastvideo_cute.kernels.triton.block_sparse_fwd")
        importlib.import_module("fastvideo_cute.kernels.triton.block_sparse_bwd")
        if device.type == "cuda":
            try:  # Triton's driver utilities (compiled into / loaded from the Triton cache once per process)
                from triton.runtime import driver

                driver.active.get_current_device()
            except Exception:  # noqa: BLE001 - the first kernel call will do it instead
                pass
        times["import_triton_kernels_s"] = time.perf_counter() - t0
    if "fa4" in routes:
        t0 = time.perf_counter()
        from ..adapters.fa4 import load_fa4

        load_fa4()
        times["import_fa4_s"] = time.perf_counter() - t0
    if own:
        t0 = time.perf_counter()
        importlib.import_module("cutlass.cute")
        times["import_cute_dsl_s"] = time.perf_counter() - t0
    if device.type == "cuda" and units:
        t0 = time.perf_counter()
        prime_process(device)
        times["prime_process_s"] = time.perf_counter() - t0
    return times


def prime_process(device) -> None:
    """Pay the library's once-per-process costs (the custom op's first dispatch, autograd's first
    graph, lazy imports and torch kernel modules of the metadata path) on a call no model makes:
    fp32, head_dim 32, 64 tokens, through the Triton route, forward and backward. Its Triton
    kernels are their own variant (fp32, d32), so no workload's kernel is warmed by it; they are
    cached like any other. A server can call this at start-up, after the warm-up has run."""
    import torch

    from .. import api

    with route_env("triton", None):
        q, k, v = (torch.randn(1, 1, 64, 32, device=device, dtype=torch.float32, requires_grad=True)
                   for _ in range(3))
        block_map = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)
        sizes = torch.full((1,), 64, dtype=torch.int32, device=device)
        out, _ = api.block_sparse_attn(q, k, v, block_map, sizes)
        out.sum().backward()
        with torch.no_grad():
            api.block_sparse_attn(q, k, v, block_map, sizes)
    _sync(device)


def _make_inputs(w: Workload, device, need_grad: bool):
    import torch

    from ..api import topk_block_map
    from ..tiling import variable_block_sizes

    # Generated on the device: a 720p preset's q/k/v are ~10^8 elements each.
    gen = torch.Generator(device=device).manual_seed(0)
    dtype = torch_dtype(w.dtype)

    def rand():
        return torch.randn(w.shape(), generator=gen, device=device, dtype=dtype)

    q, k, v = rand(), rand(), rand()
    if need_grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    n = w.num_blocks
    scores = torch.rand((w.batch, w.heads, n, n), generator=gen, device=device)
    block_map = topk_block_map(scores, min(w.topk, n))
    if w.grid is not None:
        sizes = variable_block_sizes(w.grid, w.tile, device=device)
    else:
        sizes = torch.full((n,), w.block_size, dtype=torch.int32, device=device)
    return q, k, v, block_map, sizes


def execute_unit(unit: PlanUnit, device, paths: CachePaths, iters: int, seen: set,
                 backend: Optional[str], route: str) -> List[Dict[str, Any]]:
    """Run one unit's first call (timed, with cache evidence per direction) and ``iters`` more
    (the steady state). Returns one result row per direction."""
    import torch

    w = unit.workload
    need_grad = unit.mode == "train"
    rows: List[Dict[str, Any]] = []
    on_cpu = device.type == "cpu"

    def first(direction: str, call: Callable[[], Any]):
        before = _snapshot(paths)
        tri0, fa0, own0 = _triton_jit_count(), _fa4_cache_state(), _own_state()
        _sync(device)
        t0 = time.perf_counter()
        result = call()
        _sync(device)
        secs = time.perf_counter() - t0
        new = _diff(before, _snapshot(paths))
        tri1, fa1, own1 = _triton_jit_count(), _fa4_cache_state(), _own_state()
        tri_delta = None if tri1 is None else tri1 - (tri0 or 0)
        fa_delta = None if fa1 is None else fa1[0] - (fa0[0] if fa0 else 0)
        own_delta = {k: own1[k] - own0[k] for k in own1}
        key = unit.keys[direction]
        status, note = classify(key.route, new, tri_delta, fa_delta, bool(fa1 and fa1[1]), on_cpu, own_delta)
        rows.append({
            "id": unit.row_id(direction), "workload": w.name, "mode": unit.mode, "direction": direction,
            "route": key.route, "variant": key.label, "key": key.digest(), "first_s": secs,
            "cache": status, "note": note, "new_files": sum(n for n, _ in new.values()),
            "new_bytes": sum(b for _, b in new.values()), "repeat_of_key": key.digest() in seen,
            "shape": list(w.shape()), "topk": w.topk,
        })
        seen.add(key.digest())
        return result

    with route_env(route, backend):
        q, k, v, block_map, sizes = _make_inputs(w, device, need_grad)
        call = _entry_call(w, q, k, v, block_map, sizes)
        grad_ctx = contextlib.nullcontext() if need_grad else torch.no_grad()
        with grad_ctx:
            out = first("fwd", call)
        dout = torch.randn_like(out) if need_grad else None
        if need_grad:
            first("bwd", lambda: torch.autograd.backward(out, dout))
        fwd_t, bwd_t = [], []
        for _ in range(max(1, iters)):
            for t in (q, k, v):
                t.grad = None
            with grad_ctx:
                _sync(device)
                t0 = time.perf_counter()
                out = call()
                _sync(device)
                fwd_t.append(time.perf_counter() - t0)
            if need_grad:
                t0 = time.perf_counter()
                torch.autograd.backward(out, dout)
                _sync(device)
                bwd_t.append(time.perf_counter() - t0)
    steady = {"fwd": min(fwd_t), "bwd": min(bwd_t) if bwd_t else None}
    for row in rows:
        row["steady_s"] = steady[row["direction"]]
        row["overhead_s"] = row["first_s"] - row["steady_s"]
    return rows


def _own_key(name: str, arch: str) -> str:
    try:
        return registry_kernel(name, arch).cache_key(arch)[:12]
    except Exception:  # noqa: BLE001 - an untargeted or unbuildable kernel: its row says why
        return "-"


def execute_own(names: Sequence[Tuple[str, str]], paths: CachePaths) -> List[Dict[str, Any]]:
    """Compile (or load) our registry kernels into the AOT cache (no launch: works without a GPU)."""
    cache = CuteKernelCache(paths.own)
    rows = []
    for name, arch in names:
        before = _snapshot(paths)
        t0 = time.perf_counter()
        try:
            _, how = compile_registry_kernel(name, arch, cache)
            err = None
        except Exception as exc:  # noqa: BLE001 - one failed kernel is a failed row, not a crash
            how, err = "error", f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        secs = time.perf_counter() - t0
        new = _diff(before, _snapshot(paths))
        status = {"disk": "hit", "memory": "shared", "compiled": "miss", "error": "error"}[how]
        rows.append({
            "id": f"cute-own/{name}/{arch}", "workload": name, "mode": "compile", "direction": "fwd",
            "route": "cute-own", "variant": f"cute-own {name} {arch}", "key": _own_key(name, arch),
            "first_s": secs, "steady_s": None, "overhead_s": None, "cache": status,
            "note": err or {"hit": "loaded from the fastvideo-cute cache",
                            "miss": "compiled and exported (not launched)",
                            "shared": "compiled earlier in this process"}[status],
            "new_files": sum(n for n, _ in new.values()), "new_bytes": sum(b for _, b in new.values()),
            "repeat_of_key": False,
        })
    return rows
