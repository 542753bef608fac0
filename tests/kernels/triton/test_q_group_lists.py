"""kernels/triton/q_group_lists against a plain Python model of the partition and against the
torch ops it replaced (adapters/cute_sm90_bwd64_ws._group_lists_torch), under TRITON_INTERPRET=1
on CPU: 2-6 groups, ragged counts (0, the full width, past the width: clamped), unsorted rows
(the caller's order kept inside a group), entries out of range (below 0: group 0; past the last
group: the last), rows all in one group, a width that is not a power of two, 60 groups of one
block (up to ``MAX_GROUPS``; more are refused, and the adapter keeps the torch ops for them), rows in
one chunk and in several. On a GPU the
Hopper backward's grouped chain runs it (tests/kernels/cute/test_block_sparse_bwd64_sm90_ws_gpu.py)."""

import pytest
import torch

pytest.importorskip("triton")

from fastvideo_cute.adapters.cute_sm90_bwd64_ws import _group_lists_torch  # noqa: E402
from fastvideo_cute.kernels.triton.q_group_lists import q_group_lists  # noqa: E402


def _lists(rows, nb, w, seed):
    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(nb, generator=g)[:w] for _ in range(rows)]).to(torch.int32)
    num = torch.randint(0, w + 1, (rows,), generator=g, dtype=torch.int32)
    idx[0] = torch.arange(w, dtype=torch.int32)  # all in the first group(s)
    idx[1] = torch.arange(nb - w, nb, dtype=torch.int32)  # all in the last
    idx[2, 0], idx[2, 1] = -3, nb + 5  # out of range: clamped into the first / last group
    num[0], num[1], num[2] = w, w, w
    num[3] = w + 4  # past the width: clamped
    num[4] = 0
    return idx, num


def _model(idx, num, group, groups):
    w = idx.shape[1]
    rows, bounds = [], []
    for r in range(idx.shape[0]):
        n = max(0, min(int(num[r]), w))
        ent = idx[r, :n].tolist()
        grp = [min(max(q // group if q >= 0 else 0, 0), groups - 1) for q in ent]
        parts = [[q for q, gq in zip(ent, grp) if gq == g] for g in range(groups)]
        rows.append(sum(parts, []))
        b = [0]
        for p in parts:
            b.append(b[-1] + len(p))
        bounds.append(b)
    return rows, bounds


@pytest.mark.parametrize("chunk", [4, 128], ids=["chunks", "one_chunk"])
@pytest.mark.parametrize("nb, w, group", [(40, 12, 9), (37, 9, 13), (64, 33, 11), (30, 30, 10), (60, 20, 1)],
                         ids=["five", "three", "six", "full", "sixty"])
def test_matches_the_model_and_the_torch_ops(nb, w, group, chunk):
    idx, num = _lists(13, nb, w, seed=nb + w)
    groups = -(-nb // group)
    out = torch.full_like(idx, -7)
    gb = torch.full((13, groups + 1), -7, dtype=torch.int32)
    q_group_lists(idx, num, group, groups, out, gb, chunk=chunk)
    rows, bounds = _model(idx, num, group, groups)
    t_out, t_gb = _group_lists_torch(idx, num, group, groups)
    assert gb.tolist() == bounds and t_gb.tolist() == bounds
    for r in range(13):
        n = bounds[r][-1]
        assert out[r, :n].tolist() == rows[r] and t_out[r, :n].tolist() == rows[r], r


def test_bad_arguments_are_refused():
    idx = torch.zeros(4, 8, dtype=torch.int32)
    num = torch.zeros(4, dtype=torch.int32)
    gb = torch.empty(4, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="group must be"):
        q_group_lists(idx, num, 0, 2, torch.empty_like(idx), gb)
    with pytest.raises(ValueError, match="groups in"):
        q_group_lists(idx, num, 1, 65, torch.empty_like(idx), torch.empty(4, 66, dtype=torch.int32))
    with pytest.raises(ValueError, match="power of two"):
        q_group_lists(idx, num, 4, 2, torch.empty_like(idx), gb, chunk=6)
    with pytest.raises(ValueError, match="expected out"):
        q_group_lists(idx, num, 4, 3, torch.empty_like(idx), gb)
    with pytest.raises(ValueError, match="must not be idx"):
        q_group_lists(idx, num, 4, 2, idx, gb)
