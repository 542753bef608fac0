"""FA4 adapter on CPU: metadata, support predicate, version errors, argument checks.

Nothing here imports FA4 or runs a kernel. The metadata is checked against token masks derived
independently from the logical block map (``reference.block_token_mask``), not against the
builder's own helpers.
"""

import importlib.metadata

import pytest
import torch

from fastvideo_cute.adapters import fa4 as A
from fastvideo_cute.reference import block_token_mask

SM90, SM100 = (9, 0), (10, 0)


# ---------------------------------------------------------------------------------------------
# Independent reconstruction of the token mask from FA4 lists
# ---------------------------------------------------------------------------------------------


def _tokens_of_lists(index, tile_sizes, *, rows_are_q: bool, sq: int, skv: int) -> torch.Tensor:
    """Token mask [B, H, Sq, Skv] that the FA4 lists make the kernel compute."""
    qs, kt = index.block_size
    b, h, rows = index.full_cnt.shape
    out = torch.zeros(b, h, sq, skv, dtype=torch.bool)
    for bi in range(b):
        for hi in range(h):
            for r in range(rows):
                for cnt, idx, partial in ((index.full_cnt, index.full_idx, False),
                                          (index.mask_cnt, index.mask_idx, True)):
                    for c in idx[bi, hi, r, : int(cnt[bi, hi, r])].tolist():
                        qi, kj = (r, c) if rows_are_q else (c, r)
                        width = int(tile_sizes[kj]) if partial else kt
                        out[bi, hi, qi * qs:(qi + 1) * qs, kj * kt:kj * kt + width] = True
    return out


def _check_list_invariants(index, tile_sizes, kv_tile, *, rows_are_q: bool):
    for cnt, idx, partial in ((index.full_cnt, index.full_idx, False), (index.mask_cnt, index.mask_idx, True)):
        assert cnt.dtype == torch.int32 and idx.dtype == torch.int32
        assert idx.is_contiguous() and cnt.is_contiguous()
        assert idx.shape[:3] == cnt.shape
        b, h, rows = cnt.shape
        for bi in range(b):
            for hi in range(h):
                for r in range(rows):
                    sel = idx[bi, hi, r, : int(cnt[bi, hi, r])].tolist()
                    assert sel == sorted(set(sel)), "lists must be ascending, no repeats"
                    kv_tiles = sel if rows_are_q else [r] * len(sel)
                    for kj in kv_tiles:
                        size = int(tile_sizes[kj])
                        if partial:
                            assert 0 < size < kv_tile, "a partial tile has 0 < size < tile"
                        else:
                            assert size == kv_tile, "a full tile is exactly full"
    # (A tile cannot be in both lists: full means size == tile, partial means size < tile.)


def _case(seed, b, h, qb, kvb, block, sizes=None, density=0.4):
    g = torch.Generator().manual_seed(seed)
    block_map = torch.rand(b, h, qb, kvb, generator=g) < density
    block_map[0, 0, 0] = False  # a q block that selects nothing
    if sizes is None:
        sizes = torch.randint(0, block + 1, (kvb,), generator=g, dtype=torch.int32)
        sizes[0] = block
        sizes[-1] = 0
    return block_map, sizes


PLANS = [
    ("sm90-64", SM90, 64),
    ("sm90-128", SM90, 128),
    ("sm90-256", SM90, 256),
    ("sm100-128", SM100, 128),
    ("sm100-256", SM100, 256),
]


@pytest.mark.parametrize("name,arch,block", PLANS, ids=[p[0] for p in PLANS])
def test_forward_lists_reproduce_the_token_mask(name, arch, block):
    qb, kvb = 3, 5
    block_map, sizes = _case(1, 2, 2, qb, kvb, block)
    plan = A.fa4_fwd_plan(arch, block)
    meta = A.build_fwd_metadata(block_map, sizes, plan)
    assert meta.plan == plan
    assert meta.index.block_size == (plan.q_sparse, plan.kv_tile)
    # A physical (sparse) q block lies inside one logical q block: never merged across blocks.
    assert block % plan.q_sparse == 0
    assert meta.index.full_cnt.shape == (2, 2, qb * block // plan.q_sparse)
    assert meta.kv_tile_sizes.shape == (kvb * block // plan.kv_tile,)
    _check_list_invariants(meta.index, meta.kv_tile_sizes, plan.kv_tile, rows_are_q=True)
    got = _tokens_of_lists(meta.index, meta.kv_tile_sizes, rows_are_q=True, sq=qb * block, skv=kvb * block)
    want = block_token_mask(block_map, sizes, block, block)
    assert torch.equal(got, want)


@pytest.mark.parametrize("arch,block", [(SM90, 128), (SM90, 256), (SM100, 128), (SM100, 256)])
def test_backward_lists_are_the_kv_owned_transpose(arch, block):
    qb, kvb = 4, 3
    block_map, sizes = _case(2, 1, 3, qb, kvb, block)
    plan = A.fa4_bwd_plan(arch, block)
    assert plan.kv_tile == 128 and plan.q_sparse == block
    meta = A.build_bwd_metadata(block_map, sizes, plan)
    kv_tiles = kvb * block // 128
    assert meta.index.full_cnt.shape == (1, 3, kv_tiles)
    assert meta.index.full_idx.shape == (1, 3, kv_tiles, qb)
    _check_list_invariants(meta.index, meta.kv_tile_sizes, plan.kv_tile, rows_are_q=False)
    got = _tokens_of_lists(meta.index, meta.kv_tile_sizes, rows_are_q=False, sq=qb * block, skv=kvb * block)
    assert torch.equal(got, block_token_mask(block_map, sizes, block, block))


def test_256_blocks_split_into_128_tiles_and_size0_tiles_are_dropped():
    sizes = torch.tensor([256, 200, 100, 0, 128], dtype=torch.int32)
    block_map = torch.ones(1, 1, 1, 5, dtype=torch.bool)
    meta = A.build_fwd_metadata(block_map, sizes, A.fa4_fwd_plan(SM100, 256))
    assert meta.kv_tile_sizes.tolist() == [128, 128, 128, 72, 100, 0, 0, 0, 128, 0]
    idx = meta.index
    assert idx.full_idx[0, 0, 0, : int(idx.full_cnt[0, 0, 0])].tolist() == [0, 1, 2, 8]
    assert idx.mask_idx[0, 0, 0, : int(idx.mask_cnt[0, 0, 0])].tolist() == [3, 4]
    # tiles 5, 6, 7, 9 (size 0) are in neither list


def test_sizes_out_of_range_clamp_like_the_reference():
    sizes = torch.tensor([300, -5, 128], dtype=torch.int32)
    block_map = torch.ones(1, 1, 2, 3, dtype=torch.bool)
    meta = A.build_fwd_metadata(block_map, sizes, A.fa4_fwd_plan(SM90, 128))
    assert meta.kv_tile_sizes.tolist() == [128, 0, 128]
    got = _tokens_of_lists(meta.index, meta.kv_tile_sizes, rows_are_q=True, sq=256, skv=384)
    assert torch.equal(got, block_token_mask(block_map, sizes, 128, 128))


def test_3d_map_and_empty_rows():
    block_map = torch.zeros(2, 2, 3, dtype=torch.bool)  # [H, Qb, KVb]
    block_map[1, 1, 2] = True
    sizes = torch.tensor([128, 128, 0], dtype=torch.int32)  # the only selected block has size 0
    meta = A.build_fwd_metadata(block_map, sizes, A.fa4_fwd_plan(SM90, 128))
    assert int(meta.index.full_cnt.sum()) == 0 and int(meta.index.mask_cnt.sum()) == 0


def test_backward_metadata_is_not_built_by_the_forward(monkeypatch):
    calls = []
    monkeypatch.setattr(A, "build_bwd_metadata", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(A, "fa4_arch", lambda: SM90)
    monkeypatch.setattr(A, "fa4_block_sparse_fwd_prebuilt", lambda q, k, v, meta, **kw: ("out", meta))
    q = torch.zeros(1, 256, 2, 128, dtype=torch.bfloat16)
    block_map = torch.ones(1, 2, 2, 2, dtype=torch.bool)
    sizes = torch.tensor([128, 7], dtype=torch.int32)
    for need_backward in (False, True):
        out, meta = A.fa4_block_sparse_fwd(q, q, q, block_map, sizes, block_size=128, need_backward=need_backward)
        assert meta.index.full_cnt.shape == (1, 2, 2)
    assert calls == []


# ---------------------------------------------------------------------------------------------
# Support predicate
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch,block,grad", [(SM90, 64, False), (SM90, 128, True), (SM90, 256, True),
                                             (SM100, 128, True), (SM100, 256, True), ((10, 3), 128, False)])
def test_support_true(arch, block, grad):
    for d in (64, 128):
        for dt in (torch.bfloat16, torch.float16):
            assert A.fa4_support(arch, dt, d, block, block, grad) == (True, "")


@pytest.mark.parametrize("args,words", [
    ((None, torch.bfloat16, 128, 128, 128, False), ["CUDA GPU"]),
    (((8, 0), torch.bfloat16, 128, 128, 128, False), ["sm_80", "sm_90"]),
    (((12, 0), torch.bfloat16, 128, 128, 128, False), ["sm_120"]),
    ((SM90, torch.float32, 128, 128, 128, False), ["float32"]),
    ((SM90, torch.bfloat16, 96, 128, 128, False), ["head_dim", "96"]),
    ((SM90, torch.bfloat16, 128, 128, 256, False), ["same logical block size"]),
    ((SM90, torch.bfloat16, 128, 32, 32, False), ["block size", "32"]),
    ((SM90, torch.bfloat16, 128, 64, 64, True), ["backward", "128-wide kv tiles"]),
    ((SM100, torch.bfloat16, 128, 64, 64, False), ["sm_100", "span two logical q blocks"]),
])
def test_support_false_says_why(args, words):
    ok, reason = A.fa4_support(*args)
    assert ok is False
    for w in words:
        assert w in reason, (w, reason)


def test_plans_match_the_predicate():
    for arch in (SM90, SM100):
        for block in (64, 128, 256):
            for grad in (False, True):
                ok, _ = A.fa4_support(arch, torch.bfloat16, 128, block, block, grad)
                if ok:
                    A.fa4_fwd_plan(arch, block)
                    if grad:
                        A.fa4_bwd_plan(arch, block)
    with pytest.raises(A.FA4UnsupportedError):
        A.fa4_fwd_plan(SM100, 64)
    with pytest.raises(A.FA4UnsupportedError):
        A.fa4_bwd_plan(SM90, 64)


def test_single_q_stage_seqlen_answers_only_the_stage_question():
    s = A._SingleQStageSeqlen(65536)
    assert int(s) == 65536 and s == 65536
    assert not (s > 128)  # FA4: q_stage = 2 if max_seqlen_q * f > tile_m else 1
    assert s > 127 and s > 4096 and not (s > 65536)
    assert (s <= 128) is False  # FA4's max_m_blocks_leq_one must stay False
    assert isinstance(s * 1, A._SingleQStageSeqlen) and isinstance(1 * s, A._SingleQStageSeqlen)
    assert not (s * 1 > 128)
    assert (s + 127) // 128 == 512  # the scheduler's m-block count keeps the true length
    assert type(s.__pyir_plain_view__()) is int and s.__pyir_plain_type__ is int


# ---------------------------------------------------------------------------------------------
# load_fa4 error messages
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_loader():
    A.load_fa4.cache_clear()
    yield
    A.load_fa4.cache_clear()


def _fake_versions(monkeypatch, table):
    real = importlib.metadata.version

    def version(name):
        if name in table:
            if table[name] is None:
                raise importlib.metadata.PackageNotFoundError(name)
            return table[name]
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)


def test_load_fa4_names_the_mismatch_and_the_symptoms(monkeypatch, fresh_loader):
    monkeypatch.delenv("FASTVIDEO_CUTE_FA4_ALLOW_VERSION_MISMATCH", raising=False)
    _fake_versions(monkeypatch, {"flash-attn-4": "4.0.0b36", "nvidia-cutlass-dsl": "4.5.2",
                                 "quack-kernels": "0.6.2"})
    with pytest.raises(ImportError) as err:
        A.load_fa4()
    msg = str(err.value)
    assert "nvidia-cutlass-dsl: installed 4.5.2, pinned 4.8.1" in msg
    assert "quack-kernels: installed 0.6.2, pinned 0.6.5" in msg
    assert "flash-attn-4: installed" not in msg  # only the mismatches are listed
    for symptom in ("fmax() missing 1 required positional argument: 'b'", "has no attribute 'ThrMma'",
                    "cannot import name 'alloc_reserved_mbarrier'"):
        assert symptom in msg
    assert "4.5.x" in msg and "quack-kernels too old" in msg and "quack-kernels too new" in msg
    assert "pip install 'flash-attn-4==4.0.0b36' 'nvidia-cutlass-dsl==4.8.1' 'quack-kernels==0.6.5'" in msg
    assert "FASTVIDEO_VSA_TRITON=1" in msg


def test_load_fa4_missing_package(monkeypatch, fresh_loader):
    monkeypatch.delenv("FASTVIDEO_CUTE_FA4_ALLOW_VERSION_MISMATCH", raising=False)
    _fake_versions(monkeypatch, {"flash-attn-4": None})
    with pytest.raises(ImportError, match="flash-attn-4: not installed, pinned 4.0.0b36"):
        A.load_fa4()


def test_version_problems_empty_when_pinned(monkeypatch):
    _fake_versions(monkeypatch, dict(A.FA4_PINS))
    assert A.fa4_version_problems() == []


# ---------------------------------------------------------------------------------------------
# Argument checks (all raise before FA4 is touched)
# ---------------------------------------------------------------------------------------------


def _args(sq=256, skv=384, b=1, h=2, d=128, block=128):
    q = torch.zeros(b, sq, h, d, dtype=torch.bfloat16)
    k = torch.zeros(b, skv, h, d, dtype=torch.bfloat16)
    block_map = torch.ones(b, h, sq // block, skv // block, dtype=torch.bool)
    sizes = torch.full((skv // block,), block, dtype=torch.int32)
    return q, k, k.clone(), block_map, sizes


@pytest.mark.parametrize("mutate,name", [
    (lambda a: a.update(block_size=100), "block_size"),
    (lambda a: a.update(q=a["q"][0]), "q"),
    (lambda a: a.update(q=a["q"].float()), "q"),
    (lambda a: a.update(k=a["k"][:, :, :1]), "k"),
    (lambda a: a.update(v=a["v"].half()), "dtype"),
    (lambda a: a.update(block_map=a["block_map"][..., :2]), "block_map"),
    (lambda a: a.update(block_map=a["block_map"][0, 0]), "block_map"),
    (lambda a: a.update(block_map=a["block_map"].float()), "block_map"),
    (lambda a: a.update(kv_block_sizes=a["kv_block_sizes"][:2]), "kv_block_sizes"),
    (lambda a: a.update(kv_block_sizes=a["kv_block_sizes"].float()), "kv_block_sizes"),
    (lambda a: a.update(q=a["q"][:, :200]), "multiples of block_size"),
])
def test_bad_forward_arguments_raise_value_error_naming_them(mutate, name):
    q, k, v, block_map, sizes = _args()
    a = dict(q=q, k=k, v=v, block_map=block_map, kv_block_sizes=sizes, block_size=128)
    mutate(a)
    with pytest.raises(ValueError, match=name):
        A.fa4_block_sparse_fwd(a["q"], a["k"], a["v"], a["block_map"], a["kv_block_sizes"],
                               block_size=a["block_size"], need_backward=False)


def test_bad_backward_arguments_raise_value_error_naming_them():
    q, k, v, block_map, sizes = _args()
    lse = torch.zeros(1, 2, 256)
    with pytest.raises(ValueError, match="dout"):
        A.fa4_block_sparse_bwd(q, k, v, q, q[:, :128], lse, block_map, sizes, block_size=128)
    with pytest.raises(ValueError, match="out"):
        A.fa4_block_sparse_bwd(q, k, v, q.half(), q, lse, block_map, sizes, block_size=128)
    with pytest.raises(ValueError, match="lse"):
        A.fa4_block_sparse_bwd(q, k, v, q, q, lse.transpose(1, 2), block_map, sizes, block_size=128)
    with pytest.raises(ValueError, match="lse"):
        A.fa4_block_sparse_bwd(q, k, v, q, q, lse.double(), block_map, sizes, block_size=128)


def test_unsupported_call_raises_with_reason(monkeypatch):
    monkeypatch.setattr(A, "fa4_arch", lambda: SM90)
    q, k, v, _, _ = _args(block=64)
    block_map = torch.ones(1, 2, 4, 6, dtype=torch.bool)
    sizes = torch.full((6,), 64, dtype=torch.int32)
    with pytest.raises(A.FA4UnsupportedError, match="128-wide kv tiles"):
        A.fa4_block_sparse_fwd(q, k, v, block_map, sizes, block_size=64, need_backward=True)
    lse = torch.zeros(1, 2, 256)
    with pytest.raises(A.FA4UnsupportedError, match="128-wide kv tiles"):
        A.fa4_block_sparse_bwd(q, k, v, q, q, lse, block_map, sizes, block_size=64)


def test_importing_the_adapter_does_not_import_fa4():
    import subprocess
    import sys
    code = ("import sys, fastvideo_cute.adapters.fa4 as a; "
            "print(any(m == 'cutlass' or m.startswith('flash_attn') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name,arch,block", PLANS, ids=[p[0] for p in PLANS])
def test_all_full_fast_path_equals_the_general_build(name, arch, block):
    """With every kv block full, the all_full build (no partial map, no second sort) gives the
    same token mask and the same full lists as the general build, and empty partial lists."""
    qb, kvb = 3, 4
    block_map, sizes = _case(5, 1, 2, qb, kvb, block, sizes=torch.full((kvb,), block, dtype=torch.int32))
    for build, plan in ((A.build_fwd_metadata, A.fa4_fwd_plan(arch, block)),
                        (A.build_bwd_metadata, A.fa4_bwd_plan(arch, block) if block != 64 else None)):
        if plan is None:
            continue
        general = build(block_map, sizes, plan)
        fast = build(block_map, sizes, plan, all_full=True)
        assert torch.equal(fast.index.full_cnt, general.index.full_cnt)
        n = general.index.full_cnt
        for bi, hi, r in torch.nonzero(torch.ones_like(n, dtype=torch.bool)).tolist():
            c = int(n[bi, hi, r])
            assert torch.equal(fast.index.full_idx[bi, hi, r, :c], general.index.full_idx[bi, hi, r, :c])
        assert (fast.index.mask_cnt == 0).all() and fast.index.mask_idx.shape == fast.index.full_idx.shape
        assert torch.equal(fast.kv_tile_sizes, general.kv_tile_sizes)
