"""The shared static checks of our CuTe kernels' adapters, on fake CUDA tensors (no GPU needed)."""

import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from fastvideo_cute.adapters._checks import check_bhsd_bf16, check_block_lists


@pytest.fixture
def fake():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FakeTensorMode():
            yield lambda *shape, dtype=torch.bfloat16: torch.empty(*shape, device="cuda", dtype=dtype)


def test_activation_checks(fake):
    q, k = fake(1, 2, 256, 128), fake(1, 2, 256, 128)
    assert check_bhsd_bf16((("q", q), ("k", k)), 128) == (True, "")
    ok, why = check_bhsd_bf16((("q", q), ("k", fake(1, 2, 128, 128))), 128)
    assert not ok and "k has shape" in why
    ok, why = check_bhsd_bf16((("q", fake(1, 2, 256, 128, dtype=torch.float16)),), 128)
    assert not ok and "must be bfloat16" in why
    ok, why = check_bhsd_bf16((("q", q.transpose(1, 2)),), 128)
    assert not ok and "contiguous" in why
    ok, why = check_bhsd_bf16((("q", fake(1, 2, 256, 64)),), 128)
    assert not ok and "head_dim must be 128" in why
    ok, why = check_bhsd_bf16((("q", torch.empty(1, 2, 256, 128, dtype=torch.bfloat16)),), 128)
    assert not ok and "not a CUDA tensor" in why


def test_block_list_checks(fake):
    q = fake(1, 2, 256, 128)
    idx, num, sizes = fake(1, 2, 2, 2, dtype=torch.int32), fake(1, 2, 2, dtype=torch.int32), fake(2, dtype=torch.int32)
    assert check_block_lists(q, "q2k_idx", idx, "q2k_num", num, sizes, 128) == (True, "")
    ok, why = check_block_lists(q, "q2k_idx", idx, "q2k_num", num, sizes, 64)
    assert not ok and "must equal num_blocks" in why
    ok, why = check_block_lists(q, "q2k_idx", idx, "q2k_num", fake(1, 2, 3, dtype=torch.int32), sizes, 128)
    assert not ok and "q2k_num must be [1, 2, 2]" in why
    ok, why = check_block_lists(q, "q2k_idx", fake(1, 2, 2, 2), "q2k_num", num, sizes, 128)
    assert not ok and "q2k_idx must be an integer tensor" in why
    assert check_block_lists(q, "k2q_idx", None, "k2q_num", num, sizes, 128) == (True, "")


def test_launch_limits():
    from fastvideo_cute.adapters._checks import LaunchLimits

    lim = LaunchLimits(max_batch_heads=100, max_rows=10_000, max_index_elems=5_000)
    assert lim.fits(2, 10, 256, 4, 4)
    assert not lim.fits(11, 10, 8, 1, 1)  # grid y
    assert not lim.fits(1, 10, 2048, 4, 4)  # rows
    assert not lim.fits(1, 10, 256, 40, 40)  # index elements
    assert "launch limits" in lim.describe()


# ---------------------------------------------------------------------------------------------- the kernels' own limits
# Each kernel declares its launch limits once (kernels/cute/<op>/limits.py); the adapters' support
# predicates must refuse, before any launch, exactly the calls past them. Fake CUDA tensors on a
# pretended device of the kernel's arch (no memory is allocated, so the sizes can be huge).


@pytest.fixture
def on_arch(monkeypatch):
    def pretend(capability):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        from fastvideo_cute.adapters import _checks

        monkeypatch.setattr(_checks, "cute_dsl_importable", lambda: True)

    return pretend


def _list_call(fake, batch, heads, blocks, block, max_kv):
    q = fake(batch, heads, blocks * block, 128)
    idx = fake(batch, heads, blocks, max_kv, dtype=torch.int32)
    num = fake(batch, heads, blocks, dtype=torch.int32)
    sizes = fake(blocks, dtype=torch.int32)
    return q, q, q, idx, num, sizes


@pytest.mark.parametrize("adapter_name,capability", [("cute_sm120", (12, 1)), ("cute_sm120", (9, 0)),
                                                      ("cute_sm100_fwd", (10, 0))])
def test_list_forward_predicates_enforce_the_kernels_limits(fake, on_arch, adapter_name, capability):
    import importlib

    adapter = importlib.import_module(f"fastvideo_cute.adapters.{adapter_name}")
    predicate = adapter.sm120_fwd_support if adapter_name == "cute_sm120" else adapter.sm100_fwd64_support
    limits, block = adapter.LIMITS, adapter.BLOCK
    on_arch(capability)
    assert predicate(*_list_call(fake, 1, 2, 2, block, 2)) == (True, "")
    # grid y: batch * heads
    bh = limits.max_batch_heads
    assert predicate(*_list_call(fake, 1, bh, 1, block, 1))[0]
    ok, why = predicate(*_list_call(fake, 1, bh + 1, 1, block, 1))
    assert not ok and "launch limits" in why
    ok, why = predicate(*_list_call(fake, 2, bh // 2 + 1, 1, block, 1))
    assert not ok and "launch limits" in why
    # int32 rows: batch * heads * seqlen
    rows_blocks = limits.max_rows // block  # the most whole blocks within the row limit
    assert predicate(*_list_call(fake, 1, 1, rows_blocks, block, 1))[0]
    ok, why = predicate(*_list_call(fake, 1, 1, rows_blocks + 1, block, 1))
    assert not ok and "launch limits" in why
    # int32 list offsets: batch * heads * blocks * max_kv
    elems = limits.max_index_elems
    ok, why = predicate(*_list_call(fake, 1, 1, 2, block, elems // 2 + 1))
    assert not ok and "launch limits" in why
    assert predicate(*_list_call(fake, 1, 1, 2, block, elems // 2))[0]


def test_backward_predicate_enforces_the_row_limit(fake, on_arch):
    from fastvideo_cute.adapters import cute_sm100_bwd as A
    from fastvideo_cute.kernels.cute.block_sparse_bwd64.limits import MAX_ROWS

    on_arch((10, 0))

    def call(heads, blocks, max_q=1):
        q = fake(1, heads, blocks * A.BLOCK, 128)
        lse = fake(1, heads, blocks * A.BLOCK, dtype=torch.float32)
        idx = fake(1, heads, blocks, max_q, dtype=torch.int32)
        num = fake(1, heads, blocks, dtype=torch.int32)
        sizes = fake(blocks, dtype=torch.int32)
        return A.sm100_bwd64_support(q, q, q, q, q, lse, idx, num, sizes)

    assert call(2, 4) == (True, "")
    blocks = MAX_ROWS // A.BLOCK // 2 * 2  # even, within the limit
    assert call(1, blocks)[0]
    ok, why = call(1, blocks + 2)
    assert not ok and "launch limits" in why
    ok, why = call(1, 2, max_q=MAX_ROWS // 2 + 1)  # the k2q list's int32 offsets
    assert not ok and "launch limits" in why
