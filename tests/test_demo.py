"""The README's main job (the demo) runs and reports small errors on the available route."""

import re

import torch

from fastvideo_cute import demo

# CPU: fp16 on the Triton interpreter, measured max abs error ~1e-3 -> bound 1e-2. GPU: bf16
# (unit roundoff 3.9e-3, values and gradients of magnitude up to ~4 here) -> bound 4e-2.
BOUND = 4e-2 if torch.cuda.is_available() else 1e-2


def test_demo_runs_and_matches_the_reference(capsys):
    assert demo.main(["--grid", "4", "8", "8", "--heads", "1", "--head-dim", "32", "--topk", "2"]) == 0
    text = capsys.readouterr().out
    assert "route: triton" in text
    errors = [float(x) for x in re.findall(r"= ([0-9.e+-]+)$", text, flags=re.M)]
    assert len(errors) == 5  # forward + dq, dk, dv, dgate
    assert max(errors) < BOUND
