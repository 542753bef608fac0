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
    monkeypatch.setattr(vsa_ops, "_GATED_GROUP_MIN_TILES", 0)
    assert vsa_pipeline.pipelined_groups(q, bshd=False, block=64) == 1  # CPU tensor: never
    monkeypatch.setattr(vsa_ops, "_GATED_HEAD_GROUPS", 1)
    assert vsa_pipeline.pipelined_groups(q, bshd=False, block=64) == 1


class _FakeCuda:
    """Shape and ``is_cuda`` of a CUDA tensor, for the size rule (no GPU here)."""

    is_cuda = True

    def __init__(self, shape):
        self.shape = shape


@pytest.mark.parametrize("shape, bshd, want", [
    ((1, 40, 92160, 128), False, 2),  # Wan-14B 720p: 20 x 1440 = 28,800 tiles per group
    ((1, 92160, 40, 128), True, 2),
    ((1, 12, 39936, 128), False, 1),  # Wan-1.3B 480p: 6 x 624 = 3,744 per group
    ((1, 24, 132096, 128), False, 2),  # 12 x 2064 = 24,768
    ((1, 1, 10**6, 128), False, 1),  # one head
])
def test_pipelined_groups_size_rule(monkeypatch, shape, bshd, want):
    monkeypatch.setattr(vsa_ops, "_GATED_HEAD_GROUPS", 2)
    monkeypatch.setattr(vsa_ops, "_GATED_GROUP_MIN_TILES", 16384)
    assert vsa_pipeline.pipelined_groups(_FakeCuda(shape), bshd, 64) == want


def test_pipelined_groups_steps_down_to_what_the_size_allows(monkeypatch):
    monkeypatch.setattr(vsa_ops, "_GATED_HEAD_GROUPS", 4)
    monkeypatch.setattr(vsa_ops, "_GATED_GROUP_MIN_TILES", 16384)
    # 40 heads x 1440 tiles: 4 groups of 10 heads = 14,400 < 16,384; 3 of 13 = 18,720
    assert vsa_pipeline.pipelined_groups(_FakeCuda((1, 40, 92160, 128)), False, 64) == 3


def test_a_backend_that_does_not_fuse_the_gate_is_refused():
    x = torch.zeros(1, 2, 64, 16)
    sizes = torch.full((1,), 64, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="does not fuse the gate"):
        vsa_pipeline.gated_forward_pipelined(x, x, x, x, sizes, sizes, topk=1, block=64, bshd=False, sm_scale=0.25,
                                             route="triton|triton", groups=2)
