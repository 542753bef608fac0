"""fastvideo_cute.jit, the one compile path of our CuTe kernels: the key scheme (what changes the
key), the in-process cache, the disk cache across fresh processes (directly and through the
warm-up CLI's --check), and that nothing else in the package calls ``cute.compile``."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fastvideo_cute import _version, jit
from fastvideo_cute.jit import CuteKernelCache

ROOT = Path(__file__).resolve().parents[1]
needs_cute_dsl = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None, reason="needs nvidia-cutlass-dsl")


def _child_env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUTE_DSL_", "FASTVIDEO_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["HOME"] = str(tmp_path)  # nothing may land in the real ~/.cache
    env["TRITON_INTERPRET"] = "1"
    env.update(extra)
    return env


# ---------------------------------------------------------------------------------------------- the key


def test_key_covers_name_arch_and_config():
    k = CuteKernelCache.key
    base = k("block_sparse_fwd128_sm120", "sm_121a", {"mode": "w4r3", "stages": 2})
    assert base == k("block_sparse_fwd128_sm120", "sm_121a", {"stages": 2, "mode": "w4r3"})  # order-free
    assert len(base) == 64 and int(base, 16) >= 0
    assert base != k("block_sparse_fwd128_sm120", "sm_120a", {"mode": "w4r3", "stages": 2})
    assert base != k("block_sparse_fwd128_sm120", "sm_121a", {"mode": "simple_split", "stages": 2})
    assert base != k("block_sparse_fwd128_sm120", "sm_121a", {"mode": "w4r3", "stages": 3})
    assert base != k("block_sparse_fwd128_sm120", "sm_121a", {"mode": "w4r3"})
    assert base != k("block_sparse_fwd64_sm100", "sm_121a", {"mode": "w4r3", "stages": 2})
    assert k("x", "sm_90a", {"n": 1}) != k("x", "sm_90a", {"n": "1"})  # values keyed by repr
    fields = CuteKernelCache.key_fields("x", "sm_90a", {"n": 1})
    assert set(fields) == {"name", "arch", "config", "fastvideo-cute", "sources", "nvidia-cutlass-dsl",
                           "apache-tvm-ffi", "python"}
    assert fields["config"] == {"n": "1"} and fields["fastvideo-cute"] == _version.__version__


def test_key_covers_library_version_and_sources(monkeypatch):
    k = lambda: CuteKernelCache.key("k", "sm_90a", {"a": 1})  # noqa: E731
    base = k()
    monkeypatch.setattr(_version, "__version__", "9.9.9")
    assert k() != base
    from fastvideo_cute import cache_dirs

    assert "fastvideo-cute-9.9.9" in str(cache_dirs.cache_paths("/x").own)
    monkeypatch.undo()
    assert k() == base
    monkeypatch.setattr(jit, "own_sources_fingerprint", lambda: "0" * 64)
    assert k() != base


def test_source_fingerprint_follows_every_kernel_source(tmp_path):
    tree = tmp_path / "cute"
    (tree / "op").mkdir(parents=True)
    (tree / "op" / "kernel.py").write_text("x = 1\n")
    (tree / "notes.txt").write_text("not a source")
    extra = tmp_path / "jit.py"
    extra.write_text("OPTIONS = 'a'\n")
    base = jit.sources_fingerprint([tree], [extra])
    assert base == jit.sources_fingerprint([tree], [extra])
    (tree / "notes.txt").write_text("still not a source")
    assert jit.sources_fingerprint([tree], [extra]) == base
    (tree / "op" / "kernel.py").write_text("x = 2\n")
    edited = jit.sources_fingerprint([tree], [extra])
    assert edited != base
    (tree / "common.py").write_text("")
    assert jit.sources_fingerprint([tree], [extra]) != edited
    extra.write_text("OPTIONS = 'b'\n")
    assert jit.sources_fingerprint([tree], [extra]) not in (base, edited)
    # the package's own fingerprint covers the kernels and the jit module itself
    assert jit.own_sources_fingerprint() == jit.sources_fingerprint(
        [ROOT / "fastvideo_cute" / "kernels" / "cute"], [ROOT / "fastvideo_cute" / "jit.py"])


def test_kernel_objects_key_on_their_config():
    from fastvideo_cute.kernels.cute import block_sparse_bwd64, block_sparse_fwd128

    pytest.importorskip("cutlass")
    a, b = block_sparse_fwd128.kernel("w4r3"), block_sparse_fwd128.kernel("simple_split")
    assert a.cache_key("sm_90a") == CuteKernelCache.key("block_sparse_fwd128_sm120", "sm_90a", {"mode": "w4r3"})
    assert a.cache_key("sm_90a") != b.cache_key("sm_90a") != b.cache_key("sm_121a")
    pre, post = block_sparse_bwd64.stage_kernel("preprocess"), block_sparse_bwd64.stage_kernel("postprocess")
    assert pre.config() == post.config() == {} and pre.cache_key("sm_90a") != post.cache_key("sm_90a")


def test_one_cute_compile_call_site():
    """The package's only ``cute.compile(`` is the jit's (grep over fastvideo_cute/)."""
    sites = []
    for path in sorted((ROOT / "fastvideo_cute").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bcute\.compile\(", line) and not line.lstrip().startswith("#"):
                sites.append(f"{path.relative_to(ROOT)}:{n}")
    assert len(sites) == 1 and sites[0].startswith("fastvideo_cute/jit.py:"), sites


# ---------------------------------------------------------------------------------------------- the cache


@needs_cute_dsl
def test_memory_cache_and_kept_cubin():
    """A second lookup of the same key is served from memory; asking for the cubin compiles again
    only when the object in memory has none (then it is the one kept)."""
    from fastvideo_cute.kernels.cute.block_sparse_bwd64.block_sparse_bwd64_common import BlockSparseBwd64Postprocess

    class Postprocess(BlockSparseBwd64Postprocess):
        name = "test_jit_postprocess"  # a key no other test compiles (the in-process table is shared)

    cache = CuteKernelCache(None)
    fn, how = jit.compile_kernel(Postprocess(), "sm_90a", cache)
    assert how == "compiled" and jit.cubin_of(fn) is None
    again, how = jit.compile_kernel(Postprocess(), "sm_90a", cache)
    assert how == "memory" and again is fn
    kept, how = jit.compile_kernel(Postprocess(), "sm_90a", cache, need_cubin=True)
    assert how == "compiled" and jit.cubin_of(kept)[:4] == b"\x7fELF"
    for need_cubin in (False, True):
        fn, how = jit.compile_kernel(Postprocess(), "sm_90a", cache, need_cubin=need_cubin)
        assert fn is kept and how == "memory"


@needs_cute_dsl
def test_adapters_compile_through_the_jit():
    from fastvideo_cute.adapters import cute_sm100_bwd

    before = dict(CuteKernelCache.stats)
    first = cute_sm100_bwd.compiled_stage("postprocess", "sm_90a")
    second = cute_sm100_bwd.compiled_stage("postprocess", "sm_90a")
    assert second is first
    assert CuteKernelCache.stats["memory"] >= before["memory"] + 1


_ROUND_TRIP = """
import json, sys
from fastvideo_cute import jit
from fastvideo_cute.adapters import cute_sm100_bwd
from fastvideo_cute.kernels.cute import block_sparse_bwd64
kernel = block_sparse_bwd64.stage_kernel("postprocess")
fn, how = jit.compile_kernel(kernel, "sm_90a")
assert fn is cute_sm100_bwd.compiled_stage("postprocess", "sm_90a")  # the adapter's lookup: same entry
print(json.dumps({"how": how, "stats": jit.CuteKernelCache.stats, "key": kernel.cache_key("sm_90a")}))
"""


@needs_cute_dsl
def test_disk_cache_round_trip_in_fresh_processes(tmp_path):
    """With $FASTVIDEO_CUTE_CACHE_DIR set, the first process compiles and exports; a fresh one
    loads the object from disk (no compile), under <root>/fastvideo-cute-<version>/cute."""
    env = _child_env(tmp_path, FASTVIDEO_CUTE_CACHE_DIR=str(tmp_path / "cache"))
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _ROUND_TRIP], capture_output=True, text=True, cwd=tmp_path,
                             env=env, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0]["how"] == "compiled" and runs[1]["how"] == "disk"
    assert runs[1]["stats"]["compiled"] == 0 and runs[0]["key"] == runs[1]["key"]
    (obj,) = (tmp_path / "cache").glob(f"fastvideo-cute-{_version.__version__}/cute/block_sparse_bwd64_postprocess/"
                                       "sm_90a-*.o")
    assert obj.name == f"sm_90a-{runs[0]['key'][:40]}.o" and obj.stat().st_size > 0


@needs_cute_dsl
def test_warmup_cross_compiles_then_check_loads_in_fresh_process(tmp_path):
    """Our CuTe kernel, cross-compiled for sm_90a without a GPU into the version-keyed AOT cache by
    the warm-up CLI; --check's fresh process must load it from disk (a hit), not compile it."""
    report = tmp_path / "own.json"
    cmd = [sys.executable, "-m", "fastvideo_cute.warmup", "--cute-kernel", "block_sparse_fwd128_sm120_simple_split",
           "--arch", "sm_90a", "--cache-dir", str(tmp_path / "cache"), "--json", str(report), "--check",
           "--no-progress"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                         env=_child_env(tmp_path, CUTE_DSL_DUMP_DIR=str(tmp_path)), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(report.read_text())
    assert len(data["rows"]) == 1 and data["rows"][0]["route"] == "cute-own" and data["rows"][0]["cache"] == "miss"
    assert all(r["new_bytes"] > 0 for r in data["rows"])
    assert all(r["cache"] == "hit" for r in data["check"]["rows"])
    objs = list((tmp_path / "cache").glob("fastvideo-cute-*/cute/*/sm_90a-*.o"))
    assert len(objs) == len(data["rows"])
