"""The README's main job (the demo) runs and reports small errors on the available route."""

import re

from fastvideo_cute import demo


def test_demo_runs_and_matches_the_reference(capsys):
    assert demo.main(["--grid", "4", "8", "8", "--heads", "1", "--head-dim", "32", "--topk", "2"]) == 0
    text = capsys.readouterr().out
    assert "route: triton" in text
    errors = [float(x) for x in re.findall(r"= ([0-9.e+-]+)$", text, flags=re.M)]
    assert len(errors) == 5  # forward + dq, dk, dv, dgate
    assert max(errors) < 1e-2  # fp16 on the interpreter (bf16 on GPU); measured ~1e-3
