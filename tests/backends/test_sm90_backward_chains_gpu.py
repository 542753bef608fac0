"""On an sm_90 GPU: the sm90 backend's 64-token backward through the public API
(``FASTVIDEO_VSA_BACKEND=sm90``), on both chains its plan chooses between (``_split_plan``): the split
chain (bf16 dS tiles, then a q-owned dQ kernel) for q2k lists that arrive as lists
(``block_sparse_attn_from_indices``, ``video_sparse_attn``'s top-k), sized by their width, and for a
bool map, sized by the pair counts its forward started reading (``fastvideo_cute.pair_counts``, a 4-D
map and a 3-D one shared by the batch); the reduce-add chain for a map with the map switch
(``_SPLIT_MAPS``) off. Which chain ran is observed (the plan's answers, recorded), not assumed.

Checked against the fp32 reference: ragged kv blocks (sizes 0, 17, 33 and full) with NaN/Inf in K's and
V's padding rows, B = 2, a q block with no kv block, BHSD and BSHD; the split's gradients beside the
reduce-add chain's on the same call (the map of the same selection).

Tolerance: max |g - ref| / max |ref| < 2e-2, the bf16-vs-fp32-reference gradient bound of
tests/test_gpu_cute_route.py and tests/test_gpu_vsa_e2e.py (the same as the split kernel's own GPU
tests); the two chains agree within 1e-2 of max |ref| (measured 8e-4 for dq on an H100, dk and dv
bitwise equal: both round to bf16 from fp32 sums, dq's in different orders).
"""

import pytest
import torch

import fastvideo_cute as fvc
from fastvideo_cute import ops
from fastvideo_cute.backends import sm90_backend
from fastvideo_cute.reference import block_sparse_attn_reference, video_sparse_attn_reference

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):  # collected on CPU boxes too
    pytest.skip("needs an sm_90 GPU", allow_module_level=True)
pytest.importorskip("cutlass")

GRAD_TOL, CHAIN_TOL = 2e-2, 1e-2


@pytest.fixture(autouse=True)
def _sm90(monkeypatch):
    for name in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_ROUTE_TABLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "sm90")


@pytest.fixture
def plans(monkeypatch):
    """The split plans the backend chose, in call order, as (split, sized by counts) (the split chain
    switched on for lists and maps, whatever the shipped default)."""
    monkeypatch.setattr(sm90_backend, "_SPLIT_BWD", True)
    monkeypatch.setattr(sm90_backend, "_SPLIT_MAPS", True)
    seen, real = [], sm90_backend._split_plan

    def spy(sparsity):
        plan = real(sparsity)
        seen.append((plan[0], plan[1] is not None))
        return plan

    monkeypatch.setattr(sm90_backend, "_split_plan", spy)
    return seen


def _nerr(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-6)).item()


def _map_case(seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, h, nb, d = 2, 2, 8, 128
    sizes = torch.tensor([64, 64, 33, 64, 0, 64, 64, 17], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(b, h, nb * 64, d, device="cuda", generator=g).bfloat16() for _ in range(3))
    pad = (torch.arange(nb * 64, device="cuda") % 64) >= sizes.repeat_interleave(64)
    k[:, :, pad] = float("nan")
    v[:, :, pad] = float("inf")
    m = torch.zeros(b, h, nb, nb, dtype=torch.bool, device="cuda")  # top-3 of random scores a row, as VSA's
    m.scatter_(-1, torch.rand(b, h, nb, nb, device="cuda", generator=g).topk(3, dim=-1).indices, True)
    m[1, 0, 3] = False  # a q block with no kv block
    return q, k, v, m, sizes


def _grads(bshd, q, k, v, m, sizes, dout, form):
    """The gradients of one call, from the map (``form`` "map"; "map3d": head 0's map shared by the
    batch, which must then select alike) or from its q2k lists ("lists")."""
    from fastvideo_cute.metadata import map_to_index

    tb = (lambda x: x.transpose(1, 2).contiguous()) if bshd else (lambda x: x.clone())
    leaves = [tb(x).requires_grad_(True) for x in (q, k, v)]
    before = ops.dispatch_counts.copy()
    if form == "map3d":
        out, _ = (fvc.block_sparse_attn_bshd if bshd else fvc.block_sparse_attn)(*leaves, m[0].clone(), sizes)
    elif form == "lists":
        idx, num = map_to_index(m)  # 3 wide, as top-k lists are (of 8 kv blocks: the split's width rule)
        fn = fvc.block_sparse_attn_bshd_from_indices if bshd else fvc.block_sparse_attn_from_indices
        out, _ = fn(*leaves, idx[..., :3].contiguous(), num, sizes)
    else:
        fn = fvc.block_sparse_attn_bshd if bshd else fvc.block_sparse_attn
        out, _ = fn(*leaves, m, sizes)
    grads = torch.autograd.grad(out, leaves, tb(dout))
    ran = {key: n - before[key] for key, n in ops.dispatch_counts.items() if n != before[key]}
    assert ran == {("sm90", "fwd"): 1, ("sm90", "bwd"): 1}, ran
    back = (lambda x: x.transpose(1, 2)) if bshd else (lambda x: x)
    return [back(g) for g in grads]


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
@pytest.mark.parametrize("form", ["lists", "map", "map3d"])
def test_block_sparse_attn_backward_on_the_split_and_beside_the_reduce_add_chain(plans, monkeypatch, bshd, form):
    q, k, v, m, sizes = _map_case()
    if form == "map3d":
        m = m[:1].expand_as(m).clone()
    dout = torch.randn_like(q)
    grads = _grads(bshd, q, k, v, m, sizes, dout, form)
    assert plans == [(True, form != "lists")], plans  # lists by width, maps by their counts
    ref_leaves = [x.detach().float().nan_to_num(0.0, 0.0, 0.0).requires_grad_(True) for x in (q, k, v)]
    ref, _ = block_sparse_attn_reference(*ref_leaves, m, sizes, 64)
    refg = torch.autograd.grad(ref, ref_leaves, dout.float())
    errs = [_nerr(g, r) for g, r in zip(grads, refg)]
    print(f"\n[sm90 bwd bshd={bshd} {form}] " + " ".join(f"{e:.2e}" for e in errs))
    assert all(torch.isfinite(g).all() for g in grads)
    assert max(errs) < GRAD_TOL, errs
    if form != "map3d":  # the same selection as a map with the map switch off: the reduce-add chain
        monkeypatch.setattr(sm90_backend, "_SPLIT_MAPS", False)
        other = _grads(bshd, q, k, v, m, sizes, dout, "map")
        assert plans[-1] == (False, False)
        diffs = [_nerr(a, b) for a, b in zip(grads, other)]
        bitwise = [torch.equal(a, b) for a, b in zip(grads[1:], other[1:])]
        print(f"  split vs reduce-add: {diffs}, dk/dv bitwise: {bitwise}")
        assert max(diffs) < CHAIN_TOL, diffs


def test_video_sparse_attn_training_runs_the_split_on_its_top_k_lists(plans):
    grid, tile, topk = (8, 8, 16), (4, 4, 4), 2  # 2 x 2 x 4 = 16 tiles, lists 2 wide
    g = torch.Generator(device="cuda").manual_seed(5)
    n = grid[0] * grid[1] * grid[2]
    raw = [torch.randn(1, 2, n, 128, device="cuda", generator=g).bfloat16() for _ in range(4)]
    q, k, v, w = (fvc.to_tiles(x, grid, tile, dim=2) for x in raw)
    sizes = fvc.variable_block_sizes(grid, tile, device="cuda")
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v, w)]
    out = fvc.video_sparse_attn(*leaves[:3], sizes, sizes, topk, tile, compress_attn_weight=leaves[3])
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    assert plans == [(True, False)], plans
    ref_leaves = [x.detach().float().requires_grad_(True) for x in leaves]
    ref = video_sparse_attn_reference(*ref_leaves[:3], sizes, sizes, topk, tile, compress_attn_weight=ref_leaves[3])
    refg = torch.autograd.grad(ref, ref_leaves, dout.float())
    errs = [_nerr(a, b) for a, b in zip(grads, refg)]
    print("\n[sm90 vsa split] " + " ".join(f"{e:.2e}" for e in errs))
    assert max(errs) < GRAD_TOL, errs
