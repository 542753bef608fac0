"""fastvideo-cute-warmup on CPU: presets, variant enumeration per arch, cache keys, cache plumbing,
the CLI end to end on the Triton route (interpreter), and benchmarks/warmup_latency.py's
bookkeeping. (Our CuTe kernels' compile cache, and the CLI's cross-compile + --check of it:
tests/test_jit.py.) GPU behaviour (FA4 / Triton cache hits, latency)
is what benchmarks/warmup_latency.py measures on the device."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastvideo_cute import tiling, warmup
from fastvideo_cute.routes import route_names
from fastvideo_cute.warmup import Target, VariantKey, Workload
from fastvideo_cute.warmup_presets import PRESETS, get_preset

ROOT = Path(__file__).resolve().parents[1]
ROUTE_VARS = ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND")


def _fa4_ok():
    from fastvideo_cute.adapters.fa4 import fa4_version_problems

    return importlib.util.find_spec("flash_attn") is not None and not fa4_version_problems()


needs_fa4 = pytest.mark.skipif(not _fa4_ok(), reason="the FA4 route's predicate needs flash-attn-4 at its pins")


@pytest.fixture
def clean_route_env(monkeypatch):
    for name in ROUTE_VARS:
        monkeypatch.delenv(name, raising=False)


def _env_for_child(tmp_path):
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    for name in ROUTE_VARS + ("FASTVIDEO_CUTE_CACHE_DIR", "TRITON_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"):
        env.pop(name, None)
    env.pop("CUTE_DSL_KEEP", None)  # no compiler dumps from a developer's environment
    env["CUTE_DSL_DUMP_DIR"] = str(tmp_path)
    env["HOME"] = str(tmp_path)  # nothing may land in the real ~/.cache
    return env


# ---------------------------------------------------------------------------------------------- presets


@pytest.mark.parametrize("name, heads, grid, tokens", [
    ("wan2.1-1.3b-480p", 12, (21, 30, 52), 32760),
    ("wan2.1-14b-480p", 40, (21, 30, 52), 32760),
    ("wan2.1-14b-720p", 40, (21, 45, 80), 75600),
    ("hunyuanvideo-720p", 24, (33, 45, 80), 118800),
])
def test_preset_latent_grids(name, heads, grid, tokens):
    p = get_preset(name)
    assert (p.heads, p.head_dim) == (heads, 128)
    assert p.latent_grid == grid and p.tokens == tokens


def test_preset_sequence_lengths_are_the_padded_tiled_lengths():
    wan13 = get_preset("wan2.1-1.3b-480p")
    assert tiling.tile_counts(wan13.latent_grid, (4, 4, 4)) == (6, 8, 13)
    assert wan13.seq_len(64) == 624 * 64 == 39936
    assert wan13.topk(64) == 63  # ceil(0.1 * 624)
    wan14 = get_preset("wan2.1-14b-720p")
    assert tiling.tile_counts(wan14.latent_grid, (4, 4, 4)) == (6, 12, 20)
    assert wan14.seq_len(64) == 92160
    for p in PRESETS.values():
        for block in (64, 128, 256):
            s = p.seq_len(block)
            assert s % block == 0 and s >= p.tokens
            assert s == tiling.padded_length(p.latent_grid, warmup.tile_for_block(block))
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("wan3")


def test_preset_workloads_use_ragged_tiles():
    (w,) = warmup.preset_workloads("wan2.1-1.3b-480p", [64], None, "bhsd", 1, None)
    assert (w.heads, w.seq_len, w.head_dim, w.block_size, w.dtype, w.entry) == (12, 39936, 128, 64, "bf16", "vsa")
    assert not w.all_full and w.name == "wan2.1-1.3b-480p/vsa/b64/bf16/bhsd"
    sizes = tiling.variable_block_sizes(w.grid, w.tile)
    assert sizes.numel() == w.num_blocks and int(sizes.min()) < 64  # 30 = 7 * 4 + 2: partial tiles


# ---------------------------------------------------------------------------------------------- enumeration


def test_parse_arch():
    for text, want in [("sm_90", (9, 0)), ("sm_90a", (9, 0)), ("90", (9, 0)), ("9.0", (9, 0)), ("sm_100a", (10, 0)),
                       ("sm_120", (12, 0)), ("sm_121a", (12, 1)), ("12.1", (12, 1))]:
        assert warmup.parse_arch(text) == want, text
    with pytest.raises(ValueError):
        warmup.parse_arch("hopper")


def _plan(target, route, blocks=(64, 128, 256), dtype="bf16", head_dim=128, backend=None):
    ws = [Workload("m", 1, 12, 4 * b, head_dim, b, dtype) for b in blocks]
    units = warmup.enumerate_plan(ws, target, ("train", "infer"), route, backend)
    return {(u.workload.block_size, u.mode): u for u in units}


@needs_fa4
def test_plan_sm90_cute(clean_route_env):
    plan = _plan(Target("cuda", (9, 0), False), "cute")
    # FA4's sm_90 backward needs 128-wide kv tiles: a 64-block training call goes to Triton,
    # the 64-block inference forward to FA4.
    assert plan[64, "train"].route == "triton" and "fa4" in plan[64, "train"].note
    assert plan[64, "infer"].route == "fa4"
    for b in (128, 256):
        assert plan[b, "train"].route == plan[b, "infer"].route == "fa4"
        assert set(plan[b, "train"].keys) == {"fwd", "bwd"} and set(plan[b, "infer"].keys) == {"fwd"}
        # the inference forward is the training forward's kernel: one compile serves both
        assert plan[b, "train"].keys["fwd"] == plan[b, "infer"].keys["fwd"]
    assert dict(plan[64, "infer"].keys["fwd"].detail)["tile"] == "64x64"
    assert dict(plan[128, "train"].keys["bwd"].detail)["tile"] == "64x128"  # FA4's sm_90 bwd tile for d128


@needs_fa4
def test_plan_sm100_cute(clean_route_env):
    plan = _plan(Target("cuda", (10, 0), False), "cute")
    assert plan[64, "train"].route == plan[64, "infer"].route == "triton"
    assert plan[128, "train"].route == plan[256, "train"].route == "fa4"
    assert dict(plan[128, "train"].keys["fwd"].detail)["plan"].endswith("/1stage")
    assert not dict(plan[256, "train"].keys["fwd"].detail)["plan"].endswith("/1stage")


@needs_fa4
def test_plan_fp32_and_head_dim_fall_back_or_fail(clean_route_env):
    plan = _plan(Target("cuda", (9, 0), False), "cute", blocks=(128,), dtype="fp32")
    assert plan[128, "train"].route == "triton"  # FA4 takes fp16/bf16 only
    plan = _plan(Target("cuda", (9, 0), False), "cute", blocks=(128,), head_dim=96)
    assert plan[128, "train"].route is None and "head_dim 96" in plan[128, "train"].error
    plan = _plan(Target("cuda", (12, 0), False), "auto", blocks=(128,), backend="fa4")
    assert plan[128, "train"].route is None and "FASTVIDEO_VSA_BACKEND=fa4" in plan[128, "train"].error


def test_plan_sm120_cute_never_fa4(clean_route_env):
    plan = _plan(Target("cuda", (12, 0), False), "cute")
    for unit in plan.values():
        assert unit.route != "fa4"
        if "sm120" not in route_names():
            assert unit.route == "triton"


def _router_knows(*fields):
    import dataclasses

    from fastvideo_cute.routes import CallInfo

    return set(fields) <= {f.name for f in dataclasses.fields(CallInfo)}


@pytest.mark.skipif("sm120" not in route_names() or not _router_knows("need_lse", "kv_all_full"),
                    reason="the sm120 backend is not registered in this tree")
def test_plan_sm121_cute_sm120_serves_vsa_inference_only(clean_route_env):
    spark = Target("cuda", (12, 1), False)
    full = [Workload("m", 1, 12, 4 * b, 128, b, "bf16", entry=e) for b in (128, 256) for e in ("vsa", "bsa")]
    units = {(u.workload.block_size, u.workload.entry, u.mode): u
             for u in warmup.enumerate_plan(full, spark, ("train", "infer"), "cute")}
    for b in (128, 256):
        assert units[b, "vsa", "infer"].route == "sm120"  # no grad, LSE discarded, every block full
        assert units[b, "vsa", "train"].route == "triton"  # no backward
        assert units[b, "bsa", "infer"].route == "triton"  # block_sparse_attn returns the LSE
    # one compiled kernel serves both block sizes (256 runs as 2x2 tiles of 128)
    assert units[128, "vsa", "infer"].keys["fwd"] == units[256, "vsa", "infer"].keys["fwd"]
    # ragged tiles (a real preset grid) go to Triton
    (ragged,) = warmup.preset_workloads("wan2.1-1.3b-480p", [128], None, "bhsd", 1, None)
    assert not ragged.all_full
    (unit,) = warmup.enumerate_plan([ragged], spark, ("infer",), "cute")
    assert unit.route == "triton" and "ragged" in unit.note


def test_plan_triton_and_default_routes(clean_route_env):
    for arch in ((9, 0), (10, 0), (12, 1)):
        for route in ("triton", "auto"):
            plan = _plan(Target("cuda", arch, False), route)
            assert {u.route for u in plan.values()} == {"triton"}
    # CPU tensors: the Triton route under the interpreter (conftest sets TRITON_INTERPRET=1 on CPU boxes)
    if os.environ.get("TRITON_INTERPRET") == "1":
        plan = _plan(Target("cpu", None, True), "cute")
        assert {u.route for u in plan.values()} == {"triton"}
        assert all(k.arch == "cpu" for u in plan.values() for k in u.keys.values())


def test_route_env_restores(monkeypatch):
    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    monkeypatch.delenv("FASTVIDEO_VSA_CUTEDSL", raising=False)
    with warmup.route_env("cute"):
        assert os.environ.get("FASTVIDEO_VSA_CUTEDSL") == "1" and "FASTVIDEO_VSA_TRITON" not in os.environ
    assert os.environ["FASTVIDEO_VSA_TRITON"] == "1" and "FASTVIDEO_VSA_CUTEDSL" not in os.environ
    with warmup.route_env("auto"):
        assert os.environ["FASTVIDEO_VSA_TRITON"] == "1"


def test_own_kernels_policy(clean_route_env):
    from fastvideo_cute.kernels.cute import REGISTRY

    spark = Target("cuda", (12, 1), False)
    names = [spec.name for spec in REGISTRY if "sm_121a" in spec.archs]
    assert warmup.own_kernels_for(spark, "all", "auto") == [(n, "sm_121a") for n in names]
    wanted = warmup.SM120_REGISTRY_NAMES[warmup.sm120_variant(spark.arch)]
    assert warmup.own_kernels_for(spark, "auto", "cute") == [(n, "sm_121a") for n in names if n == wanted]
    assert warmup.own_kernels_for(spark, "none", "cute", [names[0]]) == [(names[0], "sm_121a")]
    with pytest.raises(ValueError, match="no CuTe kernel named"):
        warmup.own_kernels_for(spark, "auto", "cute", ["nope"])
    assert warmup.own_kernels_for(spark, "auto", "triton") == []
    assert warmup.own_kernels_for(spark, "none", "cute") == []
    h200 = Target("cuda", (9, 0), True)
    assert warmup.own_kernels_for(h200, "auto", "cute") == []  # FA4 is the CuTe route there
    assert [a for _, a in warmup.own_kernels_for(h200, "all", "auto")] == ["sm_90a"] * len(
        [s for s in REGISTRY if "sm_90a" in s.archs])
    assert warmup.own_kernels_for(Target("cpu", None, True), "all", "cute") == []


# ---------------------------------------------------------------------------------------------- cache keys


def test_variant_key_digest_is_stable():
    key = VariantKey("fa4", "fwd", "sm_90", "bf16", 128, 128, (("tile", "128x128"), ("plan", "q128/kv128")))
    # sha256 of canonical JSON: the same in every process and on every machine (not hash()).
    assert key.digest() == VariantKey("fa4", "fwd", "sm_90", "bf16", 128, 128,
                                      (("tile", "128x128"), ("plan", "q128/kv128"))).digest()
    # Pinned: a change of the key's format invalidates every warmed cache's bookkeeping, so it
    # must be deliberate (update this value with it).
    assert key.digest() == "d4a95b2acca2"
    out = subprocess.run([sys.executable, "-c",
                          "from fastvideo_cute.warmup import VariantKey as V;"
                          "print(V('fa4','fwd','sm_90','bf16',128,128,(('tile','128x128'),('plan','q128/kv128')))"
                          ".digest())"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "PYTHONHASHSEED": "123"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == key.digest()
    assert VariantKey("fa4", "bwd", "sm_90", "bf16", 128, 128, key.detail).digest() != key.digest()


def test_triton_key_follows_triton_specialization(clean_route_env):
    target = Target("cuda", (9, 0), False)

    def key(heads, seq, layout="bhsd", block=64):
        w = Workload("m", 1, heads, seq, 128, block, "bf16", layout)
        return warmup.variant_key("triton", w, "fwd", target).digest()

    # heads 12 and 40 are the same class (neither 1 nor a multiple of 16): one compiled kernel
    assert key(12, 39936) == key(40, 39936)
    assert key(12, 39936) != key(16, 39936) != key(1, 39936)
    assert key(12, 64 * 624) != key(12, 64 * 625)  # 625 blocks: not a multiple of 16
    assert key(12, 39936, block=64) != key(12, 39936, block=128)


def test_int_class_matches_triton():
    native = pytest.importorskip("triton._C.libtriton").native_specialize_impl
    from triton.backends.compiler import BaseBackend

    for n in (1, 2, 12, 16, 40, 624, 625, 39936, 2 ** 31 - 16, 2 ** 31, 2 ** 33 + 3):
        kind, hint = native(BaseBackend, n, False, True, True)[:2]
        want = "1" if kind == "constexpr" else kind + ("/16" if hint == "D" else "")
        assert warmup._int_class(n) == want, n


def test_sm120_variant_follows_the_target_arch(clean_route_env, monkeypatch):
    """The plan names the variant the sm120 adapter will compile for the target GPU (issue 11,
    item 18): w4r3 on sm_90 (reachable by name), simple_split on sm_12x, the environment overriding
    both; the variant key and the own-kernel list follow."""
    from fastvideo_cute.adapters.cute_sm120 import default_variant

    monkeypatch.delenv("FASTVIDEO_CUTE_SM120_KERNEL", raising=False)
    assert warmup.sm120_variant((9, 0)) == default_variant("sm_90a") == "w4r3"
    assert warmup.sm120_variant((12, 1)) == warmup.sm120_variant((12, 0)) == "simple_split"
    h200, spark = Target("cuda", (9, 0), False), Target("cuda", (12, 1), False)
    w = Workload("m", 1, 12, 4 * 128, 128, 128, "bf16")
    assert dict(warmup.variant_key("sm120", w, "fwd", h200).detail)["kernel"] == "block_sparse_fwd128_sm120_w4r3"
    assert dict(warmup.variant_key("sm120", w, "fwd", spark).detail)["kernel"] == \
        "block_sparse_fwd128_sm120_simple_split"
    assert warmup.own_kernels_for(spark, "auto", "cute") == [("block_sparse_fwd128_sm120_simple_split", "sm_121a")]
    monkeypatch.setenv("FASTVIDEO_CUTE_SM120_KERNEL", "w4r3")
    assert warmup.sm120_variant((12, 1)) == "w4r3"
    assert warmup.own_kernels_for(spark, "auto", "cute") == [("block_sparse_fwd128_sm120_w4r3", "sm_121a")]
    monkeypatch.setenv("FASTVIDEO_CUTE_SM120_KERNEL", "simple")  # removed: an error, not a silent default
    with pytest.raises(ValueError, match="FASTVIDEO_CUTE_SM120_KERNEL"):
        warmup.sm120_variant((12, 1))


@pytest.mark.skipif("sm120" not in route_names(), reason="the sm120 backend is not registered in this tree")
def test_plan_sm90_by_name_keys_the_w4r3_kernel(clean_route_env, monkeypatch):
    monkeypatch.delenv("FASTVIDEO_CUTE_SM120_KERNEL", raising=False)
    w = Workload("m", 1, 12, 4 * 128, 128, 128, "bf16")
    (unit,) = warmup.enumerate_plan([w], Target("cuda", (9, 0), False), ("infer",), "auto", "sm120")
    assert unit.route == "sm120"
    assert dict(unit.keys["fwd"].detail)["kernel"] == "block_sparse_fwd128_sm120_w4r3"


# ---------------------------------------------------------------------------------------------- cache dirs


def test_cache_env_and_configure(tmp_path, monkeypatch):
    for name in ("FASTVIDEO_CUTE_CACHE_DIR", "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED",
                 "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "TRITON_CACHE_DIR", "CUTE_DSL_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    env = warmup.cache_env(tmp_path)
    assert env == {
        "FASTVIDEO_CUTE_CACHE_DIR": str(tmp_path),
        "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1",
        "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(tmp_path / "fa4"),
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "CUTE_DSL_CACHE_DIR": str(tmp_path / "cute-dsl"),
    }
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere")
    paths = warmup.configure_cache(tmp_path, override=False)
    assert os.environ["TRITON_CACHE_DIR"] == "/elsewhere"  # the runtime hook keeps what is set
    assert os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] == str(tmp_path / "fa4")
    warmup.configure_cache(tmp_path)
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "triton")
    assert all(d.is_dir() for d in paths.components().values())
    assert paths.own == tmp_path / f"fastvideo-cute-{warmup.library_version()}" / "cute"
    monkeypatch.setenv("FASTVIDEO_CUTE_CACHE_DIR", str(tmp_path / "r"))
    assert warmup.default_cache_root() == tmp_path / "r"
    assert warmup.configure_cache_from_env().root == tmp_path / "r"


def test_snapshot_diff_and_classify(tmp_path):
    paths = warmup.cache_paths(tmp_path)
    for d in paths.components().values():
        d.mkdir(parents=True, exist_ok=True)
    before = warmup._snapshot(paths)
    (paths.triton / "abc").mkdir()
    (paths.triton / "abc" / "k.cubin").write_bytes(b"x" * 100)
    (paths.fa4 / "h.lock").write_bytes(b"")  # lock files are not cache entries
    new = warmup._diff(before, warmup._snapshot(paths))
    assert new == {"triton": (1, 100)}
    assert warmup.classify("triton", new, 1, None, False, False)[0] == "miss"
    assert warmup.classify("triton", {}, 2, None, False, False)[0] == "hit"
    assert warmup.classify("triton", {}, 0, None, False, False)[0] == "shared"
    assert warmup.classify("fa4", {}, None, 1, True, False)[0] == "hit"
    assert warmup.classify("fa4", {}, None, 1, False, False)[0] == "miss"  # no disk cache behind it
    assert warmup.classify("fa4", {}, None, 0, True, False)[0] == "shared"
    assert warmup.classify("sm120", {}, None, None, False, False, {"compiled": 1})[0] == "miss"
    assert warmup.classify("sm120", {}, None, None, False, False, {"disk": 1, "compiled": 0})[0] == "hit"
    assert warmup.classify("sm120", {}, None, None, False, False, {"memory": 2})[0] == "shared"


def test_verify_failures():
    rows = [{"id": "a", "cache": "hit", "overhead_s": 0.1}, {"id": "b", "cache": "miss", "overhead_s": 3.0},
            {"id": "c", "cache": "n/a", "overhead_s": 1.0}, {"id": "d", "cache": "error", "note": "boom"}]
    assert [f.split(":")[0] for f in warmup.verify_failures(rows, False, None)] == ["b", "d"]
    assert [f.split(":")[0] for f in warmup.verify_failures(rows, True, 0.3)] == ["b", "d"]
    assert [f.split(":")[0] for f in warmup.verify_failures(rows[:1], True, 0.05)] == ["a"]


def test_child_argv():
    argv = ["--shape", "1", "2", "128", "32", "--check", "--json", "x.json", "--no-progress", "--cache-dir", "d"]
    assert warmup._child_argv(argv) == ["--shape", "1", "2", "128", "32", "--cache-dir", "d"]
    assert warmup._child_argv(["--json=x", "--verify-only", "--allow-miss"]) == []


# ---------------------------------------------------------------------------------------------- CLI


def test_cli_list_print_env_and_presets(tmp_path, capsys, clean_route_env):
    assert warmup.main(["--list-presets"]) == 0
    assert "wan2.1-14b-720p" in capsys.readouterr().out
    assert warmup.main(["--print-env", "docker", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"ENV TRITON_CACHE_DIR={tmp_path / 'triton'}" in out and "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1" in out
    assert warmup.main(["--preset", "wan2.1-1.3b-480p", "--block", "all", "--arch", "sm_90", "--route", "triton",
                        "--list", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "plan for sm_90" in out and "wan2.1-1.3b-480p/vsa/b256/bf16/bhsd" in out
    assert "6 distinct route variants over 9 calls" in out
    with pytest.raises(SystemExit):
        warmup.main(["--cache-dir", str(tmp_path)])  # nothing to warm up


def test_cli_end_to_end_triton_interpreter(tmp_path):
    """The console path CI can run: a real fwd + bwd through the Triton route under the interpreter,
    the table, the JSON, and --check in a fresh process. The interpreter compiles nothing, so the
    rows must say n/a (not a made-up hit) and no Triton cache file may appear."""
    report = tmp_path / "warmup.json"
    cache = tmp_path / "cache"
    cmd = [sys.executable, "-m", "fastvideo_cute.warmup", "--shape", "1", "2", "128", "32", "--block", "64",
           "--dtype", "fp32", "--mode", "train", "--iters", "1", "--cache-dir", str(cache), "--json", str(report),
           "--check"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env_for_child(tmp_path), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "compile s" in out.stdout and "check summary: 2 n/a; PASS" in out.stdout
    data = json.loads(report.read_text())
    rows = data["rows"]
    assert [(r["route"], r["direction"], r["cache"]) for r in rows] == [("triton", "fwd", "n/a"),
                                                                      ("triton", "bwd", "n/a")]
    assert all(r["first_s"] > 0 and r["steady_s"] > 0 for r in rows)
    assert data["cache_sizes"]["triton"]["files"] == 0
    assert data["cache_env"]["TRITON_CACHE_DIR"] == str(cache / "triton")
    assert data["check"]["returncode"] == 0 and len(data["check"]["rows"]) == 2


# ---------------------------------------------------------------------------------------------- benchmark script


def _bench():
    path = ROOT / "benchmarks" / "warmup_latency.py"
    spec = importlib.util.spec_from_file_location("warmup_latency_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benchmark_args_and_combine():
    bench = _bench()
    args, rest = bench.parse_args([])
    assert rest == bench.DEFAULT_WARMUP_ARGS and args.target == 0.3
    args, rest = bench.parse_args(["--target", "0.2", "--preset", "wan2.1-14b-720p", "--route", "cute"])
    assert args.target == 0.2 and rest == ["--preset", "wan2.1-14b-720p", "--route", "cute"]
    cold = {"report": {"rows": [{"id": "a", "first_s": 3.2, "cache": "miss"}]}}
    warm = {"report": {"rows": [{"id": "a", "first_s": 0.25, "steady_s": 0.05, "cache": "hit", "variant": "v"},
                                {"id": "b", "first_s": 0.9, "steady_s": 0.1, "cache": "hit"}]}}
    rows = bench.combine(cold, warm, 0.3)
    assert rows[0]["cold_first_s"] == 3.2 and rows[0]["target_ok"] is True
    assert abs(rows[0]["warm_overhead_s"] - 0.2) < 1e-9 and abs(rows[0]["cold_overhead_s"] - 3.15) < 1e-9
    assert rows[1]["target_ok"] is False and rows[1]["cold_first_s"] is None
    assert "NO" in bench.format_rows(rows, 0.3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_benchmark_refuses_cpu():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "warmup_latency.py")], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "needs a CUDA GPU" in out.stderr
