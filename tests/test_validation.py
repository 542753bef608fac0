"""fastvideo_cute.validation: the sizes range check and its record (inference tensors, writes the
version counter cannot see), and argument errors that name the argument (issue #11 items 1, 3, 12)."""

import re

import pytest
import torch

import fastvideo_cute as fvc
from fastvideo_cute import validation
from fastvideo_cute.validation import check_block_sizes, check_sizes_range, has_partial_blocks

from .conftest import HAS_CUDA

DEV = "cuda" if HAS_CUDA else "cpu"


def _small(block=64, nq=2, nkv=2, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, nq * block, d, generator=g).to(DEV)
    k = torch.randn(1, 1, nkv * block, d, generator=g).to(DEV)
    v = torch.randn(1, 1, nkv * block, d, generator=g).to(DEV)
    return q, k, v, torch.ones(1, 1, nq, nkv, dtype=torch.bool, device=DEV)


def test_sizes_made_in_inference_mode_work_there_and_outside():
    q, k, v, m = _small()
    with torch.inference_mode():
        sizes = fvc.variable_block_sizes((1, 8, 14), (1, 8, 8), device=DEV)  # [64, 48]
        assert sizes.is_inference()
        out_inf, lse_inf = fvc.block_sparse_attn(q, k, v, m, sizes)
        out_again, _ = fvc.block_sparse_attn(q, k, v, m, sizes)
    with torch.no_grad():
        out_ng, lse_ng = fvc.block_sparse_attn(q, k, v, m, sizes.clone())
    assert torch.equal(out_inf, out_ng) and torch.equal(lse_inf, lse_ng) and torch.equal(out_again, out_inf)
    out_outside, _ = fvc.block_sparse_attn(q, k, v, m, sizes)  # the same inference tensor, outside
    assert torch.equal(out_outside, out_ng)
    assert has_partial_blocks(sizes, 64)


def test_inference_tensor_sizes_checked_once_per_tensor(monkeypatch):
    with torch.inference_mode():
        sizes = torch.full((4,), 64, dtype=torch.int32, device=DEV)
    host, device = [], []
    real = torch.aminmax

    def counting(x, *a, **kw):
        host.append(x.device.type)
        return real(x, *a, **kw)

    real_backstop = validation._device_backstop
    monkeypatch.setattr(torch, "aminmax", counting)
    monkeypatch.setattr(validation, "_device_backstop",
                        lambda *a, **kw: device.append(a[2:]) or real_backstop(*a, **kw))
    for _ in range(3):
        check_sizes_range(sizes, 64)
    # CPU tensors are re-checked on the host every call (no GPU sync involved); a CUDA tensor is
    # read on the host once and then checked by the device-side backstop (one Triton launch).
    if DEV == "cpu":
        assert host == ["cpu"] * 3 and device == []
    else:
        assert host == ["cuda"] and device == [("variable_block_sizes", 64)] * 2


@pytest.mark.skipif(HAS_CUDA, reason="writes through .numpy() need a CPU tensor")
def test_writes_through_numpy_are_seen():
    q, k, v, m = _small()
    sizes = torch.full((2,), 64, dtype=torch.int32)
    fvc.block_sparse_attn(q, k, v, m, sizes)
    assert not has_partial_blocks(sizes, 64)
    sizes.numpy()[1] = 1000  # no version bump
    with pytest.raises(ValueError, match=r"variable_block_sizes must lie in \[0, 64\], got values in \[64, 1000\]"):
        fvc.block_sparse_attn(q, k, v, m, sizes)
    sizes.numpy()[1] = 10  # a full block became partial behind the version counter
    fvc.block_sparse_attn(q, k, v, m, sizes)
    assert has_partial_blocks(sizes, 64)


def test_writes_through_data_are_seen_on_cpu():
    sizes = torch.full((2,), 64, dtype=torch.int32)
    check_sizes_range(sizes, 64)
    assert not has_partial_blocks(sizes, 64)
    sizes.data[0] = -7  # .data has a version counter of its own
    with pytest.raises(ValueError, match=r"got values in \[-7, 64\]"):
        check_sizes_range(sizes, 64)


def test_in_place_write_bumps_the_record():
    sizes = torch.full((2,), 64, dtype=torch.int32, device=DEV)
    check_sizes_range(sizes, 64)
    assert not has_partial_blocks(sizes, 64)
    sizes[1] = 5
    assert has_partial_blocks(sizes, 64)  # stale record: the safe answer until re-checked
    check_sizes_range(sizes, 64)
    assert has_partial_blocks(sizes, 64)


def test_converted_sizes_inherit_the_record():
    sizes = torch.full((3,), 64, dtype=torch.int64, device=DEV)
    conv = check_block_sizes(sizes, 3, 64, sizes.device)  # a tensor's device (cuda:0, not "cuda"), as the API passes q.device
    assert conv.dtype == torch.int32 and conv is not sizes
    assert not has_partial_blocks(conv, 64)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8, torch.int64])
def test_small_integer_sizes_are_accepted(dtype):
    q, k, v, m = _small()
    ref, _ = fvc.block_sparse_attn(q, k, v, m, torch.tensor([64, 40], dtype=torch.int32, device=DEV))
    out, _ = fvc.block_sparse_attn(q, k, v, m, torch.tensor([64, 40], dtype=dtype, device=DEV))
    assert torch.equal(out, ref)


def test_float_sizes_name_the_accepted_dtypes():
    q, k, v, m = _small()
    with pytest.raises(TypeError, match=r"variable_block_sizes must be an integer tensor \(int32, int64, int16, int8, "
                                        r"uint8; int32 preferred\), got torch.float32"):
        fvc.block_sparse_attn(q, k, v, m, torch.tensor([64.0, 40.0], device=DEV))


@pytest.mark.parametrize("block_size,words", [
    (None, "got None (NoneType)"),
    (64.0, "got 64.0 (float)"),
    ((True, 8, 8), "got (True, 8, 8) (tuple)"),
    ((4, 4), "got (4, 4) (tuple)"),
])
def test_vsa_block_size_errors(block_size, words):
    q, k, v, _ = _small()
    s = torch.full((2,), 64, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="block_size must be an int .* or a tuple of 3 positive ints .*" + re.escape(words)):
        fvc.video_sparse_attn(q, k, v, s, s, 1, block_size=block_size)


def test_vsa_gate_that_is_not_a_tensor_says_its_type():
    q, k, v, _ = _small()
    s = torch.full((2,), 64, dtype=torch.int32, device=DEV)
    with pytest.raises(TypeError, match="compress_attn_weight must be None or a tensor .* got float"):
        fvc.video_sparse_attn(q, k, v, s, s, 1, compress_attn_weight=0.5)


def test_unsupported_head_dim_is_a_value_error_naming_the_supported_ones():
    from fastvideo_cute.backends.registry import supported_head_dims

    dims = supported_head_dims()
    assert 128 in dims and 8 not in dims and 96 not in dims or 96 in dims  # 96 joins with a backend serving it
    for d in (8, 16, 48, 160, 256):
        if d in dims:
            continue
        q, k, v, m = _small(d=d)
        with pytest.raises(ValueError, match=rf"head_dim must be one of {tuple(dims)}".replace("(", r"\(")
                           .replace(")", r"\)") + f".*got {d}"):
            fvc.block_sparse_attn(q, k, v, m, torch.full((2,), 64, dtype=torch.int32, device=DEV))


def test_metadata_helpers_validate_their_input():
    with pytest.raises(TypeError, match="block_map must be a bool or integer tensor"):
        fvc.map_to_index(torch.ones(2, 2))
    with pytest.raises(ValueError, match="block_map must have at least 1 dimension"):
        fvc.map_to_index(torch.tensor(True))
    with pytest.raises(ValueError, match="q_factor must be a positive int"):
        fvc.expand_block_map(torch.ones(2, 2, dtype=torch.bool), 0, 1)
    with pytest.raises(TypeError, match="block_map must be a torch.Tensor"):
        fvc.expand_block_map([[True]], 1, 1)


def test_record_is_dropped_with_the_tensor():
    sizes = torch.full((2,), 64, dtype=torch.int32)
    check_sizes_range(sizes, 64)
    key = id(sizes)
    assert key in validation._RANGE_OK
    del sizes
    assert key not in validation._RANGE_OK


def test_smallest_block_comes_from_the_range_record():
    from fastvideo_cute.validation import smallest_block

    sizes = torch.tensor([64, 17, 64, 40], dtype=torch.int32)
    assert smallest_block(sizes, 64) is None  # not checked yet: unknown
    check_sizes_range(sizes, 64)
    assert smallest_block(sizes, 64) == 17
    assert smallest_block(sizes, 128) is None  # the record is per block size
    sizes[1] = 3  # in place: the version bumps, the record no longer applies
    assert smallest_block(sizes, 64) is None
    check_sizes_range(sizes, 64)
    assert smallest_block(sizes, 64) == 3
