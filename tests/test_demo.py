"""The README's first run, ``python -m fastvideo_cute.demo``: configuration first, progress, a
PASS/FAIL verdict against the stated tolerance, identical numbers for one seed, and bad
arguments as one-line errors (exit 2). Tiny shapes: each run interprets a few programs."""

import re
import subprocess
import sys

import pytest
import torch

from fastvideo_cute import demo

CUDA = torch.cuda.is_available()
# 4x8x8 latent, 4x4x4 tiles: 4 blocks of 64 tokens, all full; 1 head of 32.
TINY = ["--grid", "4", "8", "8", "--heads", "1", "--head-dim", "32", "--topk", "2"]
ERR = re.compile(r"^  (out|dq|dk|dv|dgate)\s+max\|x - ref\| / max\|ref\| = ([0-9.e+-]+)", re.M)


def _run(capsys, argv):
    code = demo.main(argv)
    return code, capsys.readouterr().out


def _without_time(text):
    return [line for line in text.splitlines() if not line.startswith("time:")]


def test_prints_configuration_then_progress_then_pass(capsys):
    code, text = _run(capsys, TINY)
    lines = text.splitlines()
    first_progress = next(i for i, line in enumerate(lines) if line.startswith("[1/3]"))
    config = "\n".join(lines[:first_progress])
    dtype = "bfloat16" if CUDA else "float16"
    assert f"device    {'cuda' if CUDA else 'cpu'}" in config
    assert "route     triton (the default route" in config  # the route, and why
    assert f"[B, H, S, D] = [1, 1, 256, 32] {dtype}" in config
    assert "2 of 4 kv blocks per q block (50.0 % skipped)" in config
    bound, origin = demo.TOLERANCE[dtype]
    assert f"<= {bound:.1e} per tensor" in config and "measured" in config and "headroom" in config
    assert [line[:5] for line in lines if line.startswith("[")] == ["[1/3]", "[2/3]", "[3/3]"]
    errors = dict(ERR.findall(text))
    assert sorted(errors) == ["dgate", "dk", "dq", "dv", "out"]
    assert all(float(e) <= bound for e in errors.values()), errors
    assert code == 0 and lines[-1].startswith("PASS: worst ")


def test_fails_when_the_error_exceeds_the_tolerance(capsys, monkeypatch):
    dtype = "bfloat16" if CUDA else "float16"
    monkeypatch.setitem(demo.TOLERANCE, dtype, (1e-12, "a bound no fp16/bf16 run meets"))
    code, text = _run(capsys, TINY)
    assert code == 1 and text.splitlines()[-1].startswith("FAIL: worst ")


def test_same_seed_same_numbers_other_seed_other_numbers(capsys):
    _, a = _run(capsys, TINY + ["--seed", "3"])
    _, b = _run(capsys, TINY + ["--seed", "3"])
    _, c = _run(capsys, TINY + ["--seed", "4"])
    assert sum(line.startswith("time:") for line in a.splitlines()) == 1
    assert _without_time(a) == _without_time(b)
    assert ERR.findall(a) != ERR.findall(c)


@pytest.mark.parametrize("argv, needle", [
    (["--tile", "3", "3", "3"], "--tile needs 3 positive ints whose product is 64, 128 or 256"),
    (["--tile", "4", "4"], "--tile: expected 3 arguments"),
    (["--grid", "0", "8", "8"], "--grid needs 3 positive ints"),
    (["--heads", "0"], "--heads must be >= 1"),
    (["--head-dim", "48"], "--head-dim must be 32, 64 or 128"),
    (["--topk", "0"], "--topk must be >= 1"),
    (["--topk", "two"], "invalid int value"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--dtype", "float64"], "invalid choice"),
    (["--bogus"], "unrecognized arguments"),
])
def test_bad_arguments_are_one_line_errors(capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        demo.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.count("\n") == 1 and needle in err and err.startswith("python -m fastvideo_cute.demo: error: ")


@pytest.mark.skipif(CUDA, reason="bfloat16 is refused only off CUDA")
def test_bfloat16_is_refused_on_the_interpreter(capsys):
    with pytest.raises(SystemExit) as e:
        demo.main(["--dtype", "bfloat16"])
    assert e.value.code == 2 and "interpreter's bf16 math is wrong" in capsys.readouterr().err


def test_cli_bad_argument_has_no_traceback():
    r = subprocess.run([sys.executable, "-m", "fastvideo_cute.demo", "--tile", "4", "4", "5"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert r.stdout == ""


def _info():
    from fastvideo_cute.routes import call_info

    q = torch.zeros(1, 1, 128, 64, dtype=torch.float16)
    return call_info(q, q, 64, True, False, need_lse=False)


@pytest.mark.parametrize("env, expected", [
    ({}, "the default route for this call; the CuTe route is opt-in with FASTVIDEO_VSA_CUTEDSL=1"),
    ({"FASTVIDEO_VSA_TRITON": "1"}, "forced by FASTVIDEO_VSA_TRITON=1"),
    ({"FASTVIDEO_VSA_BACKEND": "triton"}, "forced by FASTVIDEO_VSA_BACKEND=triton"),
])
def test_route_reason_names_the_variable_that_decided(monkeypatch, env, expected):
    from fastvideo_cute.routes import select_route

    for k in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    info = _info()
    assert demo._why(select_route(info), info) == expected


@pytest.mark.skipif(CUDA, reason="on CPU tensors no CuTe backend serves")
def test_cute_fallback_reason_lists_each_backend_and_restores_the_env(monkeypatch):
    from fastvideo_cute.routes import route_names, select_route

    monkeypatch.delenv("FASTVIDEO_VSA_TRITON", raising=False)
    monkeypatch.delenv("FASTVIDEO_VSA_BACKEND", raising=False)
    monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", "1")
    info = _info()
    why = demo._why(select_route(info), info)
    assert why.startswith("FASTVIDEO_VSA_CUTEDSL=1, but no CuTe backend serves this call, so Triton: ")
    assert "fa4: FA4 needs CUDA tensors" in why
    for name in route_names():
        assert name == "triton" or f"{name}: " in why
    import os

    assert os.environ["FASTVIDEO_VSA_CUTEDSL"] == "1" and "FASTVIDEO_VSA_BACKEND" not in os.environ
