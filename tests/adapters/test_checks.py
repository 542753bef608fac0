"""The shared static checks of our CuTe kernels' adapters, on fake CUDA tensors (no GPU needed)."""

import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from fastvideo_cute.adapters._checks import check_bhsd_bf16, check_block_lists


@pytest.fixture
def fake():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FakeTensorMode():
            yield lambda *shape, dtype=torch.bfloat16: torch.empty(*shape, device="cuda", dtype=dtype)


def test_activation_checks(fake):
    q, k = fake(1, 2, 256, 128), fake(1, 2, 256, 128)
    assert check_bhsd_bf16((("q", q), ("k", k)), 128) == (True, "")
    ok, why = check_bhsd_bf16((("q", q), ("k", fake(1, 2, 128, 128))), 128)
    assert not ok and "k has shape" in why
    ok, why = check_bhsd_bf16((("q", fake(1, 2, 256, 128, dtype=torch.float16)),), 128)
    assert not ok and "must be bfloat16" in why
    ok, why = check_bhsd_bf16((("q", q.transpose(1, 2)),), 128)
    assert not ok and "contiguous" in why
    ok, why = check_bhsd_bf16((("q", fake(1, 2, 256, 64)),), 128)
    assert not ok and "head_dim must be 128" in why
    ok, why = check_bhsd_bf16((("q", torch.empty(1, 2, 256, 128, dtype=torch.bfloat16)),), 128)
    assert not ok and "not a CUDA tensor" in why


def test_block_list_checks(fake):
    q = fake(1, 2, 256, 128)
    idx, num, sizes = fake(1, 2, 2, 2, dtype=torch.int32), fake(1, 2, 2, dtype=torch.int32), fake(2, dtype=torch.int32)
    assert check_block_lists(q, "q2k_idx", idx, "q2k_num", num, sizes, 128) == (True, "")
    ok, why = check_block_lists(q, "q2k_idx", idx, "q2k_num", num, sizes, 64)
    assert not ok and "must equal num_blocks" in why
    ok, why = check_block_lists(q, "q2k_idx", idx, "q2k_num", fake(1, 2, 3, dtype=torch.int32), sizes, 128)
    assert not ok and "q2k_num must be [1, 2, 2]" in why
    ok, why = check_block_lists(q, "q2k_idx", fake(1, 2, 2, 2), "q2k_num", num, sizes, 128)
    assert not ok and "q2k_idx must be an integer tensor" in why
    assert check_block_lists(q, "k2q_idx", None, "k2q_num", num, sizes, 128) == (True, "")


def test_launch_limits():
    from fastvideo_cute.adapters._checks import LaunchLimits

    lim = LaunchLimits(max_batch_heads=100, max_rows=10_000, max_index_elems=5_000)
    assert lim.fits(2, 10, 256, 4, 4)
    assert not lim.fits(11, 10, 8, 1, 1)  # grid y
    assert not lim.fits(1, 10, 2048, 4, 4)  # rows
    assert not lim.fits(1, 10, 256, 40, 40)  # index elements
    assert "launch limits" in lim.describe()
