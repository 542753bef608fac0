"""The reference against an independent brute force: per-row python softmax loops."""

import math

import torch

from fastvideo_cute.reference import (block_mean_reference, block_sparse_attn_reference,
                                      topk_block_map_reference)


def _brute(q, k, v, block_map, sizes, qb, kvb):
    B, H, Sq, D = q.shape
    out = torch.zeros(B, H, Sq, D, dtype=torch.float64)
    lse = torch.full((B, H, Sq), float("-inf"), dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(Sq):
                keys = [j for j in range(k.shape[2])
                        if block_map[b, h, i // qb, j // kvb] and (j % kvb) < int(sizes[j // kvb])]
                if not keys:
                    continue
                s = torch.stack([q[b, h, i].double() @ k[b, h, j].double() / math.sqrt(D) for j in keys])
                p = torch.softmax(s, 0)
                out[b, h, i] = sum(p[t] * v[b, h, j].double() for t, j in enumerate(keys))
                lse[b, h, i] = torch.logsumexp(s, 0)
    return out, lse


def test_reference_matches_brute_force_with_nan_padding():
    torch.manual_seed(0)
    q = torch.randn(2, 1, 8, 4)
    k = torch.randn(2, 1, 12, 4)
    v = torch.randn(2, 1, 12, 4)
    sizes = torch.tensor([4, 2, 0])
    k[:, :, 6:8] = float("nan")  # padding of block 1
    v[:, :, 8:12] = float("inf")  # block 2 is empty
    block_map = torch.rand(2, 1, 2, 3) > 0.3
    block_map[0, 0, 1] = False  # a query block with nothing selected
    out, lse = block_sparse_attn_reference(q, k, v, block_map, sizes, block_size=4)
    bo, bl = _brute(q, k, v, block_map, sizes, 4, 4)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), bo, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), bl, atol=1e-5, rtol=1e-5)
    assert (out[0, 0, 4:] == 0).all() and torch.isneginf(lse[0, 0, 4:]).all()


def test_reference_gradients_finite_and_zero_on_padding():
    torch.manual_seed(1)
    q = torch.randn(1, 2, 8, 4, requires_grad=True)
    k = torch.randn(1, 2, 8, 4, requires_grad=True)
    v = torch.randn(1, 2, 8, 4, requires_grad=True)
    sizes = torch.tensor([4, 1])
    block_map = torch.ones(1, 2, 2, 2, dtype=torch.bool)
    block_map[0, 1, 0] = False
    out, _ = block_sparse_attn_reference(q, k, v, block_map, sizes, block_size=4)
    out.sum().backward()
    for g in (q.grad, k.grad, v.grad):
        assert torch.isfinite(g).all()
    assert (k.grad[:, :, 5:] == 0).all() and (v.grad[:, :, 5:] == 0).all()
    assert (q.grad[0, 1, :4] == 0).all()


def test_block_mean_excludes_padding():
    x = torch.arange(2 * 8, dtype=torch.float32).view(1, 1, 8, 2)
    x[0, 0, 3] = float("nan")  # padding of block 0 (size 3)
    m = block_mean_reference(x, torch.tensor([3, 0]), 4)
    torch.testing.assert_close(m[0, 0, 0], x[0, 0, :3].mean(0))
    assert (m[0, 0, 1] == 0).all()


def test_topk_reference_exact_k_and_ties_low_index():
    s = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]])
    assert topk_block_map_reference(s, 2).tolist() == [[False, True, True, False, False]]
    assert topk_block_map_reference(s, 9).sum() == 5
    r = torch.randn(3, 7, 11)
    assert (topk_block_map_reference(r, 4).sum(-1) == 4).all()
