"""CPU checks of the FA4 backend's tensor plumbing (``backends/fa4_backend.py``), with FA4's kernels
and metadata builders replaced by recorders: what it hands FA4 and what it returns.

The backward allocates the gradients contiguous in the call layout and lets FA4 write them through
their BSHD views. When FA4 allocated them itself, a call with partial kv tiles got dK/dV laid out
like the padding-zeroed BSHD copies and paid two transposing copies afterwards (303 of 5387 us on
the H200, ``benchmarks/results/prof_route_h200_v3_grid_bwd.json``); these tests fail if that
comes back (no copy: the returned gradients are the very storage FA4 wrote)."""

import pytest
import torch

from fastvideo_cute.backends import fa4_backend as FB


class _Recorder:
    def __init__(self):
        self.calls = []

    def bwd(self, q, k, v, out, dout, lse, meta, *, softmax_scale=None, dq=None, dk=None, dv=None):
        self.calls.append({"q": q, "k": k, "v": v, "dq": dq, "dk": dk, "dv": dv})
        for g, val in ((dq, 1.0), (dk, 2.0), (dv, 3.0)):
            g.fill_(val)  # what FA4 writes, through the view it was given
        return dq, dk, dv

    @staticmethod
    def zeroed(k, v, meta):  # the padding pass: contiguous BSHD copies, as the Triton kernel makes them
        copy = lambda x: x.clone(memory_format=torch.contiguous_format)  # noqa: E731
        return (None if k is None else copy(k)), copy(v)


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(FB, "fa4_block_sparse_bwd_prebuilt", rec.bwd)
    monkeypatch.setattr(FB, "zeroed_kv_padding", rec.zeroed)
    monkeypatch.setattr(FB, "build_bwd_metadata", lambda *a, **k: object())
    monkeypatch.setattr(FB, "fa4_bwd_plan", lambda *a, **k: None)
    monkeypatch.setattr(FB, "fa4_arch", lambda: (9, 0))
    return rec


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
@pytest.mark.parametrize("partial", [False, True], ids=["full", "partial"])
def test_backward_gradients_are_written_in_place_in_the_call_layout(recorder, monkeypatch, bshd, partial):
    monkeypatch.setattr(FB, "has_partial_blocks", lambda sizes, block: partial)
    b, h, s, d, block = 1, 2, 256, 64, 128
    shape = (b, s, h, d) if bshd else (b, h, s, d)
    q, k, v, out, dout = (torch.randn(shape) for _ in range(5))
    lse = torch.zeros(b, h, s)
    sizes = torch.tensor([block, 100], dtype=torch.int32)
    bm = torch.ones(b, h, 2, 2, dtype=torch.bool)
    grads = FB.FA4Backend().backward(q, k, v, out, dout, lse, bm, sizes, block_size=block, bshd=bshd, sm_scale=0.125)
    (call,) = recorder.calls
    for g, x, name, val in zip(grads, (q, k, v), ("dq", "dk", "dv"), (1.0, 2.0, 3.0)):
        assert g.shape == x.shape and g.is_contiguous(), (name, g.stride())
        view = call[name]
        assert view.data_ptr() == g.data_ptr(), f"{name}: FA4 wrote another tensor (a copy would follow)"
        assert view.shape == (b, s, h, d), (name, view.shape)  # FA4's BSHD
        assert (g == val).all(), name  # what FA4 wrote is what comes back
    # the inputs FA4 reads: BSHD views of the caller's tensors, or the padding pass's copies
    assert call["q"].shape == (b, s, h, d)
    assert (call["k"].data_ptr() == k.data_ptr()) == (not partial)
