"""CPU checks of the sm90 forward's kv split (``adapters/cute_sm90_fwd64``): the list cutting
against a brute-force cut, the automatic rule on the H200's numbers, and bad ``kv_splits``
refused before anything is compiled. Whether the split forward is *correct* is checked on the
H200: tests/kernels/cute/test_block_sparse_fwd64_sm90_kvsplit_gpu.py."""

import pytest
import torch

from fastvideo_cute.adapters import cute_sm90_fwd64 as A


def _lists(seed, b=2, h=3, qb=5, kvb=23, w=9):
    g = torch.Generator().manual_seed(seed)
    num = torch.randint(0, w + 1, (b, h, qb), generator=g, dtype=torch.int32)
    idx = torch.full((b, h, qb, w), 999, dtype=torch.int32)  # past the count: junk, never read
    for i in range(b):
        for j in range(h):
            for r in range(qb):
                n = int(num[i, j, r])
                idx[i, j, r, :n] = torch.randperm(kvb, generator=g)[:n].sort().values.to(torch.int32)
    return idx, num


@pytest.mark.parametrize("splits", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", [0, 1])
def test_split_lists_cut_each_row_by_kv_range(splits, seed):
    kvb = 23
    idx, num = _lists(seed, kvb=kvb)
    parts = A.split_lists_by_kv_range(idx, num, kvb, splits)
    assert len(parts) == splits
    bounds = [-(-s * kvb // splits) for s in range(splits + 1)]
    for s, (pi, pn) in enumerate(parts):
        assert pi.dtype == torch.int32 and pn.dtype == torch.int32 and pi.shape == idx.shape
        for key in torch.cartesian_prod(*(torch.arange(n) for n in num.shape)).tolist():
            row = idx[tuple(key)][: int(num[tuple(key)])].tolist()
            want = [x for x in row if bounds[s] <= x < bounds[s + 1]]
            got = pi[tuple(key)][: int(pn[tuple(key)])].tolist()
            assert got == want, (s, key)
    assert torch.equal(sum(pn for _, pn in parts), num)


def test_auto_splits_follow_the_l2_rule(monkeypatch):
    monkeypatch.setattr(A, "_props", lambda index: (60 * 2 ** 20, 132))  # the H200 as the driver reports it
    cuda = torch.device("cuda", 0)
    # Wan2.1-14B 720p: 92,160 tokens, 45 MiB of K/V per head > 0.6 of 60 MiB -> 2 ranges of 0.375
    assert A.auto_kv_splits(cuda, 92160, 92160, 128, 2, 180) == 2
    # HunyuanVideo 720p: 138,240 tokens, 67.5 MiB per head -> 3 ranges of 0.375 of the L2 (2 would be 0.56)
    assert A.auto_kv_splits(cuda, 138240, 138240, 128, 2, 270) == 3
    # 0.4 of the L2 per range at most: 96 MiB -> 4; beyond that the cap (4)
    assert A.auto_kv_splits(cuda, 196608, 196608, 128, 2, 256) == 4
    assert A.auto_kv_splits(cuda, 196608 + 64, 196608 + 64, 128, 2, 256) == 4
    assert A.auto_kv_splits(cuda, 4 * 196608, 4 * 196608, 128, 2, 256) == 4
    # just past the trigger (0.6 of the L2) -> 2
    assert A.auto_kv_splits(cuda, 73792, 73792, 128, 2, 128) == 2
    # 65,536 tokens: 32 MiB per head -> 1; narrow lists -> 1; few query tiles per head -> 1; CPU -> 1
    assert A.auto_kv_splits(cuda, 65536, 65536, 128, 2, 128) == 1
    assert A.auto_kv_splits(cuda, 92160, 92160, 128, 2, 16) == 1
    assert A.auto_kv_splits(cuda, 64 * 300, 92160, 128, 2, 180) == 1
    assert A.auto_kv_splits(torch.device("cpu"), 92160, 92160, 128, 2, 180) == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_bad_kv_splits_is_refused_before_any_compile(bad):
    q = torch.zeros(1, 2, 128, 128, dtype=torch.bfloat16)
    idx = torch.zeros(1, 2, 2, 1, dtype=torch.int32)
    num = torch.ones(1, 2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="kv_splits"):
        A.sm90_fwd64(q, q, q, idx, num, None, bshd=False, kv_splits=bad)
