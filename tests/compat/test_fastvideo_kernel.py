"""The fastvideo_kernel drop-in: names, aliasing, FastVideo's call conventions (returns, int
block_size as a cube edge, block inference, non-bool maps, lse_format), FastVideo's route
variables, and that every function computes what our own API computes (bitwise: the compat
layer adds no arithmetic except the LSE conversion, checked against the fp32 reference).

Tolerance: fp32 on the CPU interpreter measures ~1e-6 against the fp32 reference; 1e-4 headroom.
"""

import logging
import math
import os
import sys

import pytest
import torch

import fastvideo_cute as fvc
import fastvideo_cute.compat.fastvideo_kernel as fk
from fastvideo_cute.compat import install_as_fastvideo_kernel
from fastvideo_cute.compat.fastvideo_kernel import _env
from fastvideo_cute.reference import block_sparse_attn_reference
from fastvideo_cute.routes import RouteError

from ..conftest import HAS_CUDA

DEV = "cuda" if HAS_CUDA else "cpu"
TOL = 1e-4 if not HAS_CUDA else 2e-2
ENV = ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND", "FASTVIDEO_VSA_TK",
       "FASTVIDEO_KERNEL_VSA_FORCE_TRITON", "FASTVIDEO_VSA_SM100A")

# FastVideo 0.3.5's VSA exports (its __init__), read from its source.
FASTVIDEO_VSA_NAMES = ["video_sparse_attn", "video_sparse_attn_bshd", "block_sparse_attn",
                       "block_sparse_attn_from_indices", "block_sparse_attn_varlen", "VSA_TILE_SIZE",
                       "get_tile_partition_indices", "get_reverse_tile_partition_indices",
                       "construct_variable_block_sizes", "get_non_pad_index", "build_vsa_metadata", "__version__"]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def _qkv(b, h, sq, skv, d=32, bshd=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = ((b, sq, h, d), (b, skv, h, d)) if bshd else ((b, h, sq, d), (b, h, skv, d))
    return tuple(torch.randn(s, generator=g).to(DEV) for s in (shapes[0], shapes[1], shapes[1]))


# ---------------------------------------------------------------- names and aliasing


def test_fastvideo_vsa_names_and_submodules_exist():
    for name in FASTVIDEO_VSA_NAMES:
        assert hasattr(fk, name), name
    from fastvideo_cute.compat.fastvideo_kernel.block_sparse_attn_256 import block_sparse_attn_256  # noqa: F401
    from fastvideo_cute.compat.fastvideo_kernel.ops import video_sparse_attn_bshd  # noqa: F401


def test_non_vsa_names_are_refused_with_the_reason():
    with pytest.raises(AttributeError, match="sliding-tile attention"):
        fk.sliding_tile_attention  # noqa: B018
    with pytest.raises(ImportError):
        from fastvideo_cute.compat.fastvideo_kernel import moba_attn_varlen  # noqa: F401
    assert not hasattr(fk, "int8_quant")


def test_install_as_fastvideo_kernel(monkeypatch):
    for name in [n for n in sys.modules if n == "fastvideo_kernel" or n.startswith("fastvideo_kernel.")]:
        monkeypatch.delitem(sys.modules, name)
    module = install_as_fastvideo_kernel()
    assert install_as_fastvideo_kernel() is module is fk  # idempotent
    import fastvideo_kernel
    from fastvideo_kernel import video_sparse_attn
    from fastvideo_kernel.vsa_utils import build_vsa_metadata
    from fastvideo_kernel.block_sparse_attn_varlen import block_sparse_attn_varlen
    assert fastvideo_kernel is fk and video_sparse_attn is fk.video_sparse_attn
    assert build_vsa_metadata is fk.build_vsa_metadata and block_sparse_attn_varlen is fk.block_sparse_attn_varlen
    for name in list(sys.modules):
        if name.startswith("fastvideo_kernel"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "fastvideo_kernel", type(sys)("fastvideo_kernel"))  # "FastVideo's own"
    with pytest.raises(RuntimeError, match="already imported"):
        install_as_fastvideo_kernel()
    assert install_as_fastvideo_kernel(replace=True) is fk and sys.modules["fastvideo_kernel"] is fk


# ---------------------------------------------------------------- block-sparse


def test_block_sparse_attn_returns_ours_and_log2_lse():
    q, k, v = _qkv(1, 2, 128, 192, seed=1)
    sizes = torch.tensor([64, 20, 64], dtype=torch.int32, device=DEV)
    block_map = torch.tensor([[[1, 0, 1], [0, 0, 0]], [[0, 1, 1], [1, 1, 0]]], dtype=torch.int8, device=DEV)
    out, lse = fk.block_sparse_attn(q, k, v, block_map, sizes)  # an int map is read as != 0
    ours, ours_lse = fvc.block_sparse_attn(q, k, v, block_map != 0, sizes)
    assert torch.equal(out, ours) and torch.equal(lse, ours_lse)
    _, m = fk.block_sparse_attn(q, k, v, block_map, sizes, lse_format="log2")
    _, ref_lse = block_sparse_attn_reference(q, k, v, block_map != 0, sizes, 64)
    finite = torch.isfinite(ref_lse)
    # FastVideo's Triton M: log2 of the softmax denominator, i.e. lse / ln 2
    torch.testing.assert_close(m[finite], ref_lse[finite] / math.log(2), atol=TOL, rtol=TOL)
    assert torch.isneginf(m[~finite]).all() and (~finite).any()
    with pytest.raises(ValueError, match="lse_format must be 'ln' or 'log2'"):
        fk.block_sparse_attn(q, k, v, block_map, sizes, lse_format="log10")


def test_block_inferred_from_kv_length_and_sizes():
    q, k, v = _qkv(1, 1, 256, 256, seed=2)
    sizes = torch.tensor([128, 100], dtype=torch.int32, device=DEV)
    block_map = torch.tensor([[[True, False], [True, True]]], device=DEV)
    out, lse = fk.block_sparse_attn(q, k, v, block_map, sizes)
    ours = fvc.block_sparse_attn_128(q, k, v, block_map, sizes)
    assert torch.equal(out, ours[0]) and torch.equal(lse, ours[1])
    with pytest.raises(ValueError, match="must be a block size"):
        fk.block_sparse_attn(q, k, v, block_map, torch.tensor([64, 64, 64], dtype=torch.int32, device=DEV))


def test_from_indices_with_fastvideo_style_lists():
    q, k, v = _qkv(2, 1, 128, 128, seed=3)
    sizes = torch.tensor([64, 33], dtype=torch.int32, device=DEV)
    idx = torch.tensor([[[[1, 0], [1, -1]]], [[[0, -1], [-1, -1]]]], dtype=torch.int32, device=DEV)
    num = torch.tensor([[[2, 1]], [[1, 0]]], dtype=torch.int32, device=DEV)
    block_map = torch.tensor([[[[True, True], [False, True]]], [[[True, False], [False, False]]]], device=DEV)
    out, lse = fk.block_sparse_attn_from_indices(q, k, v, idx, num, sizes)
    ours = fvc.block_sparse_attn(q, k, v, block_map, sizes)
    assert torch.equal(out, ours[0]) and torch.equal(lse, ours[1])
    _, m = fk.block_sparse_attn_from_indices(q, k, v, idx, num, sizes, lse_format="log2")
    assert torch.equal(m, lse * 1.4426950408889634)
    dup = idx.clone()
    dup[1, 0, 0] = torch.tensor([0, 0], dtype=torch.int32)
    num2 = num.clone()
    num2[1, 0, 0] = 2
    with pytest.raises(ValueError, match=r"lists a kv block twice in row \[1, 0, 0\]"):
        fk.block_sparse_attn_from_indices(q, k, v, dup, num2, sizes)


@pytest.mark.parametrize("name,block,bshd", [("block_sparse_attn_128", 128, False),
                                             ("block_sparse_attn_256_bshd", 256, True)])
def test_128_256_module(name, block, bshd):
    from fastvideo_cute.compat.fastvideo_kernel import block_sparse_attn_256 as mod
    q, k, v = _qkv(1, 2, block, 2 * block, bshd=bshd, seed=4)
    sizes = torch.tensor([block, 7], dtype=torch.int32, device=DEV)
    block_map = torch.tensor([[[True, True]], [[False, True]]], device=DEV)
    out, lse = getattr(mod, name)(q, k, v, block_map.float(), sizes)
    ours = getattr(fvc, name)(q, k, v, block_map, sizes)
    assert torch.equal(out, ours[0]) and torch.equal(lse, ours[1])


# ---------------------------------------------------------------- VSA


def _vsa_inputs(bshd, seed=5):
    q, k, v = _qkv(1, 2, 192, 192, bshd=bshd, seed=seed)
    kv_sizes = torch.tensor([64, 40, 64], dtype=torch.int32, device=DEV)
    q_sizes = torch.tensor([64, 64, 23], dtype=torch.int32, device=DEV)
    return q, k, v, kv_sizes, q_sizes


@pytest.mark.parametrize("bshd", [False, True])
def test_video_sparse_attn_int_block_is_a_cube_edge(bshd):
    q, k, v, kv_sizes, q_sizes = _vsa_inputs(bshd)
    gate = torch.randn_like(q)
    fn, ours_fn = (fk.video_sparse_attn_bshd, fvc.video_sparse_attn_bshd) if bshd else (fk.video_sparse_attn,
                                                                                      fvc.video_sparse_attn)
    ours = ours_fn(q, k, v, kv_sizes, q_sizes, 2, block_size=(4, 4, 4), compress_attn_weight=gate)
    assert torch.equal(fn(q, k, v, kv_sizes, q_sizes, 2, block_size=4, compress_attn_weight=gate), ours)
    assert torch.equal(fn(q, k, v, kv_sizes, q_sizes, 2, compress_attn_weight=gate), ours)  # default (4, 4, 4)
    assert torch.equal(fn(q, k, v, kv_sizes, q_sizes, torch.tensor(2).item(), (2, 4, 8), gate), ours)
    with pytest.raises(ValueError, match="an int block_size is a cube edge"):
        fn(q, k, v, kv_sizes, q_sizes, 2, block_size=64)


def _fastvideo_vsa_formula(q, k, v, kv_sizes, q_sizes, topk, be, gate):
    """FastVideo 0.3.5's video_sparse_attn as its code computes it (BHSD): block sums over every
    slot divided by the valid count and cast to the input dtype, softmax over all kv blocks,
    top-k on the scores, block-sparse branch, ``out_c * gate + out_s``; fp32 torch here."""
    from fastvideo_cute.reference import topk_block_map_reference

    b, h, s, d = q.shape

    def means(x, sizes):
        n = x.shape[2] // be
        return (x.reshape(b, h, n, be, d).float().sum(3) / sizes.view(1, 1, -1, 1)).to(x.dtype)

    qc, kc, vc = means(q, q_sizes), means(k, kv_sizes), means(v, kv_sizes)
    scores = qc @ kc.transpose(-2, -1) / d ** 0.5
    out_c = (torch.softmax(scores, -1) @ vc).repeat_interleave(be, dim=2)
    out_s, _ = block_sparse_attn_reference(q, k, v, topk_block_map_reference(scores, topk), kv_sizes, be)
    return out_c * gate + out_s


def test_video_sparse_attn_matches_fastvideo_formula_where_they_agree():
    """fp32 inputs, zero padding, no empty block: FastVideo's compression equals ours, so the
    outputs and the gradients of real tokens agree; padding slots' gradients are the documented
    difference (broadcast there, 0 here)."""
    q, k, v, kv_sizes, q_sizes = _vsa_inputs(False, seed=10)
    be = 64
    for x, sizes in ((q, q_sizes), (k, kv_sizes), (v, kv_sizes)):
        for j, n in enumerate(sizes.tolist()):
            x[:, :, j * be + n:(j + 1) * be] = 0
    gate = torch.rand_like(q)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ours = fk.video_sparse_attn(*leaves, kv_sizes, q_sizes, 2, 4, gate)
    theirs = _fastvideo_vsa_formula(*leaves, kv_sizes, q_sizes, 2, be, gate)
    torch.testing.assert_close(ours, theirs, atol=TOL, rtol=TOL)
    pad_q, pad_kv = ((torch.arange(be, device=DEV)[None, :] >= s[:, None]).reshape(-1) for s in (q_sizes, kv_sizes))
    grad = torch.randn_like(ours)
    grad[:, :, pad_q] = 0  # a caller drops padding rows (from_tiles), so no gradient enters there
    g_ours = torch.autograd.grad(ours, leaves, grad)
    g_theirs = torch.autograd.grad(theirs, leaves, grad)
    for i, pad in ((0, pad_q), (1, pad_kv), (2, pad_kv)):
        torch.testing.assert_close(g_ours[i][:, :, ~pad], g_theirs[i][:, :, ~pad], atol=10 * TOL, rtol=10 * TOL)
        assert (g_ours[i][:, :, pad] == 0).all() and (g_theirs[i][:, :, pad] != 0).any()


def test_video_sparse_attn_accepts_numpy_topk():
    np = pytest.importorskip("numpy")
    q, k, v, kv_sizes, q_sizes = _vsa_inputs(False)
    assert torch.equal(fk.video_sparse_attn(q, k, v, kv_sizes, q_sizes, np.int64(1)),
                       fvc.video_sparse_attn(q, k, v, kv_sizes, q_sizes, 1))


# ---------------------------------------------------------------- route variables


def test_overrides_table(monkeypatch):
    assert _env.overrides() == {}
    monkeypatch.setenv("FASTVIDEO_KERNEL_VSA_FORCE_TRITON", "1")
    assert _env.overrides() == {"FASTVIDEO_VSA_TRITON": "1"}
    monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", "1")
    assert _env.overrides() == {"FASTVIDEO_VSA_TRITON": "1", "FASTVIDEO_VSA_CUTEDSL": None}
    monkeypatch.delenv("FASTVIDEO_KERNEL_VSA_FORCE_TRITON")
    monkeypatch.delenv("FASTVIDEO_VSA_CUTEDSL")
    monkeypatch.setenv("FASTVIDEO_VSA_TK", "1")
    assert _env.overrides() == {"FASTVIDEO_VSA_CUTEDSL": "1"}
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "triton")  # our explicit choice wins over TK
    assert _env.overrides() == {}


def test_force_triton_wins_over_cutedsl_as_in_fastvideo(monkeypatch):
    q, k, v = _qkv(1, 1, 64, 64, seed=6)
    m = torch.ones(1, 1, 1, dtype=torch.bool, device=DEV)
    s = torch.full((1,), 64, dtype=torch.int32, device=DEV)
    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", "1")
    with pytest.raises(RouteError, match="both set"):
        fvc.block_sparse_attn(q, k, v, m, s)  # our own API refuses the pair
    out, _ = fk.block_sparse_attn(q, k, v, m, s)  # FastVideo's rule: Triton
    assert os.environ["FASTVIDEO_VSA_CUTEDSL"] == "1"  # restored after the call
    with monkeypatch.context() as mp:
        mp.delenv("FASTVIDEO_VSA_CUTEDSL")
        assert torch.equal(out, fvc.block_sparse_attn(q, k, v, m, s)[0])


def test_tk_asks_for_our_cute_route(monkeypatch, caplog):
    from fastvideo_cute import routes
    monkeypatch.setattr(routes, "_LOGGED", set())
    monkeypatch.setenv("FASTVIDEO_VSA_TK", "1")
    q, k, v = _qkv(1, 1, 64, 64, seed=7)  # fp32: no CuTe backend serves it, so the request falls back, logged
    m = torch.ones(1, 1, 1, dtype=torch.bool, device=DEV)
    s = torch.full((1,), 64, dtype=torch.int32, device=DEV)
    with caplog.at_level(logging.WARNING, logger="fastvideo_cute"):
        out, _ = fk.block_sparse_attn(q, k, v, m, s)
    assert any("CuTe route cannot serve" in r.getMessage() for r in caplog.records)
    assert "FASTVIDEO_VSA_CUTEDSL" not in os.environ
    assert torch.isfinite(out).all()


# ---------------------------------------------------------------- torch.compile


@pytest.mark.parametrize("which", ["bsa_log2", "vsa_int_block", "varlen"])
def test_torch_compile_fullgraph_traces(which):
    torch._dynamo.reset()
    s = torch.tensor([64, 30], dtype=torch.int32, device=DEV)
    if which == "varlen":
        q, k, v = (x[0].transpose(0, 1)[:94].contiguous() for x in _qkv(1, 1, 128, 128, seed=8))
        idx = [torch.tensor([[[[0, -1]]]], dtype=torch.int32, device=DEV),
               torch.tensor([[[[0]]]], dtype=torch.int32, device=DEV)]
        num = [torch.ones(1, 1, 1, dtype=torch.int32, device=DEV)] * 2
        vbs = [s[:1], s[1:]]
        cu = torch.tensor([0, 64, 94], dtype=torch.int32, device=DEV)
        fn = lambda q, k, v: fk.block_sparse_attn_varlen(q, k, v, cu, cu, idx, num, vbs, vbs)  # noqa: E731
    else:
        q, k, v = _qkv(1, 1, 128, 128, seed=8)
        m = torch.ones(1, 1, 2, 2, dtype=torch.bool, device=DEV)
        if which == "bsa_log2":
            fn = lambda q, k, v: fk.block_sparse_attn(q, k, v, m, s, lse_format="log2")[1]  # noqa: E731
        else:
            fn = lambda q, k, v: fk.video_sparse_attn(q, k, v, s, s, 1, 4)  # noqa: E731
    eager = fn(q, k, v)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v)
    assert torch.equal(compiled, eager)


def test_inference_mode_metadata_is_accepted():
    """FastVideo may build its sizes under torch.inference_mode (inference tensors have no
    version counter); the compat functions accept them and compute the same result."""
    q, k, v, kv_sizes, q_sizes = _vsa_inputs(False, seed=9)
    want = fk.video_sparse_attn(q, k, v, kv_sizes, q_sizes, 2)
    want_bsa = fk.block_sparse_attn(q, k, v, torch.ones(2, 3, 3, dtype=torch.bool, device=DEV), kv_sizes)[0]
    with torch.inference_mode():
        kv_i, q_i = kv_sizes.clone(), q_sizes.clone()
        assert kv_i.is_inference()
        assert torch.equal(fk.video_sparse_attn(q, k, v, kv_i, q_i, 2), want)
        m = torch.ones(2, 3, 3, dtype=torch.bool, device=DEV)
        assert torch.equal(fk.block_sparse_attn(q, k, v, m, kv_i)[0], want_bsa)
