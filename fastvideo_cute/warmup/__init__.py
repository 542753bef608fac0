"""JIT warm-up: compile every kernel variant a model will hit once, into a persistent cache.

    fastvideo-cute-warmup --preset wan2.1-1.3b-480p --route cute --cache-dir /opt/fvc-cache --check
    python -m fastvideo_cute.warmup --shape 1 2 256 32 --block 64 --dtype fp32      # CPU (interpreter)
    fastvideo-cute-warmup --preset wan2.1-14b-720p --arch sm_100 --list              # plan only, any box
    fastvideo-cute-warmup --cute-kernels all --arch sm_121a                          # cross-compile ours
    fastvideo-cute-warmup --print-env docker --cache-dir /opt/fvc-cache              # ENV lines

What it does:

1. Points all three JIT caches at one root (``--cache-dir``, else ``$FASTVIDEO_CUTE_CACHE_DIR``,
   else ``~/.cache/fastvideo-cute``): FA4's disk cache (``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``,
   ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=<root>/fa4``), Triton's (``TRITON_CACHE_DIR=<root>/triton``),
   the CuTe DSL's (``CUTE_DSL_CACHE_DIR=<root>/cute-dsl``) and our own CuTe kernels' AOT cache
   (``<root>/fastvideo-cute-<version>/cute``, see :class:`CuteKernelCache`).
2. Enumerates the variants: for every workload (a model preset at a block size, or an explicit
   ``--shape``), dtype and mode (``train``: forward + backward with grad; ``infer``: forward
   without), which route serves it on the target GPU, decided by the routes' own support
   predicates (:func:`fastvideo_cute.routes.select_route` on a synthetic ``CallInfo``), and the
   static facts each route compiles on (:class:`VariantKey`).
3. Runs each workload once through the public API (forward, then backward), which JIT-compiles
   into the caches, times the first call against the steady state, and prints one table row per
   (workload, mode, direction): route, seconds, cache hit/miss, bytes written.
4. ``--check`` starts a fresh ``python -m fastvideo_cute.warmup --verify-only`` process with the
   same arguments, which runs everything again and reports, per variant, whether it loaded from
   the cache (no compile, no new cache file) or had to compile (a miss: exit status 1).

The app must see the same cache: set the variables of ``--print-env`` in its environment (or call
:func:`configure_cache_from_env` before the first CuTe/Triton call). FA4 reads its two variables
when ``flash_attn.cute`` is imported, so they must be set before that.

The code lives in small modules: ``cache`` (cache-dir snapshots, :func:`compile_registry_kernel`),
``variants`` (targets, workloads, variant keys), ``plan`` (the route per variant, workloads from
presets and shapes), ``run`` (first call vs steady state, cache evidence), ``report`` (console and
JSON output) and ``cli`` (arguments, ``main``, ``--check``); the cache roots and their environment
are :mod:`fastvideo_cute.cache_dirs`, our kernels' compile cache :mod:`fastvideo_cute.jit`. Their
names are re-exported here, so ``fastvideo_cute.warmup.<name>`` works as it did; patch a function
in the module that looks it up.
"""

from __future__ import annotations

from ..warmup_presets import PRESETS, get_preset, tile_for_block
from .cache import (CACHE_ROOT_ENV, CUTE_DSL_CACHE_DIR_ENV, FA4_CACHE_DIR_ENV, FA4_CACHE_ENABLED_ENV,
                    TRITON_CACHE_DIR_ENV, CachePaths, CuteKernelCache, _diff, _dist_version, _fa4_cache_problem,
                    _preload_cute_runtime, _scan, _snapshot, cache_env, cache_paths, cache_sizes,
                    compile_registry_kernel, configure_cache, configure_cache_from_env, cute_kernel_cache,
                    default_cache_root, library_version, own_sources_fingerprint, registry_kernel)
from .cli import (_DTYPES, _child_argv, _dtype_list, _flatten, _int_list, build_parser, build_workloads, main,
                  resolve_target, run_check, verify_failures)
from .plan import (_MODES, _quiet_route_log, enumerate_plan, own_kernels_for, preset_workloads, route_env,
                   shape_workloads, synthetic_call_info)
from .report import (_ROUTE_ENV_VARS, Progress, _environment, _fmt_bytes, _fmt_s, format_plan, format_sizes,
                     format_table)
from .run import (_entry_call, _fa4_cache_state, _interpreting, _make_inputs, _own_state, _sync,
                  _triton_jit_count, classify, execute_own, execute_unit, prepare_process)
from ..backends._triton_keys import int_class as _int_class
from .variants import (_TORCH_DTYPES, SM120_REGISTRY_NAMES, PlanUnit, Target, VariantKey, Workload, arch_str,
                       cute_arch_str, parse_arch, sm120_variant, torch_dtype, variant_key)

__all__ = [
    "CACHE_ROOT_ENV",
    "CachePaths",
    "default_cache_root",
    "cache_paths",
    "cache_env",
    "configure_cache",
    "configure_cache_from_env",
    "CuteKernelCache",
    "cute_kernel_cache",
    "compile_registry_kernel",
    "Target",
    "Workload",
    "VariantKey",
    "PlanUnit",
    "parse_arch",
    "route_env",
    "enumerate_plan",
    "own_kernels_for",
    "main",
]
