"""CPU checks of ``vsa_pipeline`` (head groups of the gated inference forward): how heads are split,
when a call is pipelined, and the refusal of a backend that does not fuse the gate. Whether the
pipelined call equals the unsplit one (bitwise), under a CUDA graph too, is checked on the H200:
tests/test_vsa_sm90_gated_gpu.py."""

import pytest
import torch

from fastvideo_cute import vsa_ops, vsa_pipeline


@pytest.mark.parametrize("heads, groups, want", [
    (12, 2, [(0, 6), (6, 12)]),
    (4, 3, [(0, 2), (2, 3), (3, 4)]),
    (40, 3, [(0, 14), (14, 27), (27, 40)]),
    (3, 8, [(0, 1), (1, 2), (2, 3)]),  # no more groups than heads
    (5, 1, [(0, 5)]),
    (5, 0, [(0, 5)]),
])
def test_head_groups_cover_every_head_once(heads, groups, want):
    got = vsa_pipeline.head_groups(heads, groups)
    assert got == want
    assert [h for a, b in got for h in range(a, b)] == list(range(heads))


def test_head_groups_refuse_no_heads():
    with pytest.raises(ValueError, match="heads"):
        vsa_pipeline.head_groups(0, 2)


def test_pipelined_groups_only_on_cuda_with_the_setting(monkeypatch):
    q = torch.zeros(1, 4, 64, 16)
    monkeypatch.setattr(vsa_ops, "_GATED_HEAD_GROUPS", 2)
    assert vsa_pipeline.pipelined_groups(q, bshd=False) == 1  # CPU tensor: never
    monkeypatch.setattr(vsa_ops, "_GATED_HEAD_GROUPS", 1)
    assert vsa_pipeline.pipelined_groups(q, bshd=False) == 1


def test_a_backend_that_does_not_fuse_the_gate_is_refused():
    x = torch.zeros(1, 2, 64, 16)
    sizes = torch.full((1,), 64, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="does not fuse the gate"):
        vsa_pipeline.gated_forward_pipelined(x, x, x, x, sizes, sizes, topk=1, block=64, bshd=False, sm_scale=0.25,
                                             route="triton|triton", groups=2)
