"""kernels/triton/packed_steps against a pure-Python reference written straight from the module's
contract (each row's step count and the words of its steps, compared exactly; words past the count
must be left as they were), under TRITON_INTERPRET=1 on CPU: widths 1, powers of two and not,
counts in [0, W] and outside it (clamped), tile sizes of every kind (empty, partial at and off the
16-key piece bounds, whole), no sizes, a kv_len that cuts the last tiles, and rows spread over
programs unevenly. Plus the invariant the consumer relies on (every valid key of a row's tiles in
exactly one used slot, whole steps first, unused slots only at the end of the last step) and the
refused shapes. On a machine with a GPU the same cases run the compiled kernel on CUDA tensors."""

from collections import Counter

import pytest
import torch

pytest.importorskip("triton")

from fastvideo_cute.kernels.triton.packed_steps import packed_steps  # noqa: E402

_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: the interpreter (tests/conftest.py)
_SIZES = [0, 1, 8, 15, 16, 17, 31, 32, 33, 48, 63, 64]


def _valid(t, sizes, kv_len):
    size = 64 if sizes is None else sizes[t]
    return max(0, min(size, kv_len - 64 * t, 64))


def _reference(idx, num, sizes, kv_len):
    """Per row: the list of steps (each a list of 4 words) from the contract."""
    w = len(idx[0]) if idx else 0
    out = []
    for row, n in zip(idx, num):
        whole, pieces = [], []
        for t in row[:min(max(n, 0), w)]:
            v = _valid(t, sizes, kv_len)
            if v == 64:
                whole.append([(4 * t) << 6 | 32 | 16, 0, 0, 0])
            elif v > 0:
                pieces += [(4 * t + i) << 6 | min(16, v - 16 * i) for i in range((v + 15) // 16)]
        pieces += [0] * (-len(pieces) % 4)
        out.append(whole + [pieces[j:j + 4] for j in range(0, len(pieces), 4)])
    return out


def _case(r, w, kvb, seed, with_sizes):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, kvb, (r, w), generator=g, dtype=torch.int32)
    num = torch.randint(0, w + 1, (r,), generator=g, dtype=torch.int32)
    num[0] = w
    if r > 1:
        num[1] = w + 3  # past the width: clamped to it
    if r > 2:
        num[2] = -2  # below 0: clamped to 0
    if r > 3:
        num[3] = 0
    sizes = None
    if with_sizes:
        pick = torch.tensor(_SIZES, dtype=torch.int32)
        sizes = pick[torch.randint(0, len(_SIZES), (kvb,), generator=g)]
        rand = torch.randint(0, 65, (kvb,), generator=g, dtype=torch.int32)
        sizes = torch.where(torch.rand(kvb, generator=g) < 0.3, rand, sizes).contiguous()
    return idx, num, sizes


def _run(idx, num, sizes, kv_len, rows_per_program=4):
    r, w = idx.shape
    steps = torch.full((r, 4 * w), -7, dtype=torch.int32, device=_DEVICE)
    nsteps = torch.full((r,), -7, dtype=torch.int32, device=_DEVICE)
    idx, num = idx.to(_DEVICE), num.to(_DEVICE)
    sizes = None if sizes is None else sizes.to(_DEVICE)
    packed_steps(idx, num, sizes, kv_len, steps, nsteps, rows_per_program=rows_per_program)
    return steps.cpu(), nsteps.cpu()


_SHAPES = [(5, 1, 3), (7, 3, 5), (9, 8, 6), (6, 13, 20), (5, 33, 40)]


@pytest.mark.parametrize("with_sizes", [True, False], ids=["sizes", "no-sizes"])
@pytest.mark.parametrize("r, w, kvb", _SHAPES, ids=[f"r{r}w{w}" for r, w, _ in _SHAPES])
def test_matches_the_reference(r, w, kvb, with_sizes):
    idx, num, sizes = _case(r, w, kvb, seed=r * 1000 + w * 10 + with_sizes, with_sizes=with_sizes)
    sz = None if sizes is None else sizes.tolist()
    # kv_len: every tile whole, the last tile cut (not a multiple of 64), the last tiles cut, none
    for kv_len, rows in ((64 * kvb, 4), (64 * kvb - 23, 2), (64 * (kvb // 2) + 40, 1), (0, 4)):
        steps, nsteps = _run(idx, num, sizes, kv_len, rows_per_program=rows)
        want = _reference(idx.tolist(), num.tolist(), sz, kv_len)
        assert nsteps.tolist() == [len(s) for s in want], kv_len
        for i, ws in enumerate(want):
            n = len(ws)
            assert n <= min(max(int(num[i]), 0), w)
            assert steps[i, :4 * n].tolist() == [x for s in ws for x in s], (kv_len, i)
            assert (steps[i, 4 * n:] == -7).all(), (kv_len, i)  # words past the count untouched


def test_a_row_by_hand():
    sizes = torch.tensor([64, 33, 0, 64, 20, 64], dtype=torch.int32)
    idx = torch.tensor([[1, 0, 2, 4, 3, 5]], dtype=torch.int32)
    num = torch.tensor([6], dtype=torch.int32)
    steps, nsteps = _run(idx, num, sizes, 64 * 5 + 8)  # tile 5 cut to 8 keys
    assert nsteps.tolist() == [4]  # tiles 0 and 3 whole, then 6 pieces: 2 steps
    assert steps[0, :16].tolist() == [0 << 6 | 48, 0, 0, 0, 12 << 6 | 48, 0, 0, 0,
                                      4 << 6 | 16, 5 << 6 | 16, 6 << 6 | 1, 16 << 6 | 16,
                                      17 << 6 | 4, 20 << 6 | 8, 0, 0]


@pytest.mark.parametrize("with_sizes", [True, False], ids=["sizes", "no-sizes"])
def test_every_valid_key_in_exactly_one_slot(with_sizes):
    r, w, kvb = 12, 11, 16
    idx, num, sizes = _case(r, w, kvb, seed=7 + with_sizes, with_sizes=with_sizes)
    kv_len = 64 * kvb - 37
    steps, nsteps = _run(idx, num, sizes, kv_len)
    sz = None if sizes is None else sizes.tolist()
    for i in range(r):
        want = Counter()
        for t in idx[i, :min(max(int(num[i]), 0), w)].tolist():
            want.update((t, k) for k in range(_valid(t, sz, kv_len)))
        got, n, seen_pieces = Counter(), int(nsteps[i]), False
        for j in range(n):
            words = steps[i, 4 * j:4 * j + 4].tolist()
            if words[0] & 32:  # a whole tile's step, before every piece step
                assert not seen_pieces and words[0] & 31 == 16 and words[1:] == [0, 0, 0], (i, j)
                got.update((words[0] >> 8, k) for k in range(64))
                continue
            seen_pieces = True
            used = [x for x in words if x != 0]
            assert words[:len(used)] == used and (len(used) == 4 or j == n - 1), (i, j, words)
            for x in used:
                v, p = x & 31, x >> 6
                assert 1 <= v <= 16 and not x & 32, (i, j, x)
                got.update((p // 4, 16 * (p % 4) + k) for k in range(v))
        assert got == want, i


def test_bad_arguments_are_refused():
    i32 = dict(dtype=torch.int32)
    idx, num = torch.zeros(4, 8, **i32), torch.zeros(4, **i32)
    steps, nsteps = torch.zeros(4, 32, **i32), torch.zeros(4, **i32)
    with pytest.raises(ValueError, match="idx"):
        packed_steps(torch.zeros(32, **i32), num, None, 64, steps, nsteps)
    with pytest.raises(ValueError, match="num"):
        packed_steps(idx, torch.zeros(5, **i32), None, 64, steps, nsteps)
    with pytest.raises(ValueError, match="steps"):
        packed_steps(idx, num, None, 64, torch.zeros(4, 8, **i32), nsteps)
    with pytest.raises(ValueError, match="nsteps"):
        packed_steps(idx, num, None, 64, steps, torch.zeros(4, 1, **i32))
    with pytest.raises(ValueError, match="sizes"):
        packed_steps(idx, num, torch.zeros(2, 8, **i32), 64, steps, nsteps)
    with pytest.raises(ValueError, match="kv_len"):
        packed_steps(idx, num, None, -1, steps, nsteps)
    with pytest.raises(ValueError, match="rows_per_program"):
        packed_steps(idx, num, None, 64, steps, nsteps, rows_per_program=3)
    packed_steps(torch.zeros(0, 8, **i32), torch.zeros(0, **i32), None, 64,
                 torch.zeros(0, 32, **i32), torch.zeros(0, **i32))  # no rows: nothing to do
