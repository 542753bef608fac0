"""The Triton pair slots (``kernels/triton/pair_slots.py``) against ``pair_slots``'s torch ops, under
the interpreter on CPU (TRITON_INTERPRET=1, set by tests/conftest.py; int32 only: no bf16 math involved): random block maps with empty rows and
columns, B and H > 1, list widths past the counts and chunks smaller than a row."""

import pytest
import torch

pytest.importorskip("triton")

from fastvideo_cute.adapters.cute_sm90_bwd64_split import pair_slots  # noqa: E402
from fastvideo_cute.kernels.triton.pair_slots import pair_slots_triton  # noqa: E402
from fastvideo_cute.metadata import invert_indices, map_to_index  # noqa: E402


@pytest.mark.parametrize("b, h, n, p, chunk, seed", [(1, 1, 5, 0.5, 64, 0), (2, 3, 9, 0.4, 2, 1),
                                                       (1, 2, 16, 0.9, 4, 2), (2, 1, 7, 0.0, 64, 3)])
def test_triton_slots_equal_the_torch_slots(b, h, n, p, chunk, seed):
    gen = torch.Generator().manual_seed(seed)
    block_map = torch.rand(b, h, n, n, generator=gen) < p
    block_map[..., 1, :] = False
    block_map[..., :, 2 % n] = False
    qidx, qnum = map_to_index(block_map)
    kidx, knum = invert_indices(qidx, qnum, n)
    qoff, want = pair_slots(qidx, qnum, kidx, n)
    r = b * h * n
    k2, q2 = kidx.to(torch.int32).reshape(r, -1).contiguous(), qidx.to(torch.int32).reshape(r, -1).contiguous()
    kn, qn = knum.to(torch.int32).reshape(r).contiguous(), qnum.to(torch.int32).reshape(r).contiguous()
    got = torch.full_like(k2, -7)
    pair_slots_triton(k2, kn, q2, qn, qoff.contiguous(), got, n, chunk=chunk)
    valid = torch.arange(k2.shape[1])[None, :] < kn[:, None]
    assert torch.equal(got[valid], want[valid])
    assert (got[~valid] == -7).all()  # slots past a count untouched


def test_bad_shapes_are_refused():
    z = torch.zeros(6, 3, dtype=torch.int32)
    n = torch.zeros(6, dtype=torch.int32)
    with pytest.raises(ValueError, match="multiple of nb"):
        pair_slots_triton(z, n, z, n, n, z.clone(), 4)
    with pytest.raises(ValueError, match="expected slots"):
        pair_slots_triton(z, n, z, n, n, torch.zeros(6, 2, dtype=torch.int32), 3)
