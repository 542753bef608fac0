"""Index-native entry points (fastvideo_cute/api_indices.py): bitwise equal to the map API for
the equivalent map (any list order, -1 fillers), correct against the fp32 reference, value
checks (range, counts, duplicates) raising before launch, the check's cache, torch.compile.

Tolerances: fp32 inputs on the CPU interpreter measure ~1e-6 against the fp32 reference
(tests/test_api.py); 1e-4 is headroom, 1e-3 for gradients.
"""

import pytest
import torch

import fastvideo_cute as fvc
from fastvideo_cute import api_indices as ai
from fastvideo_cute.metadata import map_to_index
from fastvideo_cute.reference import block_sparse_attn_reference

from .conftest import HAS_CUDA

DEV = "cuda" if HAS_CUDA else "cpu"
TOL = 1e-4 if not HAS_CUDA else 2e-2  # tf32 dots on GPU

MAP_API = {(64, False): fvc.block_sparse_attn, (64, True): fvc.block_sparse_attn_bshd,
           (128, False): fvc.block_sparse_attn_128, (128, True): fvc.block_sparse_attn_128_bshd,
           (256, False): fvc.block_sparse_attn_256, (256, True): fvc.block_sparse_attn_256_bshd}
LIST_API = {(64, False): ai.block_sparse_attn_from_indices, (64, True): ai.block_sparse_attn_bshd_from_indices,
            (128, False): ai.block_sparse_attn_128_from_indices,
            (128, True): ai.block_sparse_attn_128_bshd_from_indices,
            (256, False): ai.block_sparse_attn_256_from_indices,
            (256, True): ai.block_sparse_attn_256_bshd_from_indices}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND"):
        monkeypatch.delenv(name, raising=False)


def _qkv(b, h, sq, skv, d, bshd, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    sq_shape, skv_shape = ((b, sq, h, d), (b, skv, h, d)) if bshd else ((b, h, sq, d), (b, h, skv, d))
    return tuple(torch.randn(s, generator=g).to(DEV, dtype).requires_grad_(True)
                 for s in (sq_shape, skv_shape, skv_shape))


def _shuffled_lists(block_map, width_extra=1, seed=0):
    """FastVideo-style lists of a map: selected blocks in a random order, then -1 fillers."""
    g = torch.Generator().manual_seed(seed)
    idx, num = map_to_index(block_map)
    rows = idx.reshape(-1, idx.shape[-1]).clone()
    for r, n in zip(rows, num.reshape(-1).tolist()):
        r[:n] = r[:n][torch.randperm(n, generator=g)]
        r[n:] = -1
    idx = rows.reshape(idx.shape)
    filler = torch.full(idx.shape[:-1] + (width_extra,), -1, dtype=idx.dtype, device=idx.device)
    return torch.cat([idx, filler], -1).to(torch.int64), num


@pytest.mark.parametrize("block,bshd", [(64, False), (64, True), (128, False), (256, True)])
def test_from_indices_equals_map_api_bitwise(block, bshd):
    qb, kvb = 2, 3
    q, k, v = _qkv(2, 2, qb * block, kvb * block, 32, bshd, seed=block)
    sizes = torch.tensor([block, block // 2 + 1, 0], dtype=torch.int32, device=DEV)
    g = torch.Generator().manual_seed(1)
    block_map = (torch.rand(2, 2, qb, kvb, generator=g) > 0.4).to(DEV)
    block_map[0, 0, 1] = False  # a row with no block
    idx, num = _shuffled_lists(block_map)
    out_m, lse_m = MAP_API[(block, bshd)](q, k, v, block_map, sizes)
    out_l, lse_l = LIST_API[(block, bshd)](q, k, v, idx, num, sizes)
    assert torch.equal(out_l, out_m) and torch.equal(lse_l, lse_m)
    grad = torch.randn_like(out_m)
    gm = torch.autograd.grad(out_m, (q, k, v), grad)
    gl = torch.autograd.grad(out_l, (q, k, v), grad)
    for name, a, b in zip("qkv", gl, gm):
        assert torch.equal(a, b), f"d{name}"
    # and the map API itself against the fp32 reference, so bitwise-equal is not equal-but-wrong
    t = (lambda x: x.transpose(1, 2)) if bshd else (lambda x: x)
    ref, _ = block_sparse_attn_reference(t(q), t(k), t(v), block_map, sizes, block)
    torch.testing.assert_close(t(out_l), ref, atol=TOL, rtol=TOL)


def test_three_dim_lists_shared_by_batch_and_int32_fp16():
    q, k, v = _qkv(2, 1, 128, 192, 32, False, dtype=torch.float16, seed=3)
    sizes = torch.tensor([64, 7, 64], dtype=torch.int32, device=DEV)
    block_map = torch.tensor([[[True, False, True], [False, True, True]]], device=DEV)  # [H, Qb, KVb]
    idx = torch.tensor([[[2, 0, -1], [1, 2, 99]]], dtype=torch.int32, device=DEV)  # entries past num never read
    num = torch.tensor([[2, 2]], dtype=torch.int32, device=DEV)
    out_l, lse_l = ai.block_sparse_attn_from_indices(q, k, v, idx, num, sizes)
    out_m, lse_m = fvc.block_sparse_attn(q, k, v, block_map, sizes)
    assert torch.equal(out_l, out_m) and torch.equal(lse_l, lse_m)


def test_zero_width_lists_give_empty_rows():
    q, k, v = _qkv(1, 1, 64, 64, 32, False, seed=4)
    idx = torch.zeros(1, 1, 1, 0, dtype=torch.int32, device=DEV)
    num = torch.zeros(1, 1, 1, dtype=torch.int32, device=DEV)
    out, lse = ai.block_sparse_attn_from_indices(q, k, v, idx, num, torch.full((1,), 64, dtype=torch.int32,
                                                                               device=DEV))
    assert (out == 0).all() and torch.isneginf(lse).all()


# ---------------------------------------------------------------- bad inputs


def _bad_case(case):
    q, k, v = _qkv(1, 2, 128, 128, 32, False, seed=5)
    sizes = torch.full((2,), 64, dtype=torch.int32, device=DEV)
    idx = torch.tensor([[[[0, 1], [1, -1]], [[1, 0], [0, 7]]]], dtype=torch.int32, device=DEV)
    num = torch.tensor([[[2, 1], [2, 1]]], dtype=torch.int32, device=DEV)
    if case == "float_idx":
        idx = idx.float()
    elif case == "bool_num":
        num = num.bool()
    elif case == "idx_2d":
        idx = idx[0, 0]
    elif case == "idx_heads":
        idx = idx[:, :1]
    elif case == "num_shape":
        num = num[:, :, :1]
    elif case == "mixed_forms":
        num = num[0]
    elif case == "num_high":
        num[0, 1, 0] = 3
    elif case == "num_negative":
        num[0, 0, 1] = -1
    elif case == "idx_high":
        idx[0, 1, 1, 0] = 2
    elif case == "idx_negative":
        idx[0, 0, 0, 1] = -1
    elif case == "duplicate":
        idx[0, 1, 0] = torch.tensor([1, 1], dtype=torch.int32)
    return q, k, v, idx, num, sizes


@pytest.mark.parametrize("case,exc,match", [
    ("float_idx", TypeError, "q2k_idx must be an integer tensor"),
    ("bool_num", TypeError, "q2k_num must be an integer tensor"),
    ("idx_2d", ValueError, "q2k_idx must be 3-D or 4-D"),
    ("idx_heads", ValueError, r"q2k_idx must have shape \[B, H, Qb, W\]"),
    ("num_shape", ValueError, r"q2k_num must have shape \[1, 2, 2\]"),
    ("mixed_forms", ValueError, r"q2k_num must have shape \[1, 2, 2\] to go with a \[B, H, Qb, W\]"),
    ("num_high", ValueError, r"q2k_num must lie in \[0, W\] = \[0, 2\], got values in \[1, 3\]"),
    ("num_negative", ValueError, r"q2k_num must lie in \[0, W\]"),
    ("idx_high", ValueError,
     r"q2k_idx entries below q2k_num must lie in \[0, KVb\) = \[0, 2\); q2k_idx\[0, 1, 1, 0\] = 2"),
    ("idx_negative", ValueError, r"q2k_idx\[0, 0, 0, 1\] = -1"),
    ("duplicate", ValueError, r"q2k_idx lists a kv block twice in row \[0, 1, 0\]"),
])
def test_bad_lists_raise_before_launch(case, exc, match, monkeypatch):
    launched = []
    monkeypatch.setattr(ai, "_MAP_API", {key: (lambda *a, **kw: launched.append(1)) for key in ai._MAP_API})
    with pytest.raises(exc, match=match):
        ai.block_sparse_attn_from_indices(*_bad_case(case))
    assert not launched


def test_good_case_of_the_bad_cases_runs():
    out, _ = ai.block_sparse_attn_from_indices(*_bad_case("none"))
    assert torch.isfinite(out).all()


# ---------------------------------------------------------------- check cache


def test_value_check_runs_once_per_tensor_version(monkeypatch):
    calls = []
    real = ai.check_index_values
    monkeypatch.setattr(ai, "check_index_values", lambda *a, **kw: (calls.append(1), real(*a, **kw))[1])
    q, k, v, idx, num, sizes = _bad_case("none")
    with torch.no_grad():
        ai.block_sparse_attn_from_indices(q, k, v, idx, num, sizes)
        ai.block_sparse_attn_from_indices(q, k, v, idx, num, sizes)
        assert len(calls) == 1
        num[0, 0, 0] = 1  # an in-place write bumps the version: checked again
        ai.block_sparse_attn_from_indices(q, k, v, idx, num, sizes)
        assert len(calls) == 2
        num[0, 0, 0] = 5
        with pytest.raises(ValueError, match="q2k_num must lie"):
            ai.block_sparse_attn_from_indices(q, k, v, idx, num, sizes)


def test_value_check_runs_every_call_for_inference_tensors(monkeypatch):
    calls = []
    real = ai.check_index_values
    monkeypatch.setattr(ai, "check_index_values", lambda *a, **kw: (calls.append(1), real(*a, **kw))[1])
    q, k, v, _, _, _ = _bad_case("none")
    with torch.inference_mode():
        idx = torch.tensor([[[[0, 1], [1, -1]], [[1, 0], [0, 7]]]], dtype=torch.int32, device=DEV)
        num = torch.tensor([[[2, 1], [2, 1]]], dtype=torch.int32, device=DEV)
    ai.check_index_lists(idx, num, batch=1, heads=2, q_blocks=2, kv_blocks=2, device=q.device)
    ai.check_index_lists(idx, num, batch=1, heads=2, q_blocks=2, kv_blocks=2, device=q.device)
    assert len(calls) == 2


def test_lists_to_map_drops_out_of_range_entries_when_unchecked():
    # What the scatter does with values the checks would have refused (compiled / graph-captured calls).
    idx = torch.tensor([[[5, 0, -3, 1]]], dtype=torch.int64)
    num = torch.tensor([[4]], dtype=torch.int32)
    assert ai.lists_to_map(idx, num, 2).tolist() == [[[True, True]]]


# ---------------------------------------------------------------- torch.compile


def test_torch_compile_fullgraph_traces():
    torch._dynamo.reset()
    q, k, v = (t.detach() for t in _qkv(1, 1, 128, 128, 32, False, seed=6))
    sizes = torch.full((2,), 64, dtype=torch.int32, device=DEV)
    idx = torch.tensor([[[[1, 0], [1, -1]]]], dtype=torch.int32, device=DEV)
    num = torch.tensor([[[2, 1]]], dtype=torch.int32, device=DEV)

    def fn(q, k, v, idx, num):
        return ai.block_sparse_attn_from_indices(q, k, v, idx, num, sizes)[0]

    eager = fn(q, k, v, idx, num)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v, idx, num)
    assert torch.equal(compiled, eager)


# ------------------------------------------------------------------ lists reach the op as lists


def _spy_backend(monkeypatch):
    """Record the BlockSparsity each backend call receives (the real backend still runs)."""
    from fastvideo_cute.backends import BACKENDS

    seen = []
    for name, be in BACKENDS.items():
        for direction in ("forward", "backward"):
            real = getattr(be, direction)

            def spy(*args, _real=real, _dir=direction, **kw):
                seen.append((_dir, args[3] if _dir == "forward" else args[6]))
                return _real(*args, **kw)

            monkeypatch.setattr(be, direction, spy)
    return seen


def test_checked_lists_reach_the_backend_as_ascending_lists(monkeypatch):
    from fastvideo_cute.metadata import BlockSparsity

    qb, kvb = 2, 4
    g = torch.Generator().manual_seed(3)
    block_map = torch.rand(1, 2, qb, kvb, generator=g) < 0.5
    block_map[..., 1] = True
    idx, num = _shuffled_lists(block_map)
    q, k, v = _qkv(1, 2, qb * 64, kvb * 64, 32, False)
    sizes = torch.tensor([64, 64, 17, 40], dtype=torch.int32, device=DEV)
    seen = _spy_backend(monkeypatch)
    out, _ = ai.block_sparse_attn_from_indices(q, k, v, idx.to(DEV), num.to(DEV), sizes)
    out.sum().backward()
    assert [d for d, _ in seen] == ["forward", "backward"]
    for _, sp in seen:
        assert isinstance(sp, BlockSparsity) and sp.has_lists
        got_idx, got_num = sp.q2k()
        want_idx, want_num = map_to_index(block_map.to(DEV))
        assert torch.equal(got_num, want_num)
        for r_got, r_want, n in zip(got_idx.reshape(-1, got_idx.shape[-1]), want_idx.reshape(-1, kvb),
                                    want_num.reshape(-1).tolist()):
            assert torch.equal(r_got[:n], r_want[:n])  # ascending, the map API's order
        assert torch.equal(sp.block_map(), block_map.to(DEV))


def test_lists_take_the_map_path_while_values_cannot_be_read(monkeypatch):
    qb, kvb = 1, 2
    q, k, v = _qkv(1, 1, qb * 64, kvb * 64, 32, False)
    sizes = torch.full((kvb,), 64, dtype=torch.int32, device=DEV)
    idx = torch.tensor([[[1, 0]]], device=DEV)
    num = torch.tensor([[1]], device=DEV)
    monkeypatch.setattr(ai, "values_unreadable", lambda tensors: True)
    seen = _spy_backend(monkeypatch)
    with torch.no_grad():
        ai.block_sparse_attn_from_indices(q, k, v, idx, num, sizes)
    (_, sp), = seen
    assert not sp.has_lists and sp.block_map().tolist() == [[[[False, True]]]]


def test_ascending_lists_sorts_used_entries_and_fills_with_a_valid_id():
    idx = torch.tensor([[[2, 0, -1, 7], [3, 1, 0, 2]]])
    num = torch.tensor([[2, 4]])
    got_idx, got_num = ai.ascending_lists(idx, num, kv_blocks=4, batch=3)
    assert got_idx.dtype == got_num.dtype == torch.int32 and got_idx.is_contiguous()
    assert got_idx.shape == (3, 1, 2, 4) and got_num.shape == (3, 1, 2)
    assert got_idx[0].tolist() == [[[0, 2, 0, 0], [0, 1, 2, 3]]]
    assert got_num[2].tolist() == [[2, 4]]
