"""kernels/triton/kv_range_lists against the torch reference in adapters/cute_sm90_fwd64 (the
lists of every range, compared up to each row's count; slots past a count are never read), under
TRITON_INTERPRET=1 on CPU: 2-4 ranges, ragged counts (0, full width, past the width: clamped),
uneven ranges (KVb not a multiple of the split count), rows whose entries all fall in one range,
and a width that is not a power of two. On a GPU the adapter runs it for every kv-split forward
(tests/kernels/cute/test_block_sparse_fwd64_sm90_kvsplit_gpu.py)."""

import pytest
import torch

pytest.importorskip("triton")

from fastvideo_cute.adapters.cute_sm90_fwd64 import _split_lists_torch  # noqa: E402
from fastvideo_cute.kernels.triton.kv_range_lists import kv_range_lists  # noqa: E402


def _lists(B, H, Qb, kvb, w, seed):
    g = torch.Generator().manual_seed(seed)
    idx = torch.zeros(B, H, Qb, w, dtype=torch.int32)
    num = torch.randint(0, w + 1, (B, H, Qb), generator=g, dtype=torch.int32)
    for key in torch.cartesian_prod(*(torch.arange(n) for n in (B, H, Qb))).tolist():
        row = torch.randperm(kvb, generator=g)[:w].sort().values
        idx[tuple(key)] = row.to(torch.int32)
    idx[0, 0, 0] = torch.arange(w, dtype=torch.int32)  # every entry in the first range(s)
    idx[0, 0, 1] = torch.arange(kvb - w, kvb, dtype=torch.int32)  # every entry in the last
    num[0, 0, 0], num[0, 0, 1] = w, w
    num[0, -1, -1] = w + 5  # past the width: clamped to it
    num[-1, 0, 0] = 0
    return idx, num


@pytest.mark.parametrize("splits", [2, 3, 4])
@pytest.mark.parametrize("kvb, w", [(40, 12), (37, 9), (64, 33)], ids=["even", "uneven", "wide"])
def test_matches_the_torch_reference(splits, kvb, w):
    B, H, Qb = 2, 3, 5
    idx, num = _lists(B, H, Qb, kvb, w, seed=splits * 100 + kvb)
    want = _split_lists_torch(idx, num, kvb, splits)
    out = torch.full((splits - 1, B, H, Qb, w), -7, dtype=torch.int32)
    cnt = torch.full((splits, B, H, Qb), -7, dtype=torch.int32)
    kv_range_lists(idx.view(-1, w), num.view(-1), kvb, splits, out.view(splits - 1, -1, w), cnt.view(splits, -1))
    got = [(idx, cnt[0])] + [(out[s - 1], cnt[s]) for s in range(1, splits)]
    for s, ((gi, gn), (wi, wn)) in enumerate(zip(got, want)):
        assert torch.equal(gn, wn), s
        for key in torch.cartesian_prod(*(torch.arange(n) for n in (B, H, Qb))).tolist():
            n = int(wn[tuple(key)])
            assert torch.equal(gi[tuple(key)][:n], wi[tuple(key)][:n]), (s, key)
    assert torch.equal(sum(c for _, c in got), num.clamp(0, w))


def test_bad_arguments_are_refused():
    idx = torch.zeros(4, 8, dtype=torch.int32)
    num = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(ValueError, match="splits"):
        kv_range_lists(idx, num, 16, 1, torch.empty(0, 4, 8, dtype=torch.int32), torch.empty(1, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="expected out"):
        kv_range_lists(idx, num, 16, 2, torch.empty(2, 4, 8, dtype=torch.int32), torch.empty(2, 4, dtype=torch.int32))
