"""CPU checks of the warp-specialized Hopper 64-token backward main kernel
(``block_sparse_bwd64_sm90_ws``).

Cross-compiles it for sm_90a (the shared session fixture) and checks the SASS holds the design:
the five GEMMs as wgmma (S^T = K Q^T and dP^T = V dO^T as 64x64x16, 8 k-steps each, with K / V
from registers after one ldmatrix load; dV += P^T dO, dK += dS^T Q and dQ = dS K as 64x128x16,
4 k-steps each), TMA loads (K, V, Q, dO) and 256-byte bulk copies of lse2/delta, dS^T stored by
stmatrix, the dQ tile added into dq_accum by a TMA tensor reduce (four 32-column boxes of the
128-byte swizzled tile), register reallocation between the producer and the MMA warpgroups, no
per-element atomics (the grouped build adds dK/dV by fp32 reductions), no spill. Correctness and
speed are checked on the H200: tests/kernels/cute/test_block_sparse_bwd64_sm90_gpu.py,
benchmarks/explore_bwd64_sm90.py.
"""

import re

import pytest

pytest.importorskip("cutlass")

NAME = "block_sparse_bwd64_sm90_ws"


def _assert_register_pool_fits(report):
    """The producer warpgroup's ``setmaxnreg.dec`` and the two MMA warpgroups' ``setmaxnreg.inc`` targets
    sum to at most 3 x 168 (the registers a thread the CTA is launched with): a larger sum leaves an
    increase waiting forever (a removed option's first build, 32 + 224 + 256, hung on the H100 in the
    twenty-second session: tests/logs/h100_2026-12-06_s22_c13d9ef.log)."""
    down = [int(x, 16) for x in re.findall(r"USETMAXREG\.DEALLOC\.CTAPOOL (0x[0-9a-f]+)", report.sass)]
    up = [int(x, 16) for x in re.findall(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL UP\d, (0x[0-9a-f]+)", report.sass)]
    assert len(down) == 1 and len(up) == 2, (down, up)
    assert sum(down) + sum(up) <= 3 * 168, (down, up)


def _shapes(report):
    return re.findall(r"HGMMA\.(\d+x\d+x\d+)\.F32", report.sass)


def test_compile_check_passes(kernel_report):
    report = kernel_report(NAME, "sm_90a")
    print(report.line)
    assert report.ok and report.line.endswith(" OK"), report.line
    # 384 threads, one CTA per SM: 168 at launch (65536 / 384), setmaxnreg moves them; no spill
    # measured with nvidia-cutlass-dsl 4.8.1
    assert report.regs <= 168 and report.spill == 0, report.line
    _assert_register_pool_fits(report)


def test_sass_holds_the_warp_specialized_design(kernel_report):
    report = kernel_report(NAME, "sm_90a")
    shapes = _shapes(report)
    assert shapes.count("64x64x16") == 8 + 8, shapes  # S^T (WG1), dP^T (WG2)
    assert shapes.count("64x128x16") == 4 + 4 + 4, shapes  # dV (WG1); dQ, dK (WG2)
    assert re.search(r"HGMMA\.64x64x16\.F32\.BF16 R\d+, R\d+, gdesc", report.sass), "S^T/dP^T with A from registers"
    assert report.count("LDSM") >= 8  # K and V into registers
    assert report.count("USETMAXREG") == 3  # producer down, WG1 and WG2 up
    assert report.count("UTMALDG") >= 4 and report.count("UBLKCP") == 2  # tiles; lse2, delta
    assert report.count("UTMAREDG") == 4  # the dQ tile: four 64 x 32 fp32 boxes
    assert report.count("STSM") >= 4  # dS^T -> dS [q, kv]
    assert report.count("REDG") == 0 and report.count("HMMA") == 0 and report.count("UTCHMMA") == 0


def test_grouped_build_without_bulk_dkv_accumulates_dk_dv_per_element():
    """``grouped=True, bulk_dkv=False``: the same MMAs; dK/dV added into fp32 accumulators, one
    reduction per element of each warpgroup's 64 x 128 tile (64 per thread; none for the rows of
    padded keys)."""
    from functools import partial

    from fastvideo_cute.compile_check import build_report
    from fastvideo_cute.kernels.cute import CuteKernelSpec
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import sm90_ws_main_kernel

    spec = CuteKernelSpec(name=NAME + "_grouped_redg", archs=("sm_90a",),
                          make=partial(sm90_ws_main_kernel, grouped=True, bulk_dkv=False),
                          expect=("HGMMA", "UTMAREDG", "USETMAXREG"))
    report = build_report(spec, "sm_90a")
    print(report.line)
    assert report.ok and report.spill == 0, report.line
    assert report.count("HGMMA") == 28
    assert report.count("REDG.E.ADD.F32") == 2 * 64


def test_grouped_build_adds_each_tile_by_one_bulk_reduction(kernel_report):
    """``grouped=True`` (the registry's grouped build; ``bulk_dkv`` is the default, verified on the
    H200): the same 28 wgmma; dK and dV each staged in shared memory and added by one bulk
    reduce-add (UBLKRED), no per-element reductions; both MMA warpgroups meet at barrier 10 before
    staging (256 threads) and WG1 syncs its own staging on barrier 11; no spill; without
    ``grouped`` the option changes nothing."""
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import sm90_ws_main_kernel

    report = kernel_report(NAME + "_grouped", "sm_90a")
    print(report.line)
    assert report.ok and report.spill == 0, report.line
    assert report.count("HGMMA") == 28 and report.count("REDG") == 0
    assert report.count("UBLKRED.G.S.ADD.F32") == 2
    assert len(re.findall(r"BAR\.SYNC\.DEFER_BLOCKING 0xa, 0x100\b", report.sass)) == 2
    assert re.search(r"BAR\.SYNC\.DEFER_BLOCKING 0xb, 0x80\b", report.sass)
    assert sm90_ws_main_kernel(bulk_dkv=True).config()["bulk_dkv"] is False  # needs grouped


@pytest.mark.parametrize("bad, match", [(dict(p_stages=3), "p_stages"), (dict(dq_stages=0), "dq_stages"),
                                        (dict(q_stages=5), "q_stages"),
                                        (dict(q_stages=4, p_stages=2, dq_stages=2), "shared memory")])
def test_bad_configuration_is_refused(bad, match):
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import sm90_ws_main_kernel

    with pytest.raises(ValueError, match=match):
        sm90_ws_main_kernel(**bad)


def test_narrow_dq_build_issues_the_dq_gemm_per_width():
    """``narrow_dq=True``: dQ = dS K of a partial kv tile issues only its k-steps up to ceil16(size):
    the dQ GEMM at four widths (4 + 3 + 2 + 1 = 10 64x128x16 k-steps in the SASS, beside dV's and
    dK's 4 + 4), the other GEMMs unchanged; no spill, and the wgmmas not serialised (a handful of
    ``WARPGROUP.DEPBAR`` waits, not one per HGMMA)."""
    from functools import partial

    from fastvideo_cute.compile_check import build_report
    from fastvideo_cute.kernels.cute import CuteKernelSpec
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import sm90_ws_main_kernel

    spec = CuteKernelSpec(name=NAME + "_narrow_dq", archs=("sm_90a",), make=partial(sm90_ws_main_kernel, narrow_dq=True),
                          expect=("HGMMA", "UTMAREDG", "USETMAXREG"))
    report = build_report(spec, "sm_90a")
    print(report.line)
    assert report.ok and report.spill == 0, report.line
    shapes = _shapes(report)
    assert shapes.count("64x64x16") == 8 + 8, shapes
    assert shapes.count("64x128x16") == 4 + 4 + (4 + 3 + 2 + 1), shapes
    assert report.count("WARPGROUP.DEPBAR") <= 12, report.line
    assert sm90_ws_main_kernel(narrow_dq=True).config()["narrow_dq"] is True


def test_flat_dq_build_stages_dq_conflict_free_and_adds_it_by_one_bulk_reduction():
    """``flat_dq=True`` (with the route's ``narrow_dq`` and ``p_stages=2``): WG2 stages the dQ tile in
    its register order by 16 128-bit stores from one base register (the swizzled tile took 32
    64-bit stores with two-way bank conflicts), and the store warp adds it by one bulk reduce-add
    (UBLKRED) instead of the TMA tensor reduce (no UTMAREDG); the MMAs are the same (34 HGMMA with
    the narrow dQ widths), no spill, wgmmas not serialised."""
    from functools import partial

    from fastvideo_cute.compile_check import build_report
    from fastvideo_cute.kernels.cute import CuteKernelSpec
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import sm90_ws_main_kernel

    make = partial(sm90_ws_main_kernel, narrow_dq=True, p_stages=2, flat_dq=True)
    spec = CuteKernelSpec(name=NAME + "_flat_dq", archs=("sm_90a",), make=make,
                          expect=("HGMMA", "UBLKRED", "USETMAXREG"))
    report = build_report(spec, "sm_90a")
    print(report.line)
    assert report.ok and report.spill == 0, report.line
    assert report.count("HGMMA") == 34 and report.count("UTMAREDG") == 0
    assert report.count("UBLKRED.G.S.ADD.F32") == 1
    stores = re.findall(r"STS\.128 \[(R\d+)\+0x[0-9a-f]+\]", report.sass)
    assert len(stores) == 16 and len(set(stores)) == 1, stores
    assert report.count("WARPGROUP.DEPBAR") <= 12, report.line
    assert make().config()["flat_dq"] is True
    # WG2 stages dQ while dK += dS^T Q (dS^T from registers) may still run: nothing written on dS^T's
    # registers before that wgmma's wait (the route's build; compile_check.inflight_operand_writes)
    assert report.sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") >= 1
    from fastvideo_cute.compile_check import inflight_operand_writes

    assert inflight_operand_writes(report.sass) == [], report.line


# the route's build before zero_pad_v and ticket_dkv (both off here, so each option is seen alone)
FLAT_BUILD = dict(narrow_dq=True, p_stages=2, flat_dq=True)


def _route_build(**extra):
    from functools import partial

    from fastvideo_cute.compile_check import build_report
    from fastvideo_cute.kernels.cute import CuteKernelSpec
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import sm90_ws_main_kernel

    suffix = "_".join(f"{k}" for k in sorted(extra)) or "flat"
    spec = CuteKernelSpec(name=f"{NAME}_{suffix}", archs=("sm_90a",),
                          make=partial(sm90_ws_main_kernel, **{**FLAT_BUILD, **extra}),
                          expect=("HGMMA", "UBLKRED", "USETMAXREG"))
    report = build_report(spec, "sm_90a")
    print(report.line)
    assert report.ok and report.spill == 0 and report.regs <= 168, report.line
    _assert_register_pool_fits(report)
    return report


def test_zero_pad_v_drops_the_padded_key_select_of_ds():
    """``zero_pad_v=True`` on the flat build: WG2 zeroes V's padded rows in shared memory (with K's)
    and computes dS^T without the select, so the kernel holds 32 FSEL (WG1's P^T select) instead of 64,
    the MMAs unchanged, no spill, no register written under an in-flight RS wgmma."""
    from fastvideo_cute.compile_check import inflight_operand_writes

    base, zv = _route_build(), _route_build(zero_pad_v=True)
    assert base.count("FSEL") == 64 and zv.count("FSEL") == 32, (base.count("FSEL"), zv.count("FSEL"))
    assert zv.count("HGMMA") == 34
    assert inflight_operand_writes(zv.sass) == [], zv.line


def test_ticket_dkv_hands_parts_over_and_writes_bf16_rows_once():
    """``ticket_dkv=True``: per warp a ticket (atomic add on a gpu-scope counter), the first part stored
    by 16 128-bit stores a thread and released, the last part read by 16 128-bit loads after an acquire
    spin, the rows written in bf16 (64 stores a thread, twice per warpgroup: one group or the last);
    no bulk reduce-add of dK/dV (the dQ tile's alone), no spill; refused with ``grouped``."""
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import sm90_ws_main_kernel

    report = _route_build(zero_pad_v=True, ticket_dkv=True)
    assert report.count("HGMMA") == 34 and report.count("UBLKRED.G.S.ADD.F32") == 1
    assert report.count("STG.E.128") == 2 * 16 and report.count("LDG.E.128") == 2 * 16
    # per warpgroup: the ticket, the spin's first and looping reads, the release
    assert report.count("ATOMG.E.ADD.STRONG.GPU") == 2 * 4
    assert report.count("STG.E.U16") == 2 * 2 * 64
    assert report.count("MEMBAR.ALL.GPU") >= 2
    with pytest.raises(ValueError, match="ticket_dkv"):
        sm90_ws_main_kernel(ticket_dkv=True, grouped=True)


def test_pair_stores_write_the_bf16_rows_four_bytes_at_a_time():
    """``pair_stores=True`` (on the ticket build): the bf16 dk/dv rows as the fragment's pairs of adjacent
    columns, 32 four-byte stores a thread per call site (one group, and the last ticket) instead of 64
    two-byte stores; the rest unchanged (34 HGMMA, the ticket's 128-bit hand-over), no spill."""
    report = _route_build(zero_pad_v=True, ticket_dkv=True, pair_stores=True)
    assert report.count("HGMMA") == 34 and report.count("STG.E.U16") == 0
    assert len(re.findall(r"STG\.E desc", report.sass)) == 2 * 2 * 32, report.count("STG.E")
    assert report.count("STG.E.128") == 2 * 16 and report.count("LDG.E.128") == 2 * 16


def test_tma_dkv_writes_each_warps_rows_by_stmatrix_and_two_tma_stores():
    """``tma_dkv=True`` (on the ticket build): per call site (one group, and the last ticket) and warpgroup
    8 stmatrix x4 into the swizzled staging tile and two TMA tensor stores of 16 x 64 pieces per warp;
    no global bf16 stores left; no spill; refused with ``grouped``."""
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import sm90_ws_main_kernel

    report = _route_build(zero_pad_v=True, ticket_dkv=True, tma_dkv=True)
    assert report.count("HGMMA") == 34
    assert report.count("STSM.16.M88.4") == 2 * 2 * 8 and report.count("UTMASTG") == 2 * 2 * 2
    assert report.count("STG.E.U16") == 0 and len(re.findall(r"STG\.E desc", report.sass)) == 0
    # the stores are issued by each warp's lane 0 alone: a TMA store (unlike the DSL's loads) must not
    # elect within the warp (docs/pitfalls.md), so the build holds no ELECT the ticket build lacks
    ticket = _route_build(zero_pad_v=True, ticket_dkv=True)
    assert report.count("ELECT") == ticket.count("ELECT"), (report.count("ELECT"), ticket.count("ELECT"))
    with pytest.raises(ValueError, match="tma_dkv"):
        sm90_ws_main_kernel(tma_dkv=True, grouped=True)



def test_ds_out_stores_ds_tiles_instead_of_reducing_dq():
    """``ds_out=True`` (the experimental split backward's main kernel, on the route's build): no dQ GEMM
    (24 HGMMA: the route's 34 less dQ's ten narrow-width k-steps), no reduction into dq_accum, and the
    store warp's one 8 KB bulk store of the dS tile (UBLKCP from shared to global) beside the lse2/delta
    loads; no spill, the register pool as the route's."""
    from functools import partial

    from fastvideo_cute.compile_check import build_report
    from fastvideo_cute.kernels.cute import CuteKernelSpec
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import sm90_ws_main_kernel

    config = dict(FLAT_BUILD, zero_pad_v=True, ticket_dkv=True, tma_dkv=True, ds_out=True)
    spec = CuteKernelSpec(name=f"{NAME}_ds_out", archs=("sm_90a",), make=partial(sm90_ws_main_kernel, **config),
                          expect=("HGMMA", "UBLKCP", "USETMAXREG"))
    report = build_report(spec, "sm_90a")
    print(report.line)
    assert report.ok and report.spill == 0 and report.regs <= 168, report.line
    _assert_register_pool_fits(report)
    assert report.count("HGMMA") == 24, report.line
    assert report.count("UBLKRED") == 0 and report.count("UTMAREDG") == 0
    assert len(re.findall(r"UBLKCP\.G\.S ", report.sass)) == 1  # the dS tile, shared -> global
    assert len(re.findall(r"UBLKCP\.S\.G ", report.sass)) == 2  # lse2, delta
    from fastvideo_cute.compile_check import inflight_operand_writes

    assert inflight_operand_writes(report.sass) == [], report.line


def test_ds_evict_first_puts_the_policy_on_the_ds_store_only():
    """``ds_evict_first`` (with ``ds_out``): the dS tile's bulk store carries the L2 policy evict_first (its
    upper word 0x12f00000 in the store's descriptor register); the other bulk copies carry none, the
    registers and the wgmma waits are the ``ds_out`` build's. Without ``ds_out`` it is refused."""
    from functools import partial

    from fastvideo_cute.compile_check import build_report
    from fastvideo_cute.kernels.cute import CuteKernelSpec
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import sm90_ws_main_kernel

    config = dict(FLAT_BUILD, zero_pad_v=True, ticket_dkv=True, tma_dkv=True, ds_out=True)
    reports = {}
    for hint in (False, True):
        spec = CuteKernelSpec(name=f"{NAME}_ds_out{'_evict' if hint else ''}", archs=("sm_90a",),
                              make=partial(sm90_ws_main_kernel, **config, **({"ds_evict_first": True} if hint else {})),
                              expect=("HGMMA", "UBLKCP"))
        reports[hint] = build_report(spec, "sm_90a")
    plain, hinted = reports[False], reports[True]
    print(hinted.line)
    assert hinted.ok and hinted.spill == 0 and hinted.regs == plain.regs, (hinted.line, plain.line)
    assert hinted.count("WARPGROUP.DEPBAR") == plain.count("WARPGROUP.DEPBAR")
    assert len(re.findall(r"UBLKCP\.G\.S \[UR\d+\], \[UR\d+\], UR\d+, desc\[UR\d+\]", hinted.sass)) == 1
    assert len(re.findall(r"UBLKCP\.S\.G [^;]*desc", hinted.sass)) == 0  # lse2, delta: no hint
    assert "0x12f00000" in hinted.sass.lower() and "0x12f00000" not in plain.sass.lower()
    assert len(re.findall(r"UBLKCP[^;]*desc", plain.sass)) == 0
    with pytest.raises(ValueError, match="ds_evict_first"):
        sm90_ws_main_kernel(**FLAT_BUILD, ds_evict_first=True)


@pytest.mark.parametrize("bad", [dict(ds_out=True), dict(ds_out=True, flat_dq=True, dq_stages=2),
                                 dict(ds_out=True, flat_dq=True, grouped=True)])
def test_ds_out_needs_flat_dq_and_one_staging_buffer(bad):
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import sm90_ws_main_kernel

    with pytest.raises(ValueError, match="ds_out"):
        sm90_ws_main_kernel(**bad)
