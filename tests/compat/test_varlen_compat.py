"""compat block_sparse_attn_varlen (FastVideo's signature: real tokens, per-sequence lists)
against FastVideo's semantics written out here as host loops: scatter each sequence's real
tokens into its blocks (block b takes its leading sizes[b] slots), run each sequence alone,
gather the real tokens back. On the Triton route the packed call must match bit for bit,
forward and backward; bad cu_seqlens / lists are refused; the checks run once per tensor set.
"""

import importlib

import pytest
import torch

from fastvideo_cute import api_indices
from fastvideo_cute.compat.fastvideo_kernel import block_sparse_attn_varlen  # the function, as in FastVideo

varlen_mod = importlib.import_module("fastvideo_cute.compat.fastvideo_kernel.block_sparse_attn_varlen")

from ..conftest import HAS_CUDA

DEV = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND", "FASTVIDEO_VSA_TK",
                 "FASTVIDEO_KERNEL_VSA_FORCE_TRITON"):
        monkeypatch.delenv(name, raising=False)


def _lists(h, nq, nkv, g, width_extra):
    """FastVideo-style lists: a random selection per row, in random order, -1 fillers."""
    idx = torch.full((1, h, nq, nkv + width_extra), -1, dtype=torch.int32)
    num = torch.zeros(1, h, nq, dtype=torch.int32)
    for a in range(h):
        for i in range(nq):
            chosen = torch.randperm(nkv, generator=g)[:int(torch.randint(0, nkv + 1, (1,), generator=g))]
            idx[0, a, i, :len(chosen)] = chosen.to(torch.int32)
            num[0, a, i] = len(chosen)
    return idx.to(DEV), num.to(DEV)


def _case(configs, block=64, h=2, d=32, dtype=torch.float32, full_q=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for j, (nq, nkv) in enumerate(configs):
        qs = torch.full((nq,), block, dtype=torch.int32) if full_q else torch.randint(1, block + 1, (nq,),
                                                                                       generator=g).to(torch.int32)
        ks = torch.randint(0, block + 1, (nkv,), generator=g).to(torch.int32)
        idx, num = _lists(h, nq, nkv, g, width_extra=j)
        if j == 1:
            idx, num = idx[0], num[0]  # the [H, Nq, W] form
        seqs.append(dict(nq=nq, nkv=nkv, q_sizes=qs.to(DEV), kv_sizes=ks.to(DEV), idx=idx, num=num))
    tq, tkv = sum(int(s["q_sizes"].sum()) for s in seqs), sum(int(s["kv_sizes"].sum()) for s in seqs)
    q, k, v = (torch.randn(t, h, d, generator=g).to(DEV, dtype).requires_grad_(True) for t in (tq, tkv, tkv))
    cu = lambda key: torch.tensor([0] + torch.cumsum(torch.tensor([int(s[key].sum()) for s in seqs]), 0).tolist(),
                                  dtype=torch.int32, device=DEV)  # noqa: E731
    return q, k, v, cu("q_sizes"), cu("kv_sizes"), seqs


def _pad_loop(x, sizes, block):
    """FastVideo's host packing of one sequence: block b takes sizes[b] tokens, rest zero."""
    parts, pos = [], 0
    for n in sizes.tolist():
        parts += [x[pos:pos + n], x.new_zeros((block - n,) + tuple(x.shape[1:]))]
        pos += n
    return torch.cat(parts)


def _unpad_loop(x, sizes, block):
    return torch.cat([x[b * block:b * block + n] for b, n in enumerate(sizes.tolist())])


def _reference(q, k, v, cu_q, cu_kv, seqs, block):
    outs = []
    for i, s in enumerate(seqs):
        qi = _pad_loop(q[int(cu_q[i]):int(cu_q[i + 1])], s["q_sizes"], block)
        ki = _pad_loop(k[int(cu_kv[i]):int(cu_kv[i + 1])], s["kv_sizes"], block)
        vi = _pad_loop(v[int(cu_kv[i]):int(cu_kv[i + 1])], s["kv_sizes"], block)
        fn = {64: api_indices.block_sparse_attn_bshd_from_indices,
              128: api_indices.block_sparse_attn_128_bshd_from_indices}[block]
        o, _ = fn(qi[None], ki[None], vi[None], s["idx"], s["num"], s["kv_sizes"])
        outs.append(_unpad_loop(o[0], s["q_sizes"], block))
    return torch.cat(outs)


@pytest.mark.parametrize("dtype,block,full_q", [(torch.float32, 64, False), (torch.float16, 64, False),
                                                 (torch.float32, 128, True)])
def test_varlen_matches_fastvideo_semantics_bitwise(dtype, block, full_q):
    configs = [(2, 1), (1, 3), (2, 2)] if block == 64 else [(1, 2), (2, 1)]
    q, k, v, cu_q, cu_kv, seqs = _case(configs, block=block, dtype=dtype, full_q=full_q, seed=block)
    out = block_sparse_attn_varlen(q, k, v, cu_q, cu_kv, [s["idx"] for s in seqs], [s["num"] for s in seqs],
                                   [s["kv_sizes"] for s in seqs],
                                   None if full_q else [s["q_sizes"] for s in seqs], block_size=block)
    ref = _reference(q, k, v, cu_q, cu_kv, seqs, block)
    assert out.shape == q.shape and out.dtype == dtype
    assert torch.equal(out, ref)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEV, dtype)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for name, a, b in zip("qkv", got, want):
        assert torch.equal(a, b), f"d{name}"


def _args(seed=3):
    q, k, v, cu_q, cu_kv, seqs = _case([(1, 2), (2, 1)], seed=seed)
    return dict(q=q.detach(), k=k.detach(), v=v.detach(), cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
                q2k_idx_list=[s["idx"] for s in seqs], q2k_num_list=[s["num"] for s in seqs],
                variable_block_sizes_list=[s["kv_sizes"] for s in seqs],
                q_variable_block_sizes_list=[s["q_sizes"] for s in seqs])


@pytest.mark.parametrize("case,exc,match", [
    ("cu_q_shifted", ValueError, "cu_seqlens_q must be the running sum of each sequence's real tokens"),
    ("cu_kv_len", ValueError, r"cu_seqlens_kv must have shape \[N \+ 1\] = \[3\]"),
    ("tokens", ValueError, "sum to .* tokens but the packed tensor holds"),
    ("local_index", ValueError, "must lie in that row's sequence's kv blocks"),
    ("lists", ValueError, r"q2k_num_list must have one entry per sequence \(2\)"),
    ("not_list", TypeError, "q2k_idx_list must be a list of tensors"),
    ("sizes_range", ValueError, r"variable_block_sizes_list\[1\] must lie in \[0, 64\]"),
    ("heads", ValueError, r"q2k_idx_list\[0\] must have shape"),
    ("block", ValueError, "block_size must be 64, 128 or 256"),
])
def test_bad_inputs_raise(case, exc, match):
    a = _args()
    if case == "cu_q_shifted":
        a["cu_seqlens_q"] = a["cu_seqlens_q"].clone()
        a["cu_seqlens_q"][1] += 1
    elif case == "cu_kv_len":
        a["cu_seqlens_kv"] = a["cu_seqlens_kv"][:2]
    elif case == "tokens":
        a["q"] = a["q"][:-1]
    elif case == "local_index":
        idx = a["q2k_idx_list"][1].clone()  # sequence 1 has one kv block: index 1 is global-valid, local-invalid
        idx[0, 0] = 1
        a["q2k_num_list"][1] = a["q2k_num_list"][1].clone()
        a["q2k_num_list"][1][0, 0] = max(1, int(a["q2k_num_list"][1][0, 0]))
        a["q2k_idx_list"][1] = idx
    elif case == "lists":
        a["q2k_num_list"] = a["q2k_num_list"][:1]
    elif case == "not_list":
        a["q2k_idx_list"] = a["q2k_idx_list"][0]
    elif case == "sizes_range":
        a["variable_block_sizes_list"][1] = a["variable_block_sizes_list"][1] + 64
    elif case == "heads":
        a["q2k_idx_list"][0] = a["q2k_idx_list"][0][:, :1]
    elif case == "block":
        a["block_size"] = 32
    with pytest.raises(exc, match=match):
        block_sparse_attn_varlen(**a)


def test_checks_run_once_for_the_same_tensors(monkeypatch):
    calls = {"cu": 0, "q2k": 0}
    real_cu, real_q2k = varlen_mod._check_cu_values, varlen_mod.check_index_values

    def count(key, fn):
        def wrapped(*a, **kw):
            calls[key] += 1
            return fn(*a, **kw)
        return wrapped

    monkeypatch.setattr(varlen_mod, "_check_cu_values", count("cu", real_cu))
    monkeypatch.setattr(varlen_mod, "check_index_values", count("q2k", real_q2k))
    a = _args(seed=4)
    with torch.no_grad():
        first = block_sparse_attn_varlen(**a)
        second = block_sparse_attn_varlen(**a)
    assert calls == {"cu": 1, "q2k": 1} and torch.equal(first, second)
    a["q2k_idx_list"] = [t.clone() for t in a["q2k_idx_list"]]  # fresh lists: their values are checked again
    with torch.no_grad():
        block_sparse_attn_varlen(**a)
    assert calls == {"cu": 1, "q2k": 2}


@pytest.mark.gpu
def test_gpu_compat_varlen_does_not_synchronise_after_first_call():
    """FastVideo's varlen reads every block size back to the host on every call; here, once the
    same tensors have been seen (checks and packing metadata remembered), forward and backward
    issue no host synchronisation (torch raises on any under sync-debug "error")."""
    q, k, v, cu_q, cu_kv, seqs = _case([(2, 1), (1, 3), (2, 2)], dtype=torch.bfloat16, d=64, seed=7)
    args = (q, k, v, cu_q, cu_kv, [s["idx"] for s in seqs], [s["num"] for s in seqs],
            [s["kv_sizes"] for s in seqs], [s["q_sizes"] for s in seqs])

    def run():
        out = block_sparse_attn_varlen(*args)
        torch.autograd.grad(out.float().sum(), (q, k, v))

    run()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run()
    finally:
        torch.cuda.set_sync_debug_mode(0)
