"""The permuted views of the sm_90 64-token kernels (ours and cuDNN's direct entry): from either
call layout, q / k / out as (S, D, H, B) and v as (D, S, H, B), no copy."""

import pytest
import torch

from fastvideo_cute.adapters.kernel_layout import permutations


@pytest.mark.parametrize("bshd", [False, True])
def test_views_index_the_same_elements(bshd):
    B, H, S, D = 2, 3, 5, 4
    x = torch.arange(B * H * S * D).reshape(B, H, S, D)
    call = x.transpose(1, 2).contiguous() if bshd else x
    b, h, s, qko, vp = permutations(call.shape, bshd)
    assert (b, h, s) == (B, H, S)
    qv, vv = call.permute(qko), call.permute(vp)
    assert qv.shape == (S, D, H, B) and vv.shape == (D, S, H, B)
    assert qv.data_ptr() == call.data_ptr() and qv.stride(1) == 1 and vv.stride(0) == 1
    assert qv[4, 3, 2, 1] == x[1, 2, 4, 3] and vv[3, 4, 2, 1] == x[1, 2, 4, 3]
