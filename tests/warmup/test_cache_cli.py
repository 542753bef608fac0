"""Cache plumbing (roots, environment, snapshots) and the CLI end to end on the Triton route (interpreter)."""

import json
import os
import subprocess
import sys

import pytest

from fastvideo_cute import warmup

from ._helpers import ROOT, env_for_child


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
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env_for_child(tmp_path), timeout=300)
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
