"""Varlen (fastvideo_cute/varlen.py): N packed sequences in one call equal each sequence run
alone, bit for bit on the Triton route (forward, LSE and gradients), cross-sequence map
entries are ignored, VSA's compression and top-k stay inside each sequence, bad cu_seqlens are
refused, and both functions trace under torch.compile(fullgraph=True).

Tolerances: where a comparison is not bitwise it is against fp32 torch (the reference, or the
per-sequence VSA whose compression runs over different tensor shapes): measured <= ~1e-6 on
the CPU interpreter in fp32; 1e-4 is headroom (1e-3 for gradients).
"""

import pytest
import torch

import fastvideo_cute as fvc
from fastvideo_cute import varlen
from fastvideo_cute.reference import (block_mean_reference, topk_block_map_reference,
                                      video_sparse_attn_reference)

from .conftest import HAS_CUDA

DEV = "cuda" if HAS_CUDA else "cpu"
TOL = 1e-4 if not HAS_CUDA else 2e-2  # tf32 dots on GPU


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND"):
        monkeypatch.delenv(name, raising=False)


def _batch(q_blocks, kv_blocks, block, h=2, d=32, dtype=torch.float32, seed=0):
    """Packed q/k/v [S, H, D] (leaf tensors), per-sequence sizes, cu_seqlens and maps."""
    g = torch.Generator().manual_seed(seed)
    sq, skv = sum(q_blocks) * block, sum(kv_blocks) * block
    q, k, v = (torch.randn(s, h, d, generator=g).to(DEV, dtype).requires_grad_(True) for s in (sq, skv, skv))
    kv_sizes = [torch.randint(1, block + 1, (n,), generator=g).to(DEV, torch.int32) for n in kv_blocks]
    q_sizes = [torch.randint(1, block + 1, (n,), generator=g).to(DEV, torch.int32) for n in q_blocks]
    maps = [(torch.rand(h, a, b, generator=g) > 0.4).to(DEV) for a, b in zip(q_blocks, kv_blocks)]
    cu = lambda ns: torch.tensor([0] + torch.cumsum(torch.tensor(ns), 0).tolist(), device=DEV) * block  # noqa: E731
    return q, k, v, kv_sizes, q_sizes, maps, cu(q_blocks).to(torch.int32), cu(kv_blocks).to(torch.int32)


def _pack_maps(maps, q_blocks, kv_blocks, cross):
    """Global [H, Qb, KVb] map with each sequence's map on the diagonal; off-diagonal = ``cross``."""
    h = maps[0].shape[0]
    out = torch.full((h, sum(q_blocks), sum(kv_blocks)), cross, dtype=torch.bool, device=DEV)
    qo = ko = 0
    for m, a, b in zip(maps, q_blocks, kv_blocks):
        out[:, qo:qo + a, ko:ko + b] = m
        qo, ko = qo + a, ko + b
    return out


def _slices(blocks, block):
    offs = [0] + torch.cumsum(torch.tensor(blocks), 0).tolist()
    return [slice(a * block, b * block) for a, b in zip(offs[:-1], offs[1:])]


BSA = {64: fvc.block_sparse_attn_bshd, 128: fvc.block_sparse_attn_128_bshd, 256: fvc.block_sparse_attn_256_bshd}


@pytest.mark.parametrize("block,q_blocks,kv_blocks", [(64, [2, 1, 3], [1, 3, 2]), (128, [1, 2], [2, 1])])
def test_block_sparse_varlen_equals_each_sequence_alone_bitwise(block, q_blocks, kv_blocks):
    q, k, v, kv_sizes, _, maps, cu_q, cu_kv = _batch(q_blocks, kv_blocks, block, seed=block)
    block_map = _pack_maps(maps, q_blocks, kv_blocks, cross=True)  # cross-sequence entries must be ignored
    sizes = torch.cat(kv_sizes)
    out, lse = varlen.block_sparse_attn_varlen(q, k, v, cu_q, cu_kv, block_map, sizes, block_size=block)
    assert out.shape == q.shape and lse.shape == (q.shape[1], q.shape[0]) and not lse.requires_grad
    grad = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    for sq, skv, m, s in zip(_slices(q_blocks, block), _slices(kv_blocks, block), maps, kv_sizes):
        qi, ki, vi = (x.detach()[sl].unsqueeze(0).requires_grad_(True) for x, sl in ((q, sq), (k, skv), (v, skv)))
        oi, li = BSA[block](qi, ki, vi, m, s)
        gi = torch.autograd.grad(oi, (qi, ki, vi), grad[sq].unsqueeze(0))
        assert torch.equal(out[sq], oi[0]) and torch.equal(lse[:, sq], li[0])
        for name, a, b in zip("qkv", (dq[sq], dk[skv], dv[skv]), gi):
            assert torch.equal(a, b[0]), f"d{name}"


def test_block_sparse_varlen_4d_map_and_empty_sequence_fp16():
    # Sequence 1 has no kv tokens at all: its queries see nothing (out 0, lse -inf).
    block, q_blocks = 64, [1, 1]  # kv blocks per sequence: [2, 0]
    q, k, v, kv_sizes, _, maps, cu_q, cu_kv = _batch(q_blocks, [2, 1], block, dtype=torch.float16, seed=2)
    k, v = k.detach()[:2 * block], v.detach()[:2 * block]
    cu_kv = torch.tensor([0, 2 * block, 2 * block], dtype=torch.int64, device=DEV)
    block_map = torch.ones(1, 2, 2, 2, dtype=torch.bool, device=DEV)
    out, lse = varlen.block_sparse_attn_varlen(q.detach(), k, v, cu_q, cu_kv, block_map, kv_sizes[0])
    alone, alone_lse = fvc.block_sparse_attn_bshd(q.detach()[:block].unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                                                  block_map[:, :, :1], kv_sizes[0])
    assert torch.equal(out[:block], alone[0]) and torch.equal(lse[:, :block], alone_lse[0])
    assert (out[block:] == 0).all() and torch.isneginf(lse[:, block:]).all()


def _vsa_alone(q, k, v, kv_s, q_s, topk, gate):
    """Each sequence through the public single-sequence VSA (BSHD, B = 1)."""
    return fvc.video_sparse_attn_bshd(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), kv_s, q_s, topk,
                                      block_size=(4, 4, 4),
                                      compress_attn_weight=None if gate is None else gate.unsqueeze(0))[0]


@pytest.mark.parametrize("gate,topk", [(True, 2), (False, [1, 3, 2])])
def test_video_sparse_varlen_matches_each_sequence_alone(gate, topk, monkeypatch):
    block, q_blocks, kv_blocks = 64, [2, 1, 2], [3, 2, 1]  # topk 2 / 3 exceeds some sequences' KVb
    q, k, v, kv_sizes, q_sizes, _, cu_q, cu_kv = _batch(q_blocks, kv_blocks, block, seed=11)
    kv_sizes[1][1] = 0  # an empty kv block inside sequence 1
    w = (torch.randn_like(q) * 0.5).requires_grad_(True) if gate else None
    seen = []
    real = varlen._BSHD_API[64]
    monkeypatch.setitem(varlen._BSHD_API, 64, lambda q, k, v, m, s: (seen.append(m), real(q, k, v, m, s))[1])
    out = varlen.video_sparse_attn_varlen(q, k, v, cu_q, cu_kv, torch.cat(kv_sizes), torch.cat(q_sizes), topk,
                                          compress_attn_weight=w)
    inputs = (q, k, v) + ((w,) if gate else ())
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, grad)
    (selected,) = seen
    topks = topk if isinstance(topk, list) else [topk] * 3
    qs, ks = _slices(q_blocks, block), _slices(kv_blocks, block)
    qbs, kbs = _slices(q_blocks, 1), _slices(kv_blocks, 1)
    # nothing selected across sequences
    assert not (selected & ~_pack_maps([torch.ones(2, a, b, dtype=torch.bool, device=DEV)
                                           for a, b in zip(q_blocks, kv_blocks)], q_blocks, kv_blocks, False)).any()
    for i in range(3):
        sq, skv = qs[i], ks[i]
        leaves = [x.detach()[sl].requires_grad_(True) for x, sl in ((q, sq), (k, skv), (v, skv))]
        wi = w.detach()[sq].requires_grad_(True) if gate else None
        alone = _vsa_alone(*leaves, kv_sizes[i], q_sizes[i], topks[i], wi)
        torch.testing.assert_close(out[sq], alone, atol=TOL, rtol=TOL)
        ref = video_sparse_attn_reference(*(x.transpose(0, 1).unsqueeze(0) for x in leaves), kv_sizes[i], q_sizes[i],
                                          topks[i], (4, 4, 4), None if wi is None else wi.transpose(0, 1)[None])
        torch.testing.assert_close(out[sq], ref[0].transpose(0, 1), atol=TOL, rtol=TOL)
        want = torch.autograd.grad(alone, leaves + ([wi] if gate else []), grad[sq])
        for name, g, r in zip("qkvw", (got[0][sq], got[1][skv], got[2][skv]) + ((got[3][sq],) if gate else ()), want):
            torch.testing.assert_close(g, r, atol=10 * TOL, rtol=10 * TOL, msg=f"d{name}")
        # the selection is exactly the per-sequence top-k of that sequence's coarse scores
        bhsd = [x.transpose(0, 1).unsqueeze(0).float() for x in leaves]
        qc = block_mean_reference(bhsd[0], q_sizes[i], block)
        kc = block_mean_reference(bhsd[1], kv_sizes[i], block)
        scores = (qc @ kc.transpose(-2, -1)).masked_fill((kv_sizes[i] == 0).view(1, 1, 1, -1), float("-inf"))
        want_map = topk_block_map_reference(scores, topks[i])[0]
        assert torch.equal(selected[:, qbs[i], kbs[i]], want_map), f"sequence {i} selection"


# ---------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("case,exc,match", [
    ("not_zero", ValueError, "cu_seqlens_q must start at 0"),
    ("decreasing", ValueError, "cu_seqlens_kv must be non-decreasing"),
    ("not_block", ValueError, "cu_seqlens_q must be multiples of the block size 64"),
    ("short", ValueError, "cu_seqlens_kv must end at the packed length 192"),
    ("float", TypeError, "cu_seqlens_q must be an int32 or int64 tensor"),
    ("count", ValueError, "the same number of sequences"),
    ("two_d", ValueError, r"cu_seqlens_kv must be 1-D \[N \+ 1\]"),
    ("q_2d", ValueError, r"q must be 3-D \[total_tokens, H, D\]"),
])
def test_bad_cu_seqlens_raise(case, exc, match):
    q, k, v, kv_sizes, _, maps, cu_q, cu_kv = _batch([1, 2], [2, 1], 64, seed=3)
    q, k, v = q.detach(), k.detach(), v.detach()
    if case == "not_zero":
        cu_q = cu_q + 1
    elif case == "decreasing":
        cu_kv = torch.tensor([0, 192, 128], dtype=torch.int32, device=DEV)
    elif case == "not_block":
        cu_q = torch.tensor([0, 60, 192], dtype=torch.int32, device=DEV)
    elif case == "short":
        cu_kv = torch.tensor([0, 64, 128], dtype=torch.int32, device=DEV)
    elif case == "float":
        cu_q = cu_q.float()
    elif case == "count":
        cu_kv = torch.tensor([0, 192], dtype=torch.int32, device=DEV)
    elif case == "two_d":
        cu_kv = cu_kv[None]
    elif case == "q_2d":
        q = q[:, 0]
    block_map = _pack_maps(maps, [1, 2], [2, 1], cross=False)
    with pytest.raises(exc, match=match):
        varlen.block_sparse_attn_varlen(q, k, v, cu_q, cu_kv, block_map, torch.cat(kv_sizes))
    if case not in ("q_2d",):
        with pytest.raises(exc, match=match):
            varlen.video_sparse_attn_varlen(q, k, v, cu_q, cu_kv, torch.cat(kv_sizes),
                                            torch.full((3,), 64, dtype=torch.int32, device=DEV), 1)


def test_bad_topk_and_gate_raise():
    q, k, v, kv_sizes, q_sizes, _, cu_q, cu_kv = _batch([1, 1], [1, 1], 64, seed=4)
    args = (q.detach(), k.detach(), v.detach(), cu_q, cu_kv, torch.cat(kv_sizes), torch.cat(q_sizes))
    with pytest.raises(ValueError, match="one int per sequence"):
        varlen.video_sparse_attn_varlen(*args, [1, 2, 3])
    with pytest.raises(ValueError, match="topk must hold positive ints"):
        varlen.video_sparse_attn_varlen(*args, [1, 0])
    with pytest.raises(ValueError, match="positive int"):
        varlen.video_sparse_attn_varlen(*args, 0)
    with pytest.raises(TypeError, match="compress_attn_weight must have q's dtype"):
        varlen.video_sparse_attn_varlen(*args, 1, compress_attn_weight=q.detach().half())
    with pytest.raises(ValueError, match="256 elements"):
        varlen.video_sparse_attn_varlen(*args, 1, block_size=(4, 4, 3))


def test_cu_seqlens_value_check_runs_once(monkeypatch):
    calls = []
    real = varlen._check_cu_values
    monkeypatch.setattr(varlen, "_check_cu_values", lambda *a: (calls.append(1), real(*a))[1])
    q, k, v, kv_sizes, _, maps, cu_q, cu_kv = _batch([1, 1], [1, 1], 64, seed=5)
    block_map = _pack_maps(maps, [1, 1], [1, 1], cross=False)
    sizes = torch.cat(kv_sizes)
    with torch.no_grad():
        for _ in range(2):
            varlen.block_sparse_attn_varlen(q, k, v, cu_q, cu_kv, block_map, sizes)
    assert len(calls) == 1


# ---------------------------------------------------------------- torch.compile


@pytest.mark.parametrize("which", ["bsa", "vsa"])
def test_torch_compile_fullgraph_traces(which):
    torch._dynamo.reset()
    q, k, v, kv_sizes, q_sizes, maps, cu_q, cu_kv = _batch([1, 2], [2, 1], 64, seed=6)
    q, k, v = q.detach(), k.detach(), v.detach()
    sizes, qsizes = torch.cat(kv_sizes), torch.cat(q_sizes)
    block_map = _pack_maps(maps, [1, 2], [2, 1], cross=True)
    if which == "bsa":
        fn = lambda q, k, v, cq, ck: varlen.block_sparse_attn_varlen(q, k, v, cq, ck, block_map, sizes)[0]  # noqa
    else:
        fn = lambda q, k, v, cq, ck: varlen.video_sparse_attn_varlen(q, k, v, cq, ck, sizes, qsizes, [1, 2])  # noqa
    eager = fn(q, k, v, cu_q, cu_kv)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v, cu_q, cu_kv)
    torch.testing.assert_close(compiled, eager, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------- GPU (bf16, Wan-sized)


@pytest.mark.gpu
def test_gpu_wan_sized_varlen_bf16_bitwise_vs_alone(monkeypatch):
    """Two Wan-1.3B clips (latent 21x30x52 and 13x30x52, 64-token tiles, 12 heads of 128)
    packed: varlen forward + backward equal each clip run alone, bit for bit (Triton: the
    default route's cuDNN backward accumulates with atomics, so it is not bitwise run to run)."""
    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    monkeypatch.delenv("FASTVIDEO_VSA_CUTEDSL", raising=False)
    monkeypatch.delenv("FASTVIDEO_VSA_BACKEND", raising=False)
    torch.manual_seed(0)
    grids, tile, h, d = [(21, 30, 52), (13, 30, 52)], (4, 4, 4), 12, 128
    sizes = [fvc.variable_block_sizes(g, tile, device="cuda") for g in grids]
    blocks = [s.numel() for s in sizes]
    topks = [max(1, round(0.125 * n)) for n in blocks]
    xs = [fvc.to_tiles(torch.randn(1, g[0] * g[1] * g[2], h, d, device="cuda", dtype=torch.bfloat16), g, tile, dim=1)[0]
          for g in grids for _ in range(3)]
    qs, ks, vs = xs[0::3], xs[1::3], xs[2::3]
    q, k, v = (torch.cat(t).requires_grad_(True) for t in (qs, ks, vs))
    cu = torch.tensor([0, blocks[0] * 64, (blocks[0] + blocks[1]) * 64], dtype=torch.int32, device="cuda")
    maps = [fvc.topk_block_map(torch.rand(h, n, n, device="cuda"), t) for n, t in zip(blocks, topks)]
    block_map = torch.zeros(h, sum(blocks), sum(blocks), dtype=torch.bool, device="cuda")
    block_map[:, :blocks[0], :blocks[0]] = maps[0]
    block_map[:, blocks[0]:, blocks[0]:] = maps[1]
    out, lse = varlen.block_sparse_attn_varlen(q, k, v, cu, cu, block_map, torch.cat(sizes))
    grad = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    for i, sl in enumerate(_slices(blocks, 64)):
        qi, ki, vi = (t.detach().unsqueeze(0).requires_grad_(True) for t in (qs[i], ks[i], vs[i]))
        oi, li = fvc.block_sparse_attn_bshd(qi, ki, vi, maps[i], sizes[i])
        gi = torch.autograd.grad(oi, (qi, ki, vi), grad[sl].unsqueeze(0))
        assert torch.equal(out[sl], oi[0]) and torch.equal(lse[:, sl], li[0])
        for a, b in zip((dq[sl], dk[sl], dv[sl]), gi):
            assert torch.equal(a, b[0])
    vout = varlen.video_sparse_attn_varlen(q.detach(), k.detach(), v.detach(), cu, cu, torch.cat(sizes),
                                           torch.cat(sizes), topks)
    flipped = total = 0
    for i, sl in enumerate(_slices(blocks, 64)):
        alone = _vsa_alone(qs[i], ks[i], vs[i], sizes[i], sizes[i], topks[i], None)
        # Same fp32 compression over different shapes: the outputs agree to bf16 rounding (|out| <= ~4:
        # 3e-2 covers an ulp) except in a q block whose top-k choice flipped on a near-tie of coarse
        # scores that rounded differently; those must be rare (<= 0.5 % of q blocks x heads).
        diff = (vout[sl].float() - alone.float()).abs().reshape(blocks[i], 64, h, d).amax(dim=(1, 3))
        flipped += int((diff > 3e-2 + 3e-2 * alone.float().abs().max()).sum())
        total += diff.numel()
    assert flipped <= 0.005 * total, f"{flipped} of {total} (q block, head) pairs differ"


def _sync_free_case():
    q, k, v, kv_sizes, q_sizes, maps, cu_q, cu_kv = _batch([2, 1, 3], [1, 3, 2], 64, h=2, d=64,
                                                           dtype=torch.bfloat16, seed=9)
    return q, k, v, torch.cat(kv_sizes), torch.cat(q_sizes), _pack_maps(maps, [2, 1, 3], [1, 3, 2], True), cu_q, cu_kv


@pytest.mark.gpu
def test_gpu_public_bshd_call_does_not_synchronise():
    """Baseline for the varlen test below: the public map API itself, after a warm-up call."""
    q, k, v, sizes, _, block_map, _, _ = _sync_free_case()
    args = (q[:64].unsqueeze(0), k[:64].unsqueeze(0), v[:64].unsqueeze(0), block_map[:, :1, :1], sizes[:1])
    fvc.block_sparse_attn_bshd(*args)[0].sum().backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out, _ = fvc.block_sparse_attn_bshd(*args)
        out.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.gpu
def test_gpu_varlen_calls_do_not_synchronise():
    """After a warm-up call (kernels built, offsets and sizes checked once), a varlen forward
    and backward issue no host synchronisation (torch raises on any under sync-debug "error")."""
    q, k, v, sizes, q_sizes, block_map, cu_q, cu_kv = _sync_free_case()

    def run():
        out, _ = varlen.block_sparse_attn_varlen(q, k, v, cu_q, cu_kv, block_map, sizes)
        vout = varlen.video_sparse_attn_varlen(q, k, v, cu_q, cu_kv, sizes, q_sizes, [1, 2, 1])
        torch.autograd.grad(out.float().sum() + vout.float().sum(), (q, k, v))

    run()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run()
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_bench_varlen_smoke(tmp_path):
    """The benchmark script runs end to end on tiny shapes and records packed == one by one."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import bench_varlen
    finally:
        sys.path.pop(0)
    out = tmp_path / "varlen.json"
    bench_varlen.main(["--smoke", "--entries", "bsa", "compat", "--modes", "fwd", "--out", str(out)])
    data = json.loads(out.read_text())
    assert [e["entry"] for e in data["entries"]] == ["bsa", "compat"]
    assert all(e["bitwise_equal"] for e in data["entries"])
    assert all(e["fwd"]["packed"]["median_ms"] > 0 for e in data["entries"])
