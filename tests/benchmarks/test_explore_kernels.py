"""The kernel exploration drivers on CPU: ``explore_fwd64_sm90.py``'s variant grammar (every spec
it accepts builds a configuration ``BlockSparseFwd64Sm90`` takes; a bad one is refused) and its
per-round ratio helper. Nothing is timed here; the GPU runs are in benchmarks/results/."""

import pytest


@pytest.fixture(scope="module")
def explore(load_script):
    return load_script("explore_fwd64_sm90")


@pytest.mark.parametrize("spec, want", [
    ("base", {}),
    ("k2v3c2st", {"k_stages": 2, "v_stages": 3, "ctas_per_sm": 2, "stmatrix_epilogue": True}),
    ("q112", {"q_regs": 112}),
    ("q", {"q_regs": 128}),
    ("c2ql", {"ctas_per_sm": 2, "q_regs": 128, "lazy_rescale": True}),
    ("e", {"lazy_rescale": False}),
    ("q64e", {"q_regs": 64, "lazy_rescale": False}),
    ("xh", {"packed_steps": True, "l2_hints": True}),
    ("V", {"probe_loads": "skip_v"}),
    ("K", {"probe_loads": "skip_kv"}),
    ("Z", {"probe_loads": "tile0"}),
    ("W", {"probe_loads": "win16"}),
    ("win128", {"probe_loads": "win128"}),
    ("win64n", {"probe_loads": "win64", "lazy_vote": False}),
    ("rot396", {"rotate_walk": 396}),
    ("pf4", {"tile_prefetch": 4}),
    ("rot396pf2", {"rotate_walk": 396, "tile_prefetch": 2}),
])
def test_variant_grammar(explore, spec, want):
    assert explore.parse_variant(spec) == want


def test_variants_are_kernel_configurations(explore):
    pytest.importorskip("cutlass")
    from fastvideo_cute.kernels.cute.block_sparse_fwd64 import sm90_kernel_class

    for spec in ("base", "q112l", "c2q", "e", "k2c2", "xh", "V", "K", "Z", "W", "win64", "win256", "rot396", "pf4"):
        sm90_kernel_class()("bfloat16", 128, **explore.parse_variant(spec))


@pytest.mark.parametrize("bad", ["z", "q112z", "kx"])
def test_bad_variant_is_refused(explore, bad):
    with pytest.raises((SystemExit, KeyError)):
        explore.parse_variant(bad)


def test_packed_steps_flag_parses(explore):
    assert explore.parse_variant("x") == {"packed_steps": True}


def test_round_ratios_compare_within_each_round(explore):
    # cuDNN drifts from 1.0 to 2.0 ms; the entry is always 10 % faster in its own round
    all_ms = {"cudnn": [1.0, 1.5, 2.0], "ours": [0.9 / 0.99, 1.35 / 0.99, 1.8 / 0.99]}
    ratios = explore.round_ratios(all_ms, "cudnn")
    assert ratios["cudnn"] == 1.0
    assert ratios["ours"] == pytest.approx(1.1)


@pytest.mark.parametrize("fraction", [1.0, 0.5, 0.25])
def test_kv_working_set_lists_are_valid_q2k_lists_within_their_range(fraction, load_script):
    """explore_kv_working_set's lists: k ascending distinct tiles per row, all below the range it
    reports, counts k; the full range uses every kv tile somewhere."""
    import torch

    mod = load_script("explore_kv_working_set")
    gen = torch.Generator().manual_seed(0)
    idx, num, span = mod.lists(1, 3, 40, 40, 5, fraction, gen, device="cpu")
    assert span == round(40 * fraction) and idx.shape == (1, 3, 40, 5) and idx.dtype == torch.int32
    assert (num == 5).all()
    assert (idx[..., 1:] > idx[..., :-1]).all() and idx.min() >= 0 and idx.max() < span
    if fraction == 1.0:
        assert idx.unique().numel() == 40


def test_bench_rounds_settles_before_every_entry_and_rotates(explore, monkeypatch):
    """``bench_rounds``: every entry settled first (``bench_vsa.settle`` with ``args.settle``, 0.5 s when
    the script has no such argument), each round one entry later; the timer is stubbed (no GPU here)."""
    import types

    import bench_vsa
    import triton.testing

    calls = []
    monkeypatch.setattr(bench_vsa, "settle", lambda s: calls.append(("settle", s)))
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, warmup, rep: calls.append(("time", fn())) or 1.0)
    fns = {"a": lambda: "a", "b": lambda: "b"}
    med, times = explore.bench_rounds(fns, types.SimpleNamespace(rounds=2, warmup=1, rep=1))
    assert calls == [("settle", 0.5), ("time", "a"), ("settle", 0.5), ("time", "b"),
                     ("settle", 0.5), ("time", "b"), ("settle", 0.5), ("time", "a")]
    assert med == {"a": 1.0, "b": 1.0} and times == {"a": [1.0, 1.0], "b": [1.0, 1.0]}
    calls.clear()
    explore.bench_rounds({"a": fns["a"]}, types.SimpleNamespace(rounds=1, warmup=1, rep=1, settle=0))
    assert calls == [("settle", 0), ("time", "a")]


@pytest.mark.parametrize("order", ["sorted", "reversed", "shuffled"])
def test_reorder_lists_keeps_each_rows_set(explore, order):
    """``--orders``: each row's ``num`` selected entries walked in another order, the same set; the entries past
    ``num`` stay where they were; ``reversed`` is the built order backwards; a bad order is refused."""
    import torch

    from fastvideo_cute.metadata import map_to_index

    g = torch.Generator().manual_seed(3)
    bm = torch.rand(2, 3, 5, 9, generator=g) < 0.4
    bm[0, 0, 0] = False  # an empty row
    idx, num = map_to_index(bm)
    out = explore.reorder_lists(idx, num, order)
    assert out.shape == idx.shape and out.dtype == idx.dtype
    for b, h, r in torch.cartesian_prod(torch.arange(2), torch.arange(3), torch.arange(5)).tolist():
        n = int(num[b, h, r])
        got, want = out[b, h, r], idx[b, h, r]
        assert sorted(got[:n].tolist()) == sorted(want[:n].tolist())
        assert torch.equal(got[n:], want[n:])
        if order == "reversed":
            assert got[:n].tolist() == want[:n].tolist()[::-1]
        if order == "sorted":
            assert torch.equal(got, want)
    if order == "shuffled":
        assert not torch.equal(out, idx)  # 30 rows of up to 9 entries: some row moves
    with pytest.raises(SystemExit):
        explore.reorder_lists(idx, num, "random")
