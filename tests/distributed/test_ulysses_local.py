"""Ulysses pieces that need no process group: the sharding views, head chunks, group resolution,
and the pass-through when there is no group (world size 1)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import fastvideo_cute as fvc
import fastvideo_cute.distributed as fvd
from fastvideo_cute.distributed import exchange as ex
from fastvideo_cute.distributed import group as grp
from fastvideo_cute.distributed.pipeline import chunk_bounds


@pytest.mark.parametrize("bshd", [False, True])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_views_describe_the_all_to_all(bshd, world):
    """With X the global tensor, rank j's sequence slice and rank r's head slice: what j sends to
    r (heads_view(local_j)[r]) is exactly what r files under j (seq_view(full_r)[j])."""
    b, h, s, d = 2, 8, 12, 3
    x = torch.randn((b, s, h, d) if bshd else (b, h, s, d))
    s_dim, h_dim = (1, 2) if bshd else (2, 1)
    local = [x.narrow(s_dim, j * s // world, s // world) for j in range(world)]
    full = [x.narrow(h_dim, r * h // world, h // world) for r in range(world)]
    for j in range(world):
        for r in range(world):
            sent = ex.heads_view(local[j], world, bshd)[r]
            filed = ex.seq_view(full[r], world, bshd)[j]
            assert sent.shape == filed.shape
            assert torch.equal(sent, filed)
            # both are views of x (the packing reads them in place; no copy before the buffer)
            assert sent.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
            assert filed.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_head_slice_picks_heads_of_a_chunk():
    x = torch.arange(2 * 6 * 4 * 1).reshape(2, 6, 4, 1).float()  # BHSD, H=6
    v = ex.heads_view(x, 2, False)  # [2, B, 3, S, 1]
    part = ex.head_slice(v, 1, 3, False)
    assert torch.equal(part[1], x[:, 4:6])


def test_chunk_bounds_cover_heads_in_order():
    assert chunk_bounds(5, 2) == ((0, 2), (2, 5))
    assert chunk_bounds(4, 4) == ((0, 1), (1, 2), (2, 3), (3, 4))
    assert chunk_bounds(20, 1) == ((0, 20),)


def test_group_resolution_without_a_process_group():
    assert not dist.is_initialized()
    info = grp.resolve_group(None, torch.device("cpu"))
    assert (info.size, info.rank) == (1, 0)
    with pytest.raises(ValueError, match="torch.distributed is not initialized"):
        grp.resolve_group(object(), torch.device("cpu"))


def _fake_dist(monkeypatch, size, rank, backend):
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: size)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: rank)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)


def test_nccl_group_with_cpu_tensors_is_rejected(monkeypatch):
    _fake_dist(monkeypatch, 2, 0, "nccl")
    with pytest.raises(ValueError, match="NCCL backend, which moves CUDA tensors only"):
        grp.resolve_group(None, torch.device("cpu"))
    _fake_dist(monkeypatch, 2, 0, "cuda:nccl")
    with pytest.raises(ValueError, match="no backend for cpu tensors"):
        grp.resolve_group(None, torch.device("cpu"))
    _fake_dist(monkeypatch, 2, 1, "cpu:gloo,cuda:nccl")
    assert grp.resolve_group(None, torch.device("cpu")).rank == 1


def test_non_member_is_rejected(monkeypatch):
    _fake_dist(monkeypatch, -1, -1, "gloo")
    with pytest.raises(ValueError, match="not a member of group"):
        grp.resolve_group(object(), torch.device("cpu"))


def test_heads_not_divisible_names_heads_and_group_size(monkeypatch):
    """Raised from the local checks, before anything is sent (all_to_all_single would raise)."""
    _fake_dist(monkeypatch, 3, 0, "gloo")
    monkeypatch.setattr(dist, "all_to_all_single", lambda *a, **k: pytest.fail("communicated"))
    q = torch.randn(1, 64, 4, 32)
    sizes = torch.full((3,), 64, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"heads \(4\) must be divisible by the sequence-parallel group size \(3\)"):
        fvd.ulysses_video_sparse_attn(q, q, q, sizes, sizes, 1, 64, layout="bshd")
    with pytest.raises(ValueError, match=r"heads \(4\) must be divisible"):
        fvd.ulysses_block_sparse_attn_bshd(q, q, q, torch.ones(4, 3, 3, dtype=torch.bool), sizes)


def test_no_group_is_a_zero_copy_pass_through(monkeypatch, device):
    """World size 1: the single-GPU function, called as is (same output and gradients, bit for
    bit; nothing packed, nothing communicated)."""
    monkeypatch.setattr(dist, "all_to_all_single", lambda *a, **k: pytest.fail("communicated"))
    monkeypatch.setattr(ex, "start", lambda *a, **k: pytest.fail("packed"))
    g = torch.Generator().manual_seed(5)
    q, k, v, gate, dout = (torch.randn(1, 1, 128, 32, generator=g).to(device) for _ in range(5))
    sizes = torch.tensor([64, 23], dtype=torch.int32, device=device)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, gate)]
    out = fvd.ulysses_video_sparse_attn(*leaves[:3], sizes, sizes, 1, 64, leaves[3])
    grads = torch.autograd.grad(out, leaves, dout)
    leaves2 = [t.clone().requires_grad_(True) for t in (q, k, v, gate)]
    ref = fvc.video_sparse_attn(*leaves2[:3], sizes, sizes, 1, 64, leaves2[3])
    ref_grads = torch.autograd.grad(ref, leaves2, dout)
    assert torch.equal(out, ref)
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))


def test_world_one_checks_still_apply():
    q = torch.randn(1, 1, 96, 32)
    sizes = torch.full((2,), 64, dtype=torch.int32)
    with pytest.raises(ValueError, match="positive whole number of 64-token tiles"):
        fvd.ulysses_video_sparse_attn(q, q, q, sizes, sizes, 1, 64)
    q = torch.randn(1, 1, 128, 32)
    with pytest.raises(ValueError, match="GLOBAL per-tile sizes"):
        fvd.ulysses_video_sparse_attn(q, q, q, sizes[:1], sizes, 1, 64)
    with pytest.raises(ValueError, match="block_size must have 64, 128 or 256 elements"):
        fvd.ulysses_video_sparse_attn(q, q, q, sizes, sizes, 1, (2, 2, 2))
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        fvd.ulysses_block_sparse_attn(None, q, q, torch.ones(1, 2, 2, dtype=torch.bool), sizes)


def test_empty_tiles_appended_leave_the_real_tokens_unchanged(device):
    """docs/distributed.md: padding the tiled sequence with size-0 tiles (to make it divide by the
    group size) leaves every real token's output as it was, up to fp32 rounding in the compression
    branch (its softmax and matmul run over more, zero-weight, columns), also when topk exceeds
    the real tile count. Tolerance: 1.2e-7 measured on the interpreter (1 ulp at |x| ~ 1), ~8x."""
    g = torch.Generator().manual_seed(9)
    b, h, d = 1, 1, 32
    x = [torch.randn(b, h, 192, d, generator=g).to(device) for _ in range(4)]
    pad = [torch.cat([t, torch.randn(b, h, 128, d, generator=g).to(device) * 100], dim=2) for t in x]
    sizes = torch.tensor([64, 40, 17], dtype=torch.int32, device=device)
    padded = torch.tensor([64, 40, 17, 0, 0], dtype=torch.int32, device=device)
    for topk in (2, 4):
        out = fvc.video_sparse_attn(*x[:3], sizes, sizes, topk, 64, x[3])
        out_pad = fvc.video_sparse_attn(*pad[:3], padded, padded, topk, 64, pad[3])
        torch.testing.assert_close(out_pad[:, :, :192], out, atol=1e-6, rtol=1e-6, msg=f"topk={topk}")
