"""CPU checks of the CuTe DSL VSA backward, 64-token blocks (fastvideo_cute/kernels/cute/block_sparse_bwd64).

Cross-compiles the chain's registry kernels through the shared session fixture
(``conftest.kernel_report``): the arch-independent stages for sm_90a, sm_100a and sm_103a (SIMT:
128-bit global accesses, no MMA), the tcgen05 main kernel for sm_100a and sm_103a (UTCHMMA,
tensor-memory loads LDTM, TMA loads, the fp32 bulk reduce-add in the SASS). Registers and spills
are printed (``pytest -s``) and spills must be 0. Also on CPU: the torch model of the main
kernel's math (``emulate_main``) against the fp32 autograd reference, the work order, and the
support predicates' refusals.
"""

import math

import pytest
import torch

from fastvideo_cute.compile_check import sass_is_for_arch

pytest.importorskip("cutlass")

from fastvideo_cute.adapters import cute_sm100_bwd as A  # noqa: E402
from fastvideo_cute.kernels.cute import find  # noqa: E402
from fastvideo_cute.metadata import index_to_map, invert_indices  # noqa: E402
from fastvideo_cute.reference import block_sparse_attn_reference  # noqa: E402

COMMON = ("block_sparse_bwd64_preprocess", "block_sparse_bwd64_preprocess_nodq", "block_sparse_bwd64_postprocess",
          "block_sparse_bwd64_postprocess_frag")
MAIN = "block_sparse_bwd64_sm100"
COMMON_ARCHS = ("sm_90a", "sm_100a", "sm_103a")
MAIN_ARCHS = ("sm_100a", "sm_103a")
BUILDS = [(name, arch) for name in COMMON for arch in COMMON_ARCHS] + [(MAIN, arch) for arch in MAIN_ARCHS]


@pytest.mark.parametrize("name,arch", BUILDS)
def test_every_entry_compiles_without_spills(kernel_report, name, arch):
    report = kernel_report(name, arch)
    print(report.line)
    assert report.ok, report.line
    assert report.spill == 0, f"{name} spills on {arch}: {report.line}"


def test_registry_targets():
    for name in COMMON:
        assert set(find(name).archs) == set(COMMON_ARCHS)
    assert set(find(MAIN).archs) == set(MAIN_ARCHS)


@pytest.mark.parametrize("arch", COMMON_ARCHS)
@pytest.mark.parametrize("name", COMMON)
def test_common_stages_sass(kernel_report, name, arch):
    sass = kernel_report(name, arch).sass
    assert sass_is_for_arch(sass, arch)
    assert "LDG.E.128" in sass  # vectorized fp32 / bf16 loads
    for op in ("HMMA", "HGMMA", "UTCHMMA"):
        assert op not in sass
    if "preprocess" in name:
        assert "SHFL.BFLY" in sass and "STG.E.128" in sass
    if name.endswith("postprocess_frag"):  # a thread's 16 float4 of its tile, then 2 rows x 16 bf16 pairs
        assert sass.count("LDG.E.128 ") == 16 and sass.count("STG.E desc") == 32


@pytest.mark.parametrize("arch", COMMON_ARCHS)
def test_preprocess_nodq_leaves_dq_accum_alone(kernel_report, arch):
    """The split backward's preprocess drops exactly the dq_accum zeroing: a thread's 8 fp32 float4
    stores (64 rows x 128 / 256 threads / 4); the dk/dv zero rows (4 bf16 x 8 stores each) stay."""
    full = kernel_report("block_sparse_bwd64_preprocess", arch).sass.count("STG.E.128")
    nodq = kernel_report("block_sparse_bwd64_preprocess_nodq", arch).sass.count("STG.E.128")
    assert (full, nodq) == (16, 8)


@pytest.mark.parametrize("arch", MAIN_ARCHS)
def test_main_kernel_sass(kernel_report, arch):
    """tcgen05 MMAs (5 GEMMs: 8 + 8 + 8 + 8 + 4 K-steps), tensor-memory loads, TMA loads (K, V: 2
    boxes each, Q, dO: 4 each), the fp32 bulk reduce-add of dQ (two q blocks a pair), no spills."""
    report = kernel_report(MAIN, arch)
    assert " OK" in report.line and report.spill == 0, report.line
    assert report.count("UTCHMMA") == 36
    assert report.count("LDTM") > 0
    assert report.count("UTMALDG") == 12
    assert report.count("UBLKRED") == 2 and "UBLKRED.G.S.ADD.F32" in report.sass
    assert report.count("HMMA") == 0 and report.count("HGMMA") == 0


def test_tables():
    from fastvideo_cute.kernels.cute import block_sparse_bwd64 as pkg
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import limits

    assert A.COMMON_CAPABILITIES is limits.COMMON_CAPABILITIES and A.MAIN_CAPABILITIES is limits.MAIN_CAPABILITIES
    assert set(pkg.COMMON_ARCHS) == set(COMMON_ARCHS)
    assert pkg.stage_class("preprocess").__name__ == "BlockSparseBwd64Preprocess"
    assert A.main_kernel_available("sm_100a") and not A.main_kernel_available("sm_103a")
    assert pkg.main_kernel_class().__name__ == "BlockSparseBwd64Sm100"


def _case(nb=6, topk=3, heads=2, batch=1, seed=0, nan_padding=True, excluded=(), empty_q=()):
    gen = torch.Generator().manual_seed(seed)
    S = nb * 64
    q, k, v, do = (torch.randn(batch, heads, S, 128, generator=gen).bfloat16() for _ in range(4))
    pool = [j for j in range(nb) if j not in excluded]
    idx = torch.zeros(batch, heads, nb, topk, dtype=torch.int32)
    for b in range(batch):
        for h in range(heads):
            for i in range(nb):
                perm = torch.randperm(len(pool), generator=gen)[:topk]
                idx[b, h, i] = torch.tensor(sorted(pool[p] for p in perm.tolist()), dtype=torch.int32)
    num = torch.full((batch, heads, nb), topk, dtype=torch.int32)
    for i in empty_q:
        num[:, :, i] = 0
    vbs = torch.randint(20, 65, (nb,), generator=gen, dtype=torch.int32)
    if nan_padding:
        pad = torch.arange(S) % 64 >= vbs.repeat_interleave(64)
        k[..., pad, :] = float("nan")
        v[..., pad, :] = float("inf")
    return q, k, v, do, idx, num, vbs


@pytest.mark.parametrize("topk,excluded,empty_q", [(3, (), (1,)), (1, (2,), ()), (5, (), ()), (2, (0, 3), (4,))])
def test_emulated_main_matches_reference(topk, excluded, empty_q):
    """The main kernel's math (lse2, delta from the bf16 output, select-masking, scaling) against
    fp32 autograd, padded K/V holding NaN/Inf; seed 000's tolerances."""
    nb = 6
    q, k, v, do, idx, num, vbs = _case(nb=nb, topk=min(topk, nb - len(excluded)), excluded=excluded, empty_q=empty_q)
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    out, lse = block_sparse_attn_reference(qf, kf, vf, index_to_map(idx, num, nb), vbs)
    (out * do.float()).sum().backward()
    o = out.detach().bfloat16()
    delta = (o.float() * do.float()).sum(-1)
    lse2 = torch.where(lse == -math.inf, math.inf, lse * A.LOG2E)
    kidx, knum = invert_indices(idx, num, nb)
    scale = 128**-0.5
    dq_accum, dk, dv = A.emulate_main(q, k, v, do, lse2, delta, kidx, knum, vbs, scale)
    dq = torch.where((lse == -math.inf)[..., None], 0.0, dq_accum * scale)
    for name, got, ref in (("dq", dq, qf.grad), ("dk", dk, kf.grad), ("dv", dv, vf.grad)):
        assert torch.isfinite(got).all(), name
        diff = (got.bfloat16().float() - ref).abs()
        assert diff.max() / ref.abs().max() <= 1e-2 and diff.mean() <= 1e-3, name
    pad = torch.arange(nb * 64) % 64 >= vbs.repeat_interleave(64)
    assert (dk[..., pad, :] == 0).all() and (dv[..., pad, :] == 0).all()
    for j in excluded:
        assert (dk[..., j * 64:(j + 1) * 64, :] == 0).all() and (dv[..., j * 64:(j + 1) * 64, :] == 0).all()
    if empty_q:
        assert (lse == -math.inf).any() and (dq[(lse == -math.inf)] == 0).all()


def test_work_order():
    num = torch.randint(0, 40, (2, 3, 16), dtype=torch.int32)
    assert A.work_order(num, 16) is None
    nb = A.ORDER_MIN_KV_BLOCKS  # the package's limits.ORDER_MIN_KV_BLOCKS
    num = torch.randint(0, 200, (1, 2, nb), dtype=torch.int32)
    order = A.work_order(num, nb)
    assert order.dtype == torch.int32 and order.shape == (2 * nb,)
    assert torch.equal(order.sort().values, torch.arange(2 * nb, dtype=torch.int32))
    flat = num.reshape(-1)
    width = (int(flat.max()) + A.ORDER_NUM_BINS - 1) // A.ORDER_NUM_BINS
    bins = flat[order.long()] // width
    assert (bins[:-1] >= bins[1:]).all()  # longest bin first
    for b in bins.unique():
        members = order[bins == b]
        assert (members[:-1] < members[1:]).all()  # identity order inside a bin


def test_support_refuses_on_cpu_and_bad_shapes():
    q = torch.zeros((1, 2, 256, 128), dtype=torch.bfloat16)
    lse = torch.zeros((1, 2, 256))
    idx = torch.zeros((1, 2, 4, 4), dtype=torch.int32)
    num = torch.zeros((1, 2, 4), dtype=torch.int32)
    vbs = torch.full((4,), 64, dtype=torch.int32)
    ok, reason = A.sm100_bwd64_support(q, q, q, q, q, lse, idx, num, vbs)
    assert not ok and "CUDA" in reason
    ok, reason = A.sm100_bwd64_common_support(q, q, lse, num, vbs)
    assert not ok and "CUDA" in reason
    with pytest.raises(ValueError, match="CUDA"):
        A.sm100_block_sparse_bwd64(q, q, q, q, q, lse, idx, num, vbs)
    with pytest.raises(ValueError, match="CUDA"):
        A.sm100_bwd64_common_stages(q, q, lse, num, vbs)
    # the metadata checks (device-independent part)
    assert A._check_meta(q, lse, idx, num, vbs) == (True, "")
    assert "even" in A._check_meta(q[:, :, :192].contiguous(), lse[..., :192].contiguous(), idx[:, :, :3], num[..., :3],
                                   vbs[:3])[1]
    assert "seqlen" in A._check_meta(q, lse, idx[:, :, :2], num[..., :2], vbs[:2])[1]
    assert "lse" in A._check_meta(q, lse.double(), idx, num, vbs)[1]
    assert "k2q_idx" in A._check_meta(q, lse, idx[..., :0], num, vbs)[1]
    assert "k2q_num" in A._check_meta(q, lse, idx, num[..., :2], vbs)[1]
    assert "integer" in A._check_meta(q, lse, idx.float(), num, vbs)[1]


def test_main_kernel_operand_views_share_bytes():
    """The main kernel reads one shared-memory buffer through several layouts (TMA boxes, the
    K-major and the MN-major MMA operand views, the register -> smem store view of P/dS); they
    must address the same element at the same (swizzled) offset. Evaluated at trace time."""
    import cutlass.cute as cute

    from fastvideo_cute.kernels.cute.block_sparse_bwd64.block_sparse_bwd64_sm100 import BlockSparseBwd64Sm100

    checked = []

    def compare(L):  # plain Python (not preprocessed by the DSL): loops and asserts run at trace time
        sQ, sQt, sK, sKt, sP, sPt = L["sQ"], L["sQt"], L["sK"], L["sKt"], L["sP"], L["sPt"]
        box_pair, box_kv, sPe = L["box_pair"], L["box_kv"], L["sPe"]
        for q in range(0, 128, 3):
            for d in range(0, 128, 5):
                a = sQ(((q, d % 16), 0, ((d // 16) % 4, d // 64)))
                b = sQt((((d % 64, d // 64), q % 16), 0, q // 16))
                c = box_pair(((q % 8, (q % 64) // 8), (d % 64, 0), (0, q // 64 + 2 * (d // 64))))
                assert a == b == c, ("Q", q, d, a, b, c)
        for kv in range(0, 64, 3):
            for d in range(0, 128, 5):
                a = sK(((kv, d % 16), 0, ((d // 16) % 4, d // 64)))
                b = sKt((((d % 64, d // 64), kv % 16), 0, kv // 16))
                c = box_kv(((kv % 8, kv // 8), (d % 64, 0), (0, d // 64)))
                assert a == b == c, ("K", kv, d, a, b, c)
        for q in range(0, 128, 3):
            for kv in range(0, 64, 1):
                a = sP(((q, kv % 16), 0, kv // 16))
                b = sPt(((kv, q % 16), 0, q // 16))
                c = sP.outer(((q, kv % 16), 0, kv // 16))
                e = sPe(((q % 8, q // 8), (kv, 0)))
                assert a == b and c == e, ("P", q, kv, a, b, c, e)
        checked.append(True)

    @cute.jit
    def check():
        compare(BlockSparseBwd64Sm100().make_mmas_and_layouts())

    check()
    assert checked
