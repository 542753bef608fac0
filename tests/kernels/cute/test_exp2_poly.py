"""``common.softmax.exp2_poly3``: the PTX's arithmetic mirrored in numpy, step for step (fp32 values,
the round-down add done exactly in fp64 then floored: at 1.5 * 2^23 the fp32 ulp is 1), against
exp2 in fp64; its special values; ``poly_columns``. The PTX itself runs in the GPU tests
(``test_block_sparse_fwd64_sm90_gpu.py``, variant ``poly4``) and its SASS is checked by the compile
tests (``FADD.RM`` / ``FMNMX.NAN`` counts)."""

import re

import numpy as np
import pytest

pytest.importorskip("cutlass")

from fastvideo_cute.kernels.cute.common import softmax  # noqa: E402


def _hexf(h: str) -> np.float32:
    return np.frombuffer(int(h, 16).to_bytes(4, "little"), dtype=np.float32)[0]


def _ptx_constants():
    """The fp32 immediates of the PTX, in order (clamp, magic, magic, c3, c2, c1, c0)."""
    return [_hexf(h) for h in re.findall(r"0f([0-9A-F]{8})", softmax._EXP2_POLY3_PTX)]


def _mirror(x: np.ndarray) -> np.ndarray:
    lo, magic, magic2, c3, c2, c1, c0 = _ptx_constants()
    assert magic == magic2
    x = x.astype(np.float32)
    xc = np.where(np.isnan(x), x, np.maximum(x, lo)).astype(np.float32)  # max.NaN
    with np.errstate(invalid="ignore"):
        xr = (np.floor(xc.astype(np.float64) + np.float64(magic))).astype(np.float32)  # add.rm
        xb = (xr - magic).astype(np.float32)
        fr = (xc - xb).astype(np.float32)
        p = (fr * c3 + c2).astype(np.float32)
        p = (p * fr + c1).astype(np.float32)
        p = (p * fr + c0).astype(np.float32)
    xr_bits = np.where(np.isnan(xr), np.uint32(0x7FFFFFFF), xr.view(np.uint32))  # PTX's canonical NaN
    scale = ((xr_bits.astype(np.uint64) << np.uint64(23)) & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        return (p * scale).astype(np.float32)


def test_constants_are_the_documented_ones():
    lo, magic, _, c3, c2, c1, c0 = _ptx_constants()
    assert lo == -127.0 and magic == 1.5 * 2 ** 23 + 127
    assert (c0, c1, c2, c3) == tuple(np.float32(c) for c in softmax.EXP2_POLY3)


def test_matches_exp2_within_the_stated_bound():
    # the softmax's arguments: <= 8 (the lazy rescale's threshold), down to where MUFU flushes to 0
    x = np.concatenate([np.linspace(-126.0, 8.0, 400_001, dtype=np.float32),
                        np.float32([-126.0, -1.0, -0.5, 0.0, 1.0, 7.999999, 8.0])])
    got = _mirror(x).astype(np.float64)
    want = np.exp2(x.astype(np.float64))
    rel = np.abs(got / want - 1)
    # 8.8e-5: the degree-3 polynomial's own maximum on [0, 1) (numpy over 200,000 points)
    assert rel.max() <= 8.8e-5, rel.max()
    assert np.all(got[x == 0.0] == 1.0) and np.all(got[x == 1.0] == 2.0)


def test_special_values():
    got = _mirror(np.float32([-np.inf, -1000.0, -127.0, -127.5, np.nan, np.inf]))
    assert np.all(got[:4] == 0.0)  # -inf (masked keys) and below -127: exactly 0
    assert np.isnan(got[4])  # NaN stays NaN
    assert np.isnan(got[5])  # +inf: NaN (the softmax centres such a row first; see exp2_poly3)


@pytest.mark.parametrize("count, want", [(0, ()), (1, (0,)), (4, (0, 4, 8, 12)), (8, (0, 2, 4, 6, 8, 10, 12, 14)),
                                         (16, tuple(range(16))), (3, (0, 5, 10))])
def test_poly_columns(count, want):
    assert softmax.poly_columns(16, count) == want


def test_poly_columns_refuses_bad_counts():
    for bad in (-1, 17):
        with pytest.raises(ValueError, match="exp2_poly"):
            softmax.poly_columns(16, bad)
