"""The sm90 backend (our wgmma 64-token forward, gate fusable) on synthetic calls: what it serves,
each limit's reason, and that the router never picks it for plain block-sparse calls."""

import dataclasses
import importlib.util

import pytest
import torch

from fastvideo_cute import routes
from fastvideo_cute.backends import BACKENDS
from fastvideo_cute.call import CallInfo

HAS_CUTE = importlib.util.find_spec("cutlass") is not None

# A Wan-like VSA inference call on the H200: 64-token blocks, partial kv tiles, LSE discarded.
BASE = CallInfo("block_sparse", "cuda", (9, 0), torch.bfloat16, 128, 64, False, batch=1, heads=12, q_len=32768,
                kv_len=32768, need_lse=False, kv_all_full=False)


def _with(**kw):
    return dataclasses.replace(BASE, **kw)


def test_attributes():
    be = BACKENDS["sm90"]
    assert be.name == "sm90" and be.head_dims == (64, 128)
    assert be.zeroes_kv_padding is False  # it masks K/V padding in the kernel: no clean copy for it
    assert be.fuses_gate is True and callable(be.forward_gated)


def test_verified_on_sm90_only():
    be = BACKENDS["sm90"]
    assert be.verified_on((9, 0))
    assert not any(be.verified_on(a) for a in ((8, 0), (10, 0), (12, 1), None))


@pytest.mark.skipif(not HAS_CUTE, reason="the CuTe DSL is not installed")
@pytest.mark.parametrize("change", [dict(), dict(dtype=torch.float16), dict(head_dim=64), dict(need_lse=True),
                                    dict(kv_all_full=True), dict(bshd=True), dict(kv_len=4096), dict(batch=2),
                                    dict(block_size=128), dict(block_size=256)])
def test_serves_the_forward_it_was_verified_on(change):
    ok, reason = BACKENDS["sm90"].support(_with(**change))
    assert ok, reason


@pytest.mark.parametrize("change,words", [
    (dict(device_type="cpu", arch=None), "needs CUDA tensors"),
    (dict(arch=(10, 0)), "sm_90a only, not sm_100"),
    (dict(arch=(12, 1)), "sm_90a only, not sm_121"),
    (dict(need_grad=True, dtype=torch.float16), "the backward is bfloat16 only, got torch.float16"),
    (dict(need_grad=True, head_dim=64), "the backward is head_dim 128 only, got 64"),
    (dict(need_grad=True, block_size=128), "the backward serves 64-token blocks only, got 128"),
    (dict(need_grad=True, kv_len=16384), "q_len == kv_len, got 32768 and 16384"),
    (dict(need_grad=True, q_len=32768 + 64, kv_len=32768 + 64), "an even number (>= 2) of 64-token blocks, got 513"),
    (dict(need_grad=True, q_len=64, kv_len=64), "an even number (>= 2) of 64-token blocks, got 1"),
    (dict(need_grad=True, heads=1024, batch=2), "int32 offsets"),
    (dict(block_size=32), "block_size one of (64, 128, 256), got 32"),
    (dict(block_size=512), "block_size one of (64, 128, 256), got 512"),
    (dict(dtype=torch.float32), "float16 or bfloat16 only"),
    (dict(head_dim=96), "head_dim one of (64, 128), got 96"),
    (dict(head_dim=32), "head_dim one of (64, 128), got 32"),
    (dict(q_len=32768 + 32), "q_len 32800 is not a multiple of 64"),
    (dict(heads=70000), "launch limits"),
    (dict(batch=70000), "launch limits"),
])
def test_support_refuses_with_reason(change, words):
    ok, reason = BACKENDS["sm90"].support(_with(**change))
    assert not ok and words in reason, reason


@pytest.mark.skipif(not HAS_CUTE, reason="the CuTe DSL is not installed")
@pytest.mark.parametrize("change", [dict(), dict(kv_all_full=True), dict(bshd=True), dict(batch=2),
                                    dict(q_len=128, kv_len=128), dict(q_len=39936, kv_len=39936)])
def test_serves_the_training_calls_its_backward_covers(change):
    ok, reason = BACKENDS["sm90"].support(_with(need_grad=True, need_lse=True, **change))
    assert ok, reason


def test_compile_keys_of_a_training_call_name_the_backward():
    from fastvideo_cute.backends.sm90_backend import _BWD_WS_CONFIG

    keys = BACKENDS["sm90"].compile_keys(_with(need_grad=True))
    assert set(keys) == {"fwd", "bwd"}
    detail = dict(keys["bwd"].detail)
    assert detail["kernel"] == "block_sparse_bwd64_sm90_ws" and keys["bwd"].direction == "bwd"
    assert detail["config"] == ",".join(f"{k}={v}" for k, v in sorted(_BWD_WS_CONFIG.items()))


def test_backward_passes_the_call_to_the_ws_chain_in_bhsd(monkeypatch):
    """BSHD tensors reach the chain as BHSD copies and the gradients come back in the call layout;
    the k2q lists are the map's columns; the route's kernel configuration is passed."""
    from fastvideo_cute.adapters import cute_sm90_bwd64
    from fastvideo_cute.backends import sm90_backend
    from fastvideo_cute.backends.sm90_backend import _BWD_WS_CONFIG, Sm90Backend

    seen = {}

    def fake(q, k, v, out, dout, lse, k2q_idx, k2q_num, sizes, **kw):
        seen.update(shapes=[t.shape for t in (q, k, v, out, dout)], contiguous=all(
            t.is_contiguous() for t in (q, k, v, out, dout, lse)), idx=k2q_idx, num=k2q_num, kw=kw)
        return q * 2, k * 3, v * 4

    monkeypatch.setattr(cute_sm90_bwd64, "sm90_block_sparse_bwd64", fake)
    monkeypatch.setattr(sm90_backend, "_SPLIT_BWD", False)
    b, s, h, d = 1, 256, 2, 128
    q, k, v, out, dout = (torch.randn(b, s, h, d) for _ in range(5))
    lse = torch.randn(b, h, s).transpose(1, 2).contiguous().transpose(1, 2)  # not contiguous
    block_map = torch.zeros(b, h, 4, 4, dtype=torch.bool)
    block_map[0, 1, 2, 3] = block_map[0, 1, 0, 3] = True
    sizes = torch.full((4,), 64, dtype=torch.int32)
    dq, dk, dv = Sm90Backend().backward(q, k, v, out, dout, lse, block_map, sizes, block_size=64, bshd=True,
                                        sm_scale=0.125)
    assert seen["shapes"] == [torch.Size([b, h, s, d])] * 5 and seen["contiguous"]
    assert seen["kw"] == dict(sm_scale=0.125, main="ws", ws_config=_BWD_WS_CONFIG)
    assert seen["num"][0, 1, 3].item() == 2 and seen["idx"][0, 1, 3, :2].tolist() == [0, 2]
    assert seen["num"][0, 0].tolist() == [0, 0, 0, 0]
    for g, x, f in ((dq, q, 2), (dk, k, 3), (dv, v, 4)):
        assert g.shape == x.shape and g.is_contiguous() and torch.equal(g, x * f)
    with pytest.raises(RuntimeError, match="64-token blocks only"):
        Sm90Backend().backward(q, k, v, out, dout, lse, block_map, sizes, block_size=128, bshd=True, sm_scale=0.1)


def _lists(b, h, nb, width, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(nb, generator=g)[:width].sort().values for _ in range(b * h * nb)])
    return idx.reshape(b, h, nb, width).to(torch.int32), torch.full((b, h, nb), width, dtype=torch.int32)


def test_split_plan_takes_narrow_lists_and_maps_whose_forward_started_their_counts(monkeypatch):
    """Lists that arrived (VSA's top-k) choose by width, no host read. A bool map splits by the pair
    counts its forward started reading (``pair_counts``), when no sequence is denser than the rule;
    a map without started counts, or with the map switch off, keeps the reduce-add chain; the main
    switch turns the split off."""
    from fastvideo_cute.backends import sm90_backend
    from fastvideo_cute.metadata import BlockSparsity, map_to_index
    from fastvideo_cute.pair_counts import start_pair_counts

    monkeypatch.setattr(sm90_backend, "_SPLIT_BWD", True)
    monkeypatch.setattr(sm90_backend, "_SPLIT_MAPS", True)
    nb = 8
    for width, split in ((4, True), (5, False)):
        idx, num = _lists(1, 2, nb, width)
        assert sm90_backend._split_plan(BlockSparsity(q2k_idx=idx, q2k_num=num, num_kv_blocks=nb)) == (split, None)
    block_map = torch.zeros(2, 3, nb, nb, dtype=torch.bool)
    block_map[..., :2] = True  # 2 of 8 per row
    block_map[1, 2, :, 2:4] = True  # one sequence 4 of 8 per row: at the rule's bound
    block_map[0, 1, 5] = False  # an empty q block
    assert sm90_backend._split_plan(BlockSparsity.of(block_map)) == (False, None)  # no counts started
    assert start_pair_counts(block_map, map_to_index(block_map)[1])
    expected = block_map.reshape(6, -1).sum(-1).tolist()
    assert expected == [16, 14, 16, 16, 16, 32]
    assert sm90_backend._split_plan(BlockSparsity.of(block_map)) == (True, expected)
    other = block_map.clone()  # the same selection in another tensor: no counts of its own
    assert sm90_backend._split_plan(BlockSparsity.of(other)) == (False, None)
    block_map[1, 2, :, 4] = True  # changed in place after the count: stale, ignored
    assert sm90_backend._split_plan(BlockSparsity.of(block_map)) == (False, None)
    assert start_pair_counts(block_map, map_to_index(block_map)[1])  # 5 of 8 in one sequence: too dense
    assert sm90_backend._split_plan(BlockSparsity.of(block_map))[0] is False
    block_map[1, 2, :, 4] = False
    assert start_pair_counts(block_map, map_to_index(block_map)[1])
    monkeypatch.setattr(sm90_backend, "_SPLIT_MAPS", False)
    assert sm90_backend._split_plan(BlockSparsity.of(block_map)) == (False, None)
    monkeypatch.setattr(sm90_backend, "_SPLIT_BWD", False)
    assert sm90_backend._split_plan(BlockSparsity(q2k_idx=idx, q2k_num=num, num_kv_blocks=nb)) == (False, None)


def test_backward_runs_the_split_chain_for_narrow_lists(monkeypatch):
    """Narrow q2k lists reach the split chain (BHSD copies, both list directions, the call's scale, no
    host pair counts); the gradients come back in the call layout."""
    from fastvideo_cute.adapters import cute_sm90_bwd64, cute_sm90_bwd64_split
    from fastvideo_cute.backends import sm90_backend
    from fastvideo_cute.backends.sm90_backend import Sm90Backend
    from fastvideo_cute.metadata import BlockSparsity

    seen = {}

    def fake(q, k, v, out, dout, lse, q2k_idx, q2k_num, k2q_idx, k2q_num, sizes, **kw):
        seen.update(shape=q.shape, q2k=(q2k_idx, q2k_num), k2q=(k2q_idx, k2q_num), kw=kw)
        return q * 2, k * 3, v * 4

    def never(*a, **kw):
        raise AssertionError("the reduce-add chain ran")

    monkeypatch.setattr(cute_sm90_bwd64_split, "sm90_block_sparse_bwd64_split", fake)
    monkeypatch.setattr(cute_sm90_bwd64, "sm90_block_sparse_bwd64", never)
    monkeypatch.setattr(sm90_backend, "_SPLIT_BWD", True)
    b, s, h, d, nb = 1, 512, 2, 128, 8
    idx, num = _lists(b, h, nb, 3)
    sp = BlockSparsity(q2k_idx=idx, q2k_num=num, num_kv_blocks=nb)
    q, k, v, out, dout = (torch.randn(b, s, h, d) for _ in range(5))
    lse = torch.randn(b, h, s)
    sizes = torch.full((nb,), 64, dtype=torch.int32)
    dq, dk, dv = Sm90Backend().backward(q, k, v, out, dout, lse, sp, sizes, block_size=64, bshd=True, sm_scale=0.5)
    assert seen["shape"] == torch.Size([b, h, s, d]) and seen["kw"] == dict(sm_scale=0.5, seq_pairs=None)
    assert torch.equal(seen["q2k"][0], idx) and torch.equal(seen["k2q"][0], sp.k2q()[0])
    for g, x, f in ((dq, q, 2), (dk, k, 3), (dv, v, 4)):
        assert g.shape == x.shape and torch.equal(g, x * f)


def test_support_says_when_the_cute_dsl_is_missing(monkeypatch):
    from fastvideo_cute.backends import sm90_backend

    monkeypatch.setattr(sm90_backend, "module_installed", lambda name: name != "cutlass")
    ok, reason = BACKENDS["sm90"].support(BASE)
    assert not ok and "CuTe DSL is not installed" in reason


def test_compile_keys_name_the_kernel_and_the_gate_variant():
    be = BACKENDS["sm90"]
    keys = be.compile_keys(BASE)
    assert set(keys) == {"fwd"}
    detail = dict(keys["fwd"].detail)
    assert detail["kernel"] == "block_sparse_fwd64_sm90" and detail["gate"] == "none"
    gated = be.compile_keys(BASE, gated=True)["fwd"]
    assert dict(gated.detail)["gate"] == "fused" and gated.digest() != keys["fwd"].digest()
    full = be.compile_keys(_with(kv_all_full=True))["fwd"]  # no sizes: another compiled variant
    assert full.digest() != keys["fwd"].digest()
    # partial kv tiles run the packed_steps build (sm90_backend._PACK_PARTIAL), full ones the q2k lists
    assert dict(keys["fwd"].detail)["steps"] == "packed" and dict(full.detail)["steps"] == "lists"


def test_the_shipped_table_picks_it_where_it_was_fastest(monkeypatch):
    """The measured table (v10: benchmarks/results/vsa_h200_table10_bwd64_{synthetic,grid}.json for the
    64-token backwards, table8_grid + table7_synthetic for the rest) ranks sm90 first for the sm_90
    64-token forward classes, both 64-token backward classes (its flat_dq build, q groups of 512
    blocks) and the 128/256-token partial-tile forwards; a 64-token training call runs sm90 both
    ways; 128/256-token training calls pair it with cuDNN's backward (one q group at these lengths),
    FA4's where cuDNN cannot serve; FA4 keeps the 128/256 full-tile forwards; without the table
    (legacy rules) FA4 comes first, so an inference call never takes it. ``FASTVIDEO_VSA_CUTEDSL=1``
    takes the same backends as the default in every one of these classes (the table serves both)."""
    from fastvideo_cute import route_table

    for name in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(route_table.TABLE_ENV, raising=False)
    if routes._table() is None or not BACKENDS["cudnn"].support(_with(need_grad=True))[0]:
        pytest.skip("the shipped table or cuDNN-frontend is not usable here")
    for info in (BASE, _with(need_lse=True), _with(kv_all_full=True, need_lse=True)):
        assert routes.cute_preferences(info) == ["fa4", "sm90"]  # after FA4 without the table
        assert routes.select_route(info).name == "sm90"
    fwd, bwd = routes.select_routes(_with(need_grad=True))
    assert (fwd.name, bwd.name) == ("sm90", "sm90")  # partial tiles
    fwd, bwd = routes.select_routes(_with(need_grad=True, kv_all_full=True))
    assert (fwd.name, bwd.name) == ("sm90", "sm90")  # full tiles (v10)
    classes = [_with(need_grad=True, block_size=b, kv_all_full=f) for b in (64, 128, 256) for f in (False, True)]
    default = [tuple(x.name for x in routes.select_routes(info)) for info in classes]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FASTVIDEO_VSA_CUTEDSL", "1")
        assert [tuple(x.name for x in routes.select_routes(info)) for info in classes] == default
    for block in (128, 256):
        assert routes.select_route(_with(block_size=block)).name == "sm90"  # partial tiles
        assert routes.select_route(_with(block_size=block, kv_all_full=True)).name == "fa4"
        fwd, bwd = routes.select_routes(_with(block_size=block, need_grad=True))
        assert (fwd.name, bwd.name) == ("sm90", "cudnn")
    # the table ranks FA4's backward second for the 128/256-token partial-tile classes: it serves when
    # cuDNN cannot
    monkeypatch.setattr(BACKENDS["cudnn"], "support", lambda info: (False, "not installed"))
    for block in (128, 256):
        fwd, bwd = routes.select_routes(_with(block_size=block, need_grad=True))
        assert (fwd.name, bwd.name) == ("sm90", "fa4")
    monkeypatch.setenv(route_table.TABLE_ENV, "off")
    for info in (BASE, _with(kv_all_full=True, need_lse=True)):
        assert routes.select_route(info).name != "sm90"


def test_forward_of_a_training_call_runs_and_starts_a_maps_pair_counts(monkeypatch):
    """The route table may pair this forward with another backend's backward: ``forward`` with
    ``need_backward=True`` runs the kernel like an inference call (its LSE serves the backward)
    instead of refusing (a refusal there failed every 64-token training call on the H200 once the
    table chose sm90 for the forward: benchmarks/results/vsa_h200_default_synthetic_v9.json). Given a
    bool map it also starts reading the map's pair counts for the split backward; an inference call,
    lists that arrived as lists, or 128-token blocks start none."""
    from fastvideo_cute.backends import sm90_backend
    from fastvideo_cute.backends.sm90_backend import Sm90Backend
    from fastvideo_cute.metadata import BlockSparsity
    from fastvideo_cute.pair_counts import pair_counts

    monkeypatch.setattr(sm90_backend, "_SPLIT_BWD", True)
    monkeypatch.setattr(sm90_backend, "_SPLIT_MAPS", True)
    seen = []
    backend = Sm90Backend()
    monkeypatch.setattr(backend, "_run", lambda *a, **kw: seen.append(a) or ("out", "lse"))

    def maps():
        m = torch.zeros(1, 2, 4, 4, dtype=torch.bool)
        m[0, 0, :, 1] = True
        m[0, 1, 1:, :2] = True
        return m

    train, infer, wide = maps(), maps(), maps()
    assert backend.forward(1, 2, 3, train, None, block_size=64, bshd=False, need_backward=True,
                           sm_scale=0.1) == ("out", "lse")
    assert len(seen) == 1 and seen[0][3].block_map() is train
    assert pair_counts(train) == [4, 6]
    backend.forward(1, 2, 3, infer, None, block_size=64, bshd=False, need_backward=False, sm_scale=0.1)
    backend.forward(1, 2, 3, wide, None, block_size=128, bshd=False, need_backward=True, sm_scale=0.1)
    assert pair_counts(infer) is None and pair_counts(wide) is None
    idx, num = _lists(1, 2, 4, 2)
    sp = BlockSparsity(q2k_idx=idx, q2k_num=num, num_kv_blocks=4)
    backend.forward(1, 2, 3, sp, None, block_size=64, bshd=False, need_backward=True, sm_scale=0.1)
    assert pair_counts(sp.block_map()) is None and len(seen) == 4
