"""128/256-token q2k lists as 64-token tile lists (``kernels/triton/tile_lists.py`` and
``metadata.split_q2k``'s torch path) against a naive per-row Python loop: counts, the kept tiles
in order, tile sizes; ragged sizes incl. empty blocks, a tail past ``seqlen_k``, rows with no
entry, counts outside [0, W] (clamped like the kernel's), entries past the count holding garbage.
On CPU the Triton kernel runs under TRITON_INTERPRET=1 (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from fastvideo_cute.kernels.triton.tile_lists import split_q2k_launch  # noqa: E402
from fastvideo_cute.metadata import _split_q2k_torch, map_to_index, split_q2k  # noqa: E402


def _case(b, h, qb, kvb, ratio, seed, ragged=True):
    gen = torch.Generator().manual_seed(seed)
    m = torch.rand(b, h, qb, kvb, generator=gen) < 0.5
    m[..., 0, :] = False  # a row with no entry
    idx, num = map_to_index(m)
    w = max(kvb // 2, 1)  # lists narrower than KVb, as top-k lists are
    num = num.clamp(max=w)
    idx = idx[..., :w].contiguous()
    idx = torch.where(torch.arange(w) < num[..., None], idx, torch.full_like(idx, 10**6))  # garbage past num
    num[0, 0, 1] = -3  # clamped to 0
    if qb > 2:
        num[-1, -1, 2] = w + 5  # clamped to w
    block = ratio * 64
    sizes = None
    if ragged:
        sizes = torch.full((kvb,), block, dtype=torch.int32)
        sizes[1] = 0
        sizes[2] = 1
        sizes[3] = 64  # exactly one full tile
        sizes[4] = 65
        sizes[-1] = block - 3
    seqlen_k = kvb * block - 100  # the last block also ends at seqlen_k
    return idx.to(torch.int32).contiguous(), num.to(torch.int32).contiguous(), sizes, seqlen_k


def _naive(idx, num, sizes, ratio, seqlen_k):
    b, h, qb, w = idx.shape
    rows, counts = {}, {}
    for bi in range(b):
        for hi in range(h):
            for t in range(qb):
                kept = []
                for j in range(max(0, min(int(num[bi, hi, t]), w))):
                    n = int(idx[bi, hi, t, j])
                    size = min(seqlen_k - n * ratio * 64, ratio * 64)
                    if sizes is not None:
                        size = min(size, int(sizes[n]))
                    kept += [n * ratio + f for f in range(ratio) if size - 64 * f > 0]
                for e in range(ratio):
                    rows[bi, hi, t * ratio + e] = kept
    return rows


def _check(got_idx, got_num, got_sizes, idx, num, sizes, ratio, seqlen_k):
    b, h, qb, w = idx.shape
    assert got_idx.shape == (b, h, qb * ratio, w * ratio) and got_num.shape == (b, h, qb * ratio)
    want = _naive(idx, num, sizes, ratio, seqlen_k)
    for key, kept in want.items():
        assert int(got_num[key]) == len(kept), key
        assert got_idx[key][: len(kept)].tolist() == kept, key
    if sizes is None:
        assert got_sizes is None
    else:
        want_sizes = [max(0, min(int(s) - 64 * f, 64)) for s in sizes for f in range(ratio)]
        assert got_sizes.tolist() == want_sizes


@pytest.mark.parametrize("ratio", [2, 4])
@pytest.mark.parametrize("ragged", [True, False])
def test_torch_path_matches_naive(ratio, ragged):
    idx, num, sizes, seqlen_k = _case(2, 3, 5, 9, ratio, seed=ratio, ragged=ragged)
    _check(*_split_q2k_torch(idx, num, sizes, ratio, seqlen_k), idx, num, sizes, ratio, seqlen_k)


@pytest.mark.parametrize("ratio", [2, 4])
@pytest.mark.parametrize("ragged", [True, False])
def test_triton_kernel_matches_naive(ratio, ragged):
    idx, num, sizes, seqlen_k = _case(2, 3, 5, 9, ratio, seed=10 + ratio, ragged=ragged)
    b, h, qb, w = idx.shape
    out_idx = torch.full((b, h, qb * ratio, w * ratio), -7, dtype=torch.int32)
    out_num = torch.full((b, h, qb * ratio), -7, dtype=torch.int32)
    out_sizes = None if sizes is None else torch.full((sizes.numel() * ratio,), -7, dtype=torch.int32)
    split_q2k_launch(idx, num, sizes, out_idx, out_num, out_sizes, ratio=ratio, seqlen_k=seqlen_k)
    _check(out_idx, out_num, out_sizes, idx, num, sizes, ratio, seqlen_k)


def test_more_tile_sizes_than_list_entries():
    """One q block, many kv blocks: the extra programs write the tile sizes only."""
    ratio, kvb = 2, 200
    idx = torch.tensor([[[[3, 150]]]], dtype=torch.int32)
    num = torch.tensor([[[2]]], dtype=torch.int32)
    sizes = torch.randint(0, 129, (kvb,), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    out_idx = torch.full((1, 1, 2, 4), -7, dtype=torch.int32)
    out_num = torch.full((1, 1, 2), -7, dtype=torch.int32)
    out_sizes = torch.full((kvb * ratio,), -7, dtype=torch.int32)
    split_q2k_launch(idx, num, sizes, out_idx, out_num, out_sizes, ratio=ratio, seqlen_k=kvb * 128)
    _check(out_idx, out_num, out_sizes, idx, num, sizes, ratio, kvb * 128)


def test_bad_ratio_is_refused():
    idx, num, sizes, seqlen_k = _case(1, 1, 2, 4, 2, seed=0, ragged=False)
    with pytest.raises(ValueError, match="ratio must be 2 or 4"):
        split_q2k(idx, num, sizes, 3, seqlen_k)
