"""cuDNN BSA metadata (``adapters/cudnn_bsa_metadata.py``) on CPU, against brute-force constructions.

The brute force works at token level from the logical map and sizes (``reference.block_token_mask``
semantics): the token mask the cuDNN metadata describes (physical lists + physical sizes, read the
way cuDNN reads them: the first ``num`` ids of a row, keys ``< block_sizes[j]`` of block j) must be
the logical one exactly, and every row must be ascending, unique and padded with valid ids.
"""

from __future__ import annotations

import pytest
import torch

from fastvideo_cute.adapters.cudnn_bsa_metadata import (CudnnBlockSparseMeta, build_cudnn_metadata,
                                                        cudnn_lse_to_contract, expand_q2k_lists)
from fastvideo_cute.metadata import map_to_index
from fastvideo_cute.reference import block_token_mask


def _case(b, h, qb, kvb, block, seed, empty_rows=True):
    g = torch.Generator().manual_seed(seed)
    block_map = torch.rand(b, h, qb, kvb, generator=g) < 0.4
    if empty_rows:
        block_map[0, 0, 0] = False  # a row selecting nothing
    block_map[-1, -1, -1] = True  # a row selecting everything
    sizes = torch.randint(0, block + 1, (kvb,), generator=g, dtype=torch.int32)
    sizes[0] = block
    if kvb > 2:
        sizes[1] = 0
        sizes[2] = 1
    return block_map, sizes


def _token_mask_from_meta(meta: CudnnBlockSparseMeta, q_len: int, kv_len: int) -> torch.Tensor:
    """[B, H, Sq, Skv] bool: what cuDNN computes from its metadata, built entry by entry."""
    idx, num, sizes, tile = meta.q2k_block_index, meta.q2k_block_nums, meta.block_sizes, meta.sparse_block
    b, h, qb, _ = idx.shape
    kvb = kv_len // tile
    if sizes is None:
        sizes = torch.full((kvb,), tile, dtype=torch.int32)
    mask = torch.zeros(b, h, q_len, kv_len, dtype=torch.bool)
    for bi in range(b):
        for hi in range(h):
            for i in range(qb):
                for slot in range(int(num[bi, hi, i])):
                    j = int(idx[bi, hi, i, slot])
                    valid = int(sizes[j])
                    mask[bi, hi, i * tile:(i + 1) * tile, j * tile:j * tile + valid] = True
    return mask


def _check_rows(meta: CudnnBlockSparseMeta, kvb_phys: int):
    idx, num = meta.q2k_block_index, meta.q2k_block_nums
    assert idx.dtype == torch.int32 and num.dtype == torch.int32
    assert idx.is_contiguous() and num.is_contiguous()
    rows = idx.reshape(-1, idx.shape[-1])
    for row, n in zip(rows, num.reshape(-1)):
        n = int(n)
        head = row[:n]
        assert torch.all(head[1:] > head[:-1]), "selected ids must be ascending and unique"
        # the whole row is a permutation of valid ids: even a reader ignoring num stays in range
        assert torch.equal(row.sort().values, torch.arange(kvb_phys, dtype=torch.int32))


@pytest.mark.parametrize("block", [64, 128, 256])
@pytest.mark.parametrize("all_full", [False, True])
def test_metadata_describes_the_logical_token_mask(block, all_full):
    b, h, qb, kvb = 2, 3, 3, 5
    block_map, sizes = _case(b, h, qb, kvb, block, seed=block + int(all_full))
    if all_full:
        sizes = torch.full((kvb,), block, dtype=torch.int32)
    q2k_idx, q2k_num = map_to_index(block_map)
    meta = build_cudnn_metadata(q2k_idx, q2k_num, sizes, block_size=block, batch=b, heads=h, q_len=qb * block,
                                kv_len=kvb * block, all_full=all_full)
    tile = 128 if block == 256 else block
    factor = block // tile
    assert meta.sparse_block == tile
    assert tuple(meta.q2k_block_index.shape) == (b, h, qb * factor, kvb * factor)
    assert tuple(meta.q2k_block_nums.shape) == (b, h, qb * factor)
    if all_full:
        assert meta.block_sizes is None
    else:
        assert meta.block_sizes.dtype == torch.int32 and tuple(meta.block_sizes.shape) == (kvb * factor,)
    _check_rows(meta, kvb * factor)
    want = block_token_mask(block_map, sizes, block, block)
    got = _token_mask_from_meta(meta, qb * block, kvb * block)
    assert torch.equal(got, want)


def test_256_split_sizes_keep_valid_tokens_leading():
    sizes = torch.tensor([256, 0, 1, 128, 129, 200], dtype=torch.int32)
    block_map = torch.ones(1, 1, 1, 6, dtype=torch.bool)
    idx, num = map_to_index(block_map)
    meta = build_cudnn_metadata(idx, num, sizes, block_size=256, batch=1, heads=1, q_len=256, kv_len=6 * 256,
                                all_full=False)
    assert meta.block_sizes.tolist() == [128, 128, 0, 0, 1, 0, 128, 0, 128, 1, 128, 72]


def test_expand_q2k_lists_brute_force():
    """Physical row f*i + r lists f*j + t for every logical j of row i, in (j, t) order; num * f."""
    block_map, _ = _case(2, 2, 4, 6, 256, seed=3)
    idx, num = map_to_index(block_map)
    for factor in (1, 2, 3):
        pidx, pnum = expand_q2k_lists(idx, num, factor)
        for bi in range(2):
            for hi in range(2):
                for i in range(4):
                    want = [factor * int(j) + t for j in idx[bi, hi, i] for t in range(factor)]
                    for r in range(factor):
                        assert pidx[bi, hi, factor * i + r].tolist() == want
                        assert int(pnum[bi, hi, factor * i + r]) == factor * int(num[bi, hi, i])


def test_empty_rows_and_q_len_differs_from_kv_len():
    b, h, qb, kvb, block = 1, 2, 2, 7, 64
    block_map = torch.zeros(b, h, qb, kvb, dtype=torch.bool)
    block_map[0, 1, 1, [0, 3, 6]] = True
    sizes = torch.tensor([64, 5, 0, 64, 64, 1, 63], dtype=torch.int32)
    idx, num = map_to_index(block_map)
    meta = build_cudnn_metadata(idx, num, sizes, block_size=block, batch=b, heads=h, q_len=qb * block,
                                kv_len=kvb * block, all_full=False)
    assert meta.q2k_block_nums.tolist() == [[[0, 0], [0, 3]]]
    assert meta.q2k_block_index[0, 1, 1, :3].tolist() == [0, 3, 6]
    assert torch.equal(_token_mask_from_meta(meta, qb * block, kvb * block),
                       block_token_mask(block_map, sizes, block, block))


def test_int64_inputs_are_converted_and_no_copy_for_int32():
    block_map, sizes = _case(1, 2, 2, 3, 128, seed=5)
    idx, num = map_to_index(block_map)
    full = build_cudnn_metadata(idx, num, torch.full_like(sizes, 128), block_size=128, batch=1, heads=2, q_len=256,
                                kv_len=384, all_full=True)
    assert full.q2k_block_index.data_ptr() == idx.data_ptr()  # 64/128, all full: passed through, no copy
    assert full.q2k_block_nums.data_ptr() == num.data_ptr()
    # Partial blocks: the lists are rebuilt without size-0 blocks (see drop_empty_blocks).
    meta = build_cudnn_metadata(idx, num, sizes, block_size=128, batch=1, heads=2, q_len=256, kv_len=384,
                                all_full=False)
    meta64 = build_cudnn_metadata(idx.long(), num.long(), sizes.long(), block_size=128, batch=1, heads=2,
                                  q_len=256, kv_len=384, all_full=False)
    for a, c in zip(meta, meta64):
        if isinstance(a, torch.Tensor):
            assert c.dtype == torch.int32 and torch.equal(a, c)


@pytest.mark.parametrize("bad, match", [
    (dict(block_size=96), "block_size must be one of"),
    (dict(q_len=130), "multiples of block_size"),
    (dict(batch=2), r"q2k_idx must be \[B=2"),
    (dict(kv_len=2 * 128), "kv_block_sizes must have KVb=2"),
])
def test_bad_arguments_raise_before_building(bad, match):
    block_map, sizes = _case(1, 2, 2, 3, 128, seed=6)
    idx, num = map_to_index(block_map)
    kw = dict(block_size=128, batch=1, heads=2, q_len=256, kv_len=384, all_full=False)
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        build_cudnn_metadata(idx, num, sizes, **kw)


def test_float_lists_are_rejected():
    block_map, sizes = _case(1, 1, 2, 2, 64, seed=7)
    idx, num = map_to_index(block_map)
    with pytest.raises(TypeError, match="q2k_idx must be an integer tensor"):
        build_cudnn_metadata(idx.float(), num, sizes, block_size=64, batch=1, heads=1, q_len=128, kv_len=128,
                             all_full=False)


def test_lse_conversion_is_the_identity_on_the_contract_layout():
    """cuDNN's LSE is already natural log [B, H, S_q] with -inf rows: returned unchanged."""
    lse = torch.randn(2, 3, 128)
    lse[0, 1, :64] = float("-inf")
    out = cudnn_lse_to_contract(lse, 2, 3, 128)
    assert out.data_ptr() == lse.data_ptr() and torch.equal(out, lse)
    # a strided view (a future path) comes back contiguous with the same values
    view = torch.randn(2, 128, 3).transpose(1, 2)
    fixed = cudnn_lse_to_contract(view, 2, 3, 128)
    assert fixed.is_contiguous() and torch.equal(fixed, view)


@pytest.mark.parametrize("lse", [torch.zeros(2, 3, 128, dtype=torch.float16), torch.zeros(2, 128, 3),
                                 torch.zeros(2, 3, 64)])
def test_lse_off_contract_raises(lse):
    with pytest.raises(RuntimeError, match="float32"):
        cudnn_lse_to_contract(lse, 2, 3, 128)


def test_size_zero_blocks_are_dropped_from_the_lists():
    from fastvideo_cute.adapters.cudnn_bsa_metadata import drop_empty_blocks
    from fastvideo_cute.metadata import map_to_index

    g = torch.Generator().manual_seed(3)
    m = torch.rand(2, 3, 6, 7, generator=g) < 0.5
    sizes = torch.tensor([64, 0, 10, 0, 64, 1, 0], dtype=torch.int32)
    idx, num = map_to_index(m)
    new_idx, new_num = drop_empty_blocks(idx, num, sizes)
    want_idx, want_num = map_to_index(m & (sizes > 0))
    assert torch.equal(new_num, want_num)
    for b in range(2):
        for h in range(3):
            for r in range(6):
                n = int(new_num[b, h, r])
                assert new_idx[b, h, r, :n].tolist() == want_idx[b, h, r, :n].tolist()
                assert sorted(new_idx[b, h, r].tolist()) == list(range(7))  # filler: valid, unique ids


def test_metadata_never_names_a_size_zero_block():
    from fastvideo_cute.adapters.cudnn_bsa_metadata import build_cudnn_metadata
    from fastvideo_cute.metadata import map_to_index

    m = torch.ones(1, 1, 2, 3, dtype=torch.bool)
    sizes = torch.tensor([256, 1, 0], dtype=torch.int32)  # 256 -> tiles [128,128] [1,0] [0,0]
    idx, num = map_to_index(m)
    meta = build_cudnn_metadata(idx, num, sizes, block_size=256, batch=1, heads=1, q_len=512, kv_len=768,
                                all_full=False)
    phys = meta.block_sizes
    for r in range(4):
        n = int(meta.q2k_block_nums[0, 0, r])
        assert n == 3 and all(int(phys[j]) > 0 for j in meta.q2k_block_index[0, 0, r, :n])


@pytest.mark.parametrize("block, smallest, drops", [
    (64, None, True),   # unknown: drop
    (64, 0, True),      # a size-0 block
    (64, 1, False),     # no block can be empty: the drop (several launches) is skipped
    (128, 37, False),
    (256, 128, True),   # 256 runs as 128-token tiles: a block of <= 128 leaves an empty second tile
    (256, 129, False),
])
def test_size_zero_drop_runs_only_when_a_physical_block_can_be_empty(monkeypatch, block, smallest, drops):
    from fastvideo_cute.adapters import cudnn_bsa_metadata as M

    calls = []
    real = M.drop_empty_blocks
    monkeypatch.setattr(M, "drop_empty_blocks", lambda *a: (calls.append(1), real(*a))[1])
    block_map, sizes = _case(1, 2, 2, 3, block, seed=8)
    sizes = torch.full_like(sizes, block)
    sizes[1] = smallest if smallest is not None else 0
    idx, num = map_to_index(block_map)
    meta = M.build_cudnn_metadata(idx, num, sizes, block_size=block, batch=1, heads=2, q_len=2 * block,
                                  kv_len=3 * block, all_full=False, smallest=smallest)
    assert bool(calls) == drops
    # either way the lists name the same tokens
    assert torch.equal(_token_mask_from_meta(meta, 2 * block, 3 * block),
                       block_token_mask(block_map, sizes, block, block))
