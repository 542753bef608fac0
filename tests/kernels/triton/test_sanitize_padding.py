"""The padding sanitizer (``kernels/triton/sanitize_padding.py``) against a torch reference.

On CPU it runs under TRITON_INTERPRET=1 (tests/conftest.py), in fp16 and fp32 (the interpreter's
bf16 is wrong); on a GPU the same tests run on CUDA tensors, bf16 included. The reference is
``torch.where(valid_token, x, 0)``; results must be equal bit for bit (a copy, no arithmetic), with
NaN/Inf in the padding and in valid rows (valid NaN is data and must be copied).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from fastvideo_cute.kernels.triton.sanitize_padding import sanitize_kv_padding, sanitize_padding_triton  # noqa: E402

DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if torch.cuda.is_available() else [])


def _valid(sizes: torch.Tensor, block: int) -> torch.Tensor:
    pos = torch.arange(block, device=sizes.device)
    return (pos[None, :] < sizes[:, None].long()).reshape(-1)


def _reference(x: torch.Tensor, sizes: torch.Tensor, block: int, bshd: bool) -> torch.Tensor:
    valid = _valid(sizes, block)
    shape = (1, -1, 1, 1) if bshd else (1, 1, -1, 1)
    return torch.where(valid.view(shape), x, torch.zeros((), dtype=x.dtype, device=x.device))


def _inputs(b, h, s, d, block, dtype, bshd, device, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (b, s, h, d) if bshd else (b, h, s, d)
    k = torch.randn(shape, generator=g).to(device, dtype)
    v = torch.randn(shape, generator=g).to(device, dtype)
    nb = s // block
    sizes = torch.randint(0, block + 1, (nb,), generator=g, dtype=torch.int32)
    sizes[0] = block
    if nb > 2:
        sizes[1], sizes[2] = 0, 1
    sizes = sizes.to(device)
    pad = ~_valid(sizes, block)
    idx = (slice(None), pad) if bshd else (slice(None), slice(None), pad)
    k[idx] = float("nan")
    v[idx] = float("inf")
    return k, v, sizes


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    itype = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return torch.equal(a.contiguous().view(itype), b.contiguous().view(itype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bshd", [False, True])
def test_k_and_v_match_reference(device, dtype, bshd):
    block = 16
    k, v, sizes = _inputs(2, 3, 4 * block, 32, block, dtype, bshd, device, seed=int(bshd))
    k[0, 0, 0, 0] = float("nan")  # a NaN in a valid row (token 0, block 0 is full) is data: copied
    kc, vc = sanitize_kv_padding(k, v, sizes, block, bshd=bshd)
    for got, x in ((kc, k), (vc, v)):
        assert got.shape == x.shape and got.dtype == x.dtype and got.is_contiguous()
        assert _bits_equal(got, _reference(x, sizes, block, bshd))
    assert torch.isnan(kc[0, 0, 0, 0])


@pytest.mark.parametrize("which", ["k", "v"])
def test_one_tensor_only(device, which):
    block = 16
    k, v, sizes = _inputs(1, 2, 3 * block, 16, block, torch.float32, False, device, seed=2)
    kc, vc = sanitize_kv_padding(k if which == "k" else None, v if which == "v" else None, sizes, block, bshd=False)
    got, x, other = (kc, k, vc) if which == "k" else (vc, v, kc)
    assert other is None
    assert _bits_equal(got, _reference(x, sizes, block, False))


def test_strided_inputs_and_outputs(device):
    """A BHSD view of BSHD storage in, a BSHD-strided output written through its strides."""
    block = 16
    k, v, sizes = _inputs(1, 2, 2 * block, 24, block, torch.float16, True, device, seed=3)  # D=24: masked lanes
    kv = k.transpose(1, 2)  # [B, H, S, D] view, not contiguous
    vv = v.transpose(1, 2)
    k_out = torch.full_like(k, 7.0).transpose(1, 2)  # strided output
    v_out = torch.full_like(v, 7.0).transpose(1, 2)
    sanitize_padding_triton(kv, vv, sizes, block, k_out, v_out, bshd=False)
    assert _bits_equal(k_out, _reference(kv, sizes, block, False))
    assert _bits_equal(v_out, _reference(vv, sizes, block, False))


def test_all_full_and_all_empty(device):
    block = 16
    k, v, _ = _inputs(1, 1, 2 * block, 16, block, torch.float32, False, device, seed=4)
    full = torch.full((2,), block, dtype=torch.int32, device=device)
    kc, vc = sanitize_kv_padding(k, v, full, block, bshd=False)
    assert _bits_equal(kc, k) and _bits_equal(vc, v)
    empty = torch.zeros(2, dtype=torch.int32, device=device)
    kc, vc = sanitize_kv_padding(k, v, empty, block, bshd=False)
    assert torch.equal(kc, torch.zeros_like(k)) and torch.equal(vc, torch.zeros_like(v))
    assert not torch.signbit(kc).any()  # +0.0, not -0.0


@pytest.mark.parametrize("kw, match", [
    (dict(k_out=None), "k and k_out must be given together"),
    (dict(sizes=torch.zeros(3, dtype=torch.int32)), r"kv_block_sizes must be contiguous int32 \[2\]"),
    (dict(sizes=torch.zeros(2, dtype=torch.int64)), "kv_block_sizes must be contiguous int32"),
    (dict(block=24), "multiple of kv_block=24"),
    (dict(k_out=torch.zeros(1, 1, 32, 16, dtype=torch.float16)), "k_out must match k"),
])
def test_bad_arguments_raise(kw, match):
    k = torch.zeros(1, 1, 32, 16)
    v = torch.zeros(1, 1, 32, 16)
    args = dict(k=k, v=v, sizes=torch.zeros(2, dtype=torch.int32), block=16, k_out=torch.empty_like(k),
                v_out=torch.empty_like(v))
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        sanitize_padding_triton(args["k"], args["v"], args["sizes"], args["block"], args["k_out"], args["v_out"],
                                bshd=False)


def test_nothing_to_do_raises():
    with pytest.raises(ValueError, match="both None"):
        sanitize_padding_triton(None, None, torch.zeros(1, dtype=torch.int32), 16, None, None, bshd=False)
