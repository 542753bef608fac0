"""The padding probe kernel (``kernels/triton/padding_probe.py``) against a torch reference.

On CPU it runs under TRITON_INTERPRET=1 (tests/conftest.py), in fp16 and fp32 (the interpreter's
bf16 is wrong); on a GPU the same tests run on CUDA tensors, bf16 included. The reference:
``(x[padding] != 0).any()`` over K and V (NaN, Inf and finite non-zero values count; -0.0 does
not). Each case puts one offending value in one place and checks the flag, so a kernel that skips
rows, tensors, heads, batches or chunks fails one of them.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from fastvideo_cute.kernels.triton.padding_probe import padding_nonzero_triton  # noqa: E402

DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if torch.cuda.is_available() else [])


def _valid(sizes: torch.Tensor, block: int) -> torch.Tensor:
    pos = torch.arange(block, device=sizes.device)
    return (pos[None, :] < sizes[:, None].long()).reshape(-1)


def _reference(k, v, sizes, block, bshd) -> int:
    pad = ~_valid(sizes, block)
    idx = (slice(None), pad) if bshd else (slice(None), slice(None), pad)
    return int(bool((k[idx] != 0).any() or (v[idx] != 0).any()))


def _inputs(b, h, s, d, block, dtype, bshd, device, seed, sizes=None):
    """Random valid rows, zero padding rows."""
    g = torch.Generator().manual_seed(seed)
    shape = (b, s, h, d) if bshd else (b, h, s, d)
    nb = s // block
    if sizes is None:
        sizes = torch.randint(0, block + 1, (nb,), generator=g, dtype=torch.int32)
        sizes[0] = block
        if nb > 2:
            sizes[1], sizes[2] = 0, 1
    sizes = sizes.to(device)
    valid = _valid(sizes, block).view((1, -1, 1, 1) if bshd else (1, 1, -1, 1))
    k = (torch.randn(shape, generator=g).to(device) * valid).to(dtype)
    v = (torch.randn(shape, generator=g).to(device) * valid).to(dtype)
    return k, v, sizes


def _probe(k, v, sizes, block, bshd) -> int:
    flag = torch.zeros(1, dtype=torch.int32, device=k.device)
    padding_nonzero_triton(k, v, sizes, block, flag, bshd=bshd)
    return int(flag.item())


def _pad_positions(sizes, block):
    return [int(p) for p in torch.nonzero(~_valid(sizes.cpu(), block)).flatten()]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bshd", [False, True])
def test_zero_padding_reads_zero(device, dtype, bshd):
    block = 16
    k, v, sizes = _inputs(2, 3, 5 * block, 32, block, dtype, bshd, device, seed=int(bshd))
    assert _reference(k, v, sizes, block, bshd) == 0
    assert _probe(k, v, sizes, block, bshd) == 0


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e-3, -2.0])
@pytest.mark.parametrize("which", ["k", "v"])
@pytest.mark.parametrize("bshd", [False, True])
def test_one_nonzero_padding_value_is_seen(device, value, which, bshd):
    block = 16
    k, v, sizes = _inputs(2, 3, 5 * block, 32, block, torch.float32, bshd, device, seed=3)
    pads = _pad_positions(sizes, block)
    assert pads, "the case needs padding"
    pos, bi, hi, di = pads[-1], 1, 2, 31  # the last batch, head, channel and padding row
    t = k if which == "k" else v
    if bshd:
        t[bi, pos, hi, di] = value
    else:
        t[bi, hi, pos, di] = value
    assert _reference(k, v, sizes, block, bshd) == 1
    assert _probe(k, v, sizes, block, bshd) == 1


def test_negative_zero_and_valid_rows_do_not_count(device):
    block = 16
    k, v, sizes = _inputs(1, 2, 4 * block, 16, block, torch.float32, False, device, seed=4)
    pads = _pad_positions(sizes, block)
    k[0, 1, pads[0], 3] = -0.0
    k[0, 0, 0, :] = float("nan")  # block 0 is full: a NaN in a valid row is data, not padding
    assert _probe(k, v, sizes, block, False) == 0


def test_every_padding_row_is_read(device):
    """A 64-token block of size 1: the value sits in each padding row in turn (every chunk of
    the walk), in the other tensor for odd rows."""
    block, d = 64, 128
    sizes = torch.tensor([64, 1, 64], dtype=torch.int32)
    k, v, sizes = _inputs(1, 1, 3 * block, d, block, torch.float16, False, device, seed=5, sizes=sizes)
    for row in range(1, block):
        t = k if row % 2 else v
        t[0, 0, block + row, row % d] = 7.0
        assert _probe(k, v, sizes, block, False) == 1, row
        t[0, 0, block + row, row % d] = 0.0
    assert _probe(k, v, sizes, block, False) == 0


def test_full_blocks_only_read_nothing(device):
    block = 16
    sizes = torch.full((3,), block, dtype=torch.int32)
    k, v, sizes = _inputs(1, 2, 3 * block, 16, block, torch.float32, True, device, seed=6, sizes=sizes)
    assert _probe(k, v, sizes, block, True) == 0


def test_strided_view(device):
    """A BHSD view of BSHD storage (strides, not a copy) with a NaN in its padding."""
    block = 16
    k, v, sizes = _inputs(1, 2, 3 * block, 16, block, torch.float32, True, device, seed=7,
                          sizes=torch.tensor([16, 5, 16], dtype=torch.int32))
    kv, vv = k.transpose(1, 2), v.transpose(1, 2)
    assert not kv.is_contiguous()
    assert _probe(kv, vv, sizes, block, False) == 0
    v[0, block + 9, 1, 4] = float("nan")
    assert _probe(kv, vv, sizes, block, False) == 1


def test_flag_is_left_set(device):
    """The kernel only raises the flag (the caller zeroes it)."""
    block = 16
    k, v, sizes = _inputs(1, 1, 2 * block, 16, block, torch.float32, False, device, seed=8)
    flag = torch.ones(1, dtype=torch.int32, device=device)
    padding_nonzero_triton(k, v, sizes, block, flag, bshd=False)
    assert int(flag.item()) == 1


@pytest.mark.parametrize("bad, match", [
    (dict(sizes=torch.zeros(3, dtype=torch.int64)), "kv_block_sizes must be contiguous int32"),
    (dict(sizes=torch.zeros(2, dtype=torch.int32)), r"kv_block_sizes must be contiguous int32 \[3\]"),
    (dict(flag=torch.zeros(1, dtype=torch.int64)), "flag must be a contiguous int32"),
    (dict(v=torch.zeros(1, 1, 32, 16)), "v .* must match k"),
    (dict(k=torch.zeros(1, 1, 48, 16).transpose(-1, -2)), "k must have a unit last"),
    (dict(block=32), "multiple of kv_block=32"),
])
def test_bad_input_is_named(bad, match):
    k = bad.get("k", torch.zeros(1, 1, 48, 16))
    v = bad.get("v", torch.zeros(1, 1, 48, 16) if "k" not in bad else torch.zeros(1, 1, 16, 48))
    sizes = bad.get("sizes", torch.full((3,), 16, dtype=torch.int32))
    flag = bad.get("flag", torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match=match):
        padding_nonzero_triton(k, v, sizes, bad.get("block", 16), flag, bshd=False)
