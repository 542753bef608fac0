"""CPU checks of our Hopper 64-token forward (``block_sparse_fwd64_sm90``: wgmma + TMA, sm_90a).

Cross-compiles the kernel for sm_90a through the shared session fixture (``conftest.kernel_report``)
and checks the SASS: wgmma (HGMMA 64x64x16 for S = Q K^T, 64x128x16 for O += P V), TMA loads, no
mma.sync or tcgen05; registers within the three-CTAs-per-SM budget (65536 / 384 threads; ptxas
caps at 168), no spill. Whether it is *correct* is checked on the H200:
tests/kernels/cute/test_block_sparse_fwd64_sm90_gpu.py.
"""

import re

import pytest
import torch

from fastvideo_cute.compile_check import build_report, inflight_operand_writes, sass_is_for_arch
from fastvideo_cute.kernels.cute import find

pytest.importorskip("cutlass")

NAME = "block_sparse_fwd64_sm90"



def _variant_report(name: str = "block_sparse_fwd64_sm90_variant", expect=("HGMMA", "UTMALDG"),
                    forbid=("HMMA", "UTCHMMA"), **config):
    """Build the sm_90a kernel in configuration ``config`` (``sm90_kernel``'s keywords) and return
    its compile report (registers, spill, SASS)."""
    from functools import partial

    from fastvideo_cute.kernels.cute import CuteKernelSpec
    from fastvideo_cute.kernels.cute.block_sparse_fwd64 import sm90_kernel

    spec = CuteKernelSpec(name=name, archs=("sm_90a",), make=partial(sm90_kernel, **config), expect=expect,
                          forbid=forbid)
    return build_report(spec, "sm_90a")

def test_compile_check_passes(kernel_report):
    report = kernel_report(NAME, "sm_90a")
    print(report.line)
    assert report.ok and report.line.endswith(" OK"), report.line
    # Measured 140 registers with nvidia-cutlass-dsl 4.8.1 (cap 168 for three 128-thread CTAs).
    assert report.regs <= 168, report.line
    assert report.spill == 0, report.line


def test_sass_uses_wgmma_and_tma(kernel_report):
    report = kernel_report(NAME, "sm_90a")
    assert sass_is_for_arch(report.sass, "sm_90a")
    shapes = re.findall(r"HGMMA\.(\d+x\d+x\d+)\.F32", report.sass)
    # S = Q K^T: D/16 = 8 k-steps, at two sites (the first step and the loop).
    assert shapes.count("64x64x16") == 16
    # O += P V: 4 k-steps at two sites (loop, drain), each as a full-tile group and a partial path.
    assert shapes.count("64x128x16") >= 8
    assert report.count("UTMALDG") >= 4  # Q, K (two issue sites), V
    assert report.count("HMMA") == 0 and report.count("UTCHMMA") == 0


def test_other_archs_are_not_targeted():
    assert "skipped (not targeted" in build_report(find(NAME), "sm_100a").line


def test_bad_configuration_is_refused():
    from fastvideo_cute.kernels.cute.block_sparse_fwd64 import sm90_kernel_class

    cls = sm90_kernel_class()
    with pytest.raises(ValueError, match="dtype"):
        cls("float32", 128)
    with pytest.raises(ValueError, match="head_dim"):
        cls("bfloat16", 96)
    with pytest.raises(ValueError, match="k_stages"):
        cls("bfloat16", 128, k_stages=4)
    with pytest.raises(ValueError, match="v_stages"):
        cls("bfloat16", 128, v_stages=1)
    with pytest.raises(ValueError, match="ctas_per_sm"):
        cls("bfloat16", 128, ctas_per_sm=4)
    # Q + 2 K + 2 V slots (80 KB at D=128) do not fit three times in the SM's 227 KB; twice they do
    with pytest.raises(ValueError, match="shared memory"):
        cls("bfloat16", 128, k_stages=2)
    assert cls("bfloat16", 128, k_stages=2, ctas_per_sm=2).config()["k_stages"] == 2
    with pytest.raises(ValueError, match="q_regs"):
        cls("bfloat16", 128, q_regs=100)
    with pytest.raises(ValueError, match="q_regs"):
        cls("bfloat16", 64, q_regs=128)
    with pytest.raises(ValueError, match="lazy_vote"):
        cls("bfloat16", 128, lazy_rescale=False, lazy_vote=True)
    assert cls("bfloat16", 128, lazy_rescale=False).config()["lazy_vote"] is False
    assert cls("float16", 64, has_block_sizes=False).config() == {
        "dtype": "float16", "head_dim": 64, "has_block_sizes": False, "fuse_gate": False, "k_stages": 1,
        "v_stages": 2, "ctas_per_sm": 3, "stmatrix_epilogue": False, "q_regs": 0, "lazy_rescale": True,
        "lazy_vote": True, "partial_loads": False, "store_out_s": False, "merge_prev": False,
        "narrow_tiles": True, "packed_steps": False}
    with pytest.raises(ValueError, match="partial_loads"):
        cls("bfloat16", 128, k_stages=2, ctas_per_sm=2, partial_loads=True)
    with pytest.raises(ValueError, match="packed_steps"):
        cls("bfloat16", 128, packed_steps=True, partial_loads=True)
    with pytest.raises(ValueError, match="packed_steps"):
        cls("bfloat16", 128, k_stages=2, ctas_per_sm=2, packed_steps=True)
    with pytest.raises(ValueError, match="store_out_s"):
        cls("bfloat16", 128, store_out_s=True)
    assert cls("bfloat16", 128, fuse_gate=True, store_out_s=True).config()["store_out_s"] is True


def test_predicate_refuses_cpu_tensors_with_a_reason():
    from fastvideo_cute.adapters.cute_sm90_fwd64 import sm90_fwd64_problems

    q = torch.zeros(1, 2, 128, 128, dtype=torch.bfloat16)
    assert sm90_fwd64_problems(q, q, q, bshd=False) == "not a CUDA tensor"


def test_fused_gate_variant_compiles_within_the_register_budget():
    """The epilogue variant with the VSA gate composition (``fuse_gate``; verified on the H200 by the GPU test file):
    still three CTAs per SM (measured 167 registers, nvidia-cutlass-dsl 4.8.1), no spill, one more
    TMA load (the gate tile) than the plain kernel."""
    fused = _variant_report("block_sparse_fwd64_sm90_gate", fuse_gate=True)
    print(fused.line)
    assert fused.ok, fused.line
    assert fused.regs <= 168 and fused.spill == 0, fused.line
    plain = build_report(find(NAME), "sm_90a")
    assert fused.count("UTMALDG") > plain.count("UTMALDG")


def test_training_gate_variant_stores_out_s_by_a_second_tma_store():
    """``store_out_s`` (the gated training forward): out_s leaves through the gate's K slot by a
    second TMA store (two more UTMASTG sites than the inference gate build), within the
    three-CTAs register budget (measured 156 registers, nvidia-cutlass-dsl 4.8.1), no spill."""
    gated = _variant_report("block_sparse_fwd64_sm90_gate", fuse_gate=True)
    train = _variant_report("block_sparse_fwd64_sm90_gate_train", fuse_gate=True, store_out_s=True)
    print(train.line)
    assert train.ok and train.regs <= 168 and train.spill == 0, train.line
    assert train.count("UTMASTG") == gated.count("UTMASTG") + 2, (train.count("UTMASTG"), gated.count("UTMASTG"))
    assert train.count("UTMALDG") == gated.count("UTMALDG")


@pytest.mark.parametrize("pipeline", [{"k_stages": 2, "ctas_per_sm": 2}, {"k_stages": 2, "v_stages": 3, "ctas_per_sm": 2},
                                      {"stmatrix_epilogue": True}],
                         ids=["k2c2", "k2v3c2", "stmatrix"])
def test_pipeline_variants_compile(pipeline):
    """The swept pipelines (deeper K/V rings at two CTAs per SM, a stmatrix epilogue) still build
    with wgmma and TMA and no spill; their K (and V) loads add TMA issue sites (measured
    nvidia-cutlass-dsl 4.8.1: 14 / 16 UTMALDG against 12 for the default), the stmatrix epilogue
    STSM stores."""
    report = _variant_report(**pipeline)
    print(report.line)
    assert report.ok and report.spill == 0, report.line
    if pipeline.get("k_stages", 1) > 1:
        assert report.count("UTMALDG") > 12, report.line
    if pipeline.get("stmatrix_epilogue"):
        assert report.count("STSM") > 0, report.line


@pytest.mark.parametrize("bad, match", [
    (dict(shape=(1, 2, 128, 64)), "q's shape"),
    (dict(dtype=torch.float16), "q's shape, dtype"),
    (dict(offset=8), "aligned"),
])
def test_bad_out_is_refused_before_any_compile(bad, match):
    """``sm90_fwd64(out=)`` (a head slice of the caller's output): a wrong shape / dtype or a base
    TMA cannot take is a ValueError naming ``out``, before a kernel is compiled (CPU tensors here,
    so reaching the compile or the launch would fail otherwise)."""
    from fastvideo_cute.adapters.cute_sm90_fwd64 import sm90_fwd64

    q = torch.zeros(1, 2, 128, 128, dtype=torch.bfloat16)
    if "offset" in bad:
        out = torch.zeros(q.numel() + bad["offset"], dtype=q.dtype)[bad["offset"]:].view(q.shape)
    else:
        out = torch.zeros(bad.get("shape", q.shape), dtype=bad.get("dtype", q.dtype))
    idx = torch.zeros(1, 2, 2, 1, dtype=torch.int32)
    num = torch.ones(1, 2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match=match):
        sm90_fwd64(q, q, q, idx, num, None, bshd=False, out=out)


@pytest.mark.parametrize("bad, match", [
    (dict(gate=False), "out_s .* needs gate and out_c"),
    (dict(shape=(1, 2, 128, 64)), "out_s must have q's shape"),
    (dict(offset=8), "out_s's base address"),
])
def test_bad_out_s_is_refused_before_any_compile(bad, match):
    """``sm90_fwd64(out_s=)`` (the gated training forward): without the gate, or of a wrong shape or
    a base TMA cannot take, a ValueError naming ``out_s`` before any compile (CPU tensors)."""
    from fastvideo_cute.adapters.cute_sm90_fwd64 import sm90_fwd64

    q = torch.zeros(1, 2, 128, 128, dtype=torch.bfloat16)
    if "offset" in bad:
        out_s = torch.zeros(q.numel() + bad["offset"], dtype=q.dtype)[bad["offset"]:].view(q.shape)
    else:
        out_s = torch.zeros(bad.get("shape", q.shape), dtype=q.dtype)
    idx = torch.zeros(1, 2, 2, 1, dtype=torch.int32)
    num = torch.ones(1, 2, 2, dtype=torch.int32)
    gate = (q, torch.zeros(1, 2, 2, 128, dtype=q.dtype)) if bad.get("gate", True) else (None, None)
    with pytest.raises(ValueError, match=match):
        sm90_fwd64(q, q, q, idx, num, None, bshd=False, gate=gate[0], out_c=gate[1], out_s=out_s)


def _serialised_wgmma(sass: str) -> int:
    """``WARPGROUP.DEPBAR`` waits in the SASS: a build whose wgmmas ptxas serialised (C7515: it
    waits after every HGMMA) has one per HGMMA; the pipelined builds have a handful (the waits the
    kernel asks for)."""
    return sass.count("WARPGROUP.DEPBAR")


@pytest.mark.parametrize("config", [{}, {"lazy_rescale": False}, {"q_regs": 64},
                                    {"q_regs": 112}, {"q_regs": 112, "fuse_gate": True},
                                    {"q_regs": 128, "ctas_per_sm": 2}, {"head_dim": 64, "q_regs": 64},
                                    {"lazy_vote": False}, {"fuse_gate": True}, {"partial_loads": True},
                                    {"partial_loads": True, "fuse_gate": True},
                                    {"partial_loads": True, "head_dim": 64},
                                    {"fuse_gate": True, "store_out_s": True}, {"merge_prev": True},
                                    {"merge_prev": True, "fuse_gate": True},
                                    {"merge_prev": True, "fuse_gate": True, "store_out_s": True},
                                    {"narrow_tiles": False}, {"narrow_tiles": False, "head_dim": 64},
                                    {"narrow_tiles": False, "fuse_gate": True, "store_out_s": True},
                                    {"packed_steps": True}, {"packed_steps": True, "head_dim": 64},
                                    {"packed_steps": True, "merge_prev": True, "fuse_gate": True,
                                     "store_out_s": True}],
                         ids=["default", "eager", "q64", "q112", "q112-gate", "q128-c2", "d64-q64", "novote",
                              "gate", "partial", "partial-gate", "partial-d64", "gate-train", "merge", "merge-gate",
                              "merge-gate-train", "wide", "wide-d64", "wide-gate-train", "packed", "packed-d64",
                              "packed-merge-gate-train"])
def test_register_and_pipeline_variants_keep_wgmma_pipelined(config):
    """The rescale and Q-in-registers options build with no spill and with their wgmmas pipelined:
    a conditional rescale of O beside a wgmma in flight, or a spilled Q fragment, made ptxas
    serialise every wgmma of the kernel (C7515: 34 waits, one per HGMMA, measured with
    nvidia-cutlass-dsl 4.8.1; these builds have 4). Q's columns in registers show as one ldmatrix
    (LDSM) per 16 columns and HGMMAs with a register A operand."""
    report = _variant_report(**config)
    print(report.line)
    assert report.ok and report.spill == 0, report.line
    assert report.regs <= (255 if config.get("ctas_per_sm") == 2 else 168), report.line
    assert _serialised_wgmma(report.sass) <= 6, report.line
    assert report.sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") >= 1, report.line
    # P V[j-1] reads P from registers while the softmax runs: nothing may be written there before
    # the wait (compile_check.inflight_operand_writes; a racy build, 2026-12-04, had 114 such writes)
    assert inflight_operand_writes(report.sass) == [], report.line
    q_regs = config.get("q_regs", 0)
    assert report.count("LDSM") == q_regs // 16, report.line
    # S's k-steps with A from registers (P V's have a transposed B: ``gdesc[..].tnspB``)
    rs_s = re.findall(r"HGMMA\.64x64x16\.F32\.\w+ R\d+, R\d+, gdesc\[\w+\],", report.sass)
    assert len(rs_s) == (2 * q_regs // 16), report.line  # S's RS k-steps, at two issue sites
    # lazy_vote: one warp-wide vote on the kept maxima per softmax (two sites: the first step, the loop)
    if config.get("partial_loads") or config.get("packed_steps"):  # 16-key pieces: issue sites of their own
        # (measured 52 UTMALDG at head_dim 128 against the default's 12; packed_steps: 52 too)
        assert report.count("UTMALDG") > (24 if config.get("head_dim", 128) == 128 else 18), report.line
    vote = config.get("lazy_vote", config.get("lazy_rescale", True))  # the default: with the lazy rescale
    # (narrow_tiles, the default: three softmax branches, full / half / quarter of the columns, at each site)
    assert report.count("VOTE.ALL") == ((6 if config.get("narrow_tiles", True) else 2) if vote else 0), report.line


def test_full_q_in_registers_at_three_ctas_is_serialised():
    """Why ``q_regs`` stops at 112 at three CTAs per SM: all 128 columns spill a Q fragment and
    serialise the wgmmas (the measurement behind the docstring; if a compiler fits it, this fails
    and the option's limit can move)."""
    report = _variant_report(expect=("HGMMA",), forbid=(), q_regs=128)
    assert report.spill > 0 and _serialised_wgmma(report.sass) > 30, report.line


@pytest.mark.parametrize("config", [{}, {"packed_steps": True}, {"fuse_gate": True, "store_out_s": True}],
                         ids=["plain", "packed", "gate_train"])
def test_l2_hints_put_policies_on_the_tma_copies_only(config):
    """``l2_hints``: Q's load and the output stores carry the evict_first policy (upper word 0x12f00000 in the
    copy's descriptor register), the whole K / V tile loads evict_last (0x14f00000); the registers, the wgmma
    waits and the copy sites are the unhinted build's, and no in-flight wgmma operand is written. The
    default build's compile key has no ``l2_hints`` (its cache entries stay valid)."""
    from fastvideo_cute.kernels.cute.block_sparse_fwd64 import sm90_kernel

    plain = _variant_report(**config)
    hinted = _variant_report("block_sparse_fwd64_sm90_l2", l2_hints=True, **config)
    print(hinted.line)
    assert hinted.ok and hinted.spill == 0 and hinted.regs <= 168, hinted.line
    assert hinted.count("WARPGROUP.DEPBAR") == plain.count("WARPGROUP.DEPBAR")
    assert hinted.count("UTMALDG") == plain.count("UTMALDG") and hinted.count("UTMASTG") == plain.count("UTMASTG")
    low = hinted.sass.lower()
    assert "0x12f00000" in low and "0x14f00000" in low, hinted.line
    assert "0x12f00000" not in plain.sass.lower() and "0x14f00000" not in plain.sass.lower()
    assert re.findall(r"UTMASTG[^;]*desc\[URZ\]", hinted.sass) == []  # every output store with a policy
    assert inflight_operand_writes(hinted.sass) == []
    assert "l2_hints" not in sm90_kernel(**config).config() and sm90_kernel(l2_hints=True).config()["l2_hints"]


def test_load_probes_drop_only_the_loop_loads():
    """``probe_loads`` (a timing probe of the default build, never routed): ``skip_v`` drops the loop's V load
    site, ``skip_kv`` the loop's K and V sites (the prologue's and Q's loads stay), ``tile0`` keeps every
    copy site; the wgmma pipeline is the default build's, no register limit broken, no in-flight operand
    written. Refused beside the builds it does not probe, and absent from the default's compile key."""
    from fastvideo_cute.kernels.cute.block_sparse_fwd64 import sm90_kernel

    base = _variant_report()
    for probe, dropped in (("skip_v", 1), ("skip_kv", 3), ("tile0", 0), ("win16", 0), ("win256", 0)):
        report = _variant_report(f"block_sparse_fwd64_sm90_probe_{probe}", probe_loads=probe)
        print(report.line)
        assert report.ok and report.spill == 0 and report.regs <= 168, report.line
        # each load site is one UTMALDG on each of the paths ptxas duplicates it into (2 a site here)
        assert report.count("UTMALDG") == base.count("UTMALDG") - 2 * dropped, report.line
        assert report.count("HGMMA") == base.count("HGMMA")
        assert inflight_operand_writes(report.sass) == []
    assert "probe_loads" not in sm90_kernel().config() and sm90_kernel(probe_loads="tile0").config()["probe_loads"]
    with pytest.raises(ValueError, match="probe_loads"):
        sm90_kernel(probe_loads="skip_q")
    with pytest.raises(ValueError, match="probe_loads"):
        sm90_kernel(probe_loads="skip_v", packed_steps=True)



def test_rotate_walk_changes_only_where_the_walk_starts():
    """``rotate_walk`` (resident CTAs a wave): the walk starts at a position set by the CTA's linear index and
    wraps; the loads, the wgmma waits and the HGMMAs are the default build's; registers within the
    three-CTAs-per-SM budget, no spill, no in-flight wgmma operand written. Refused beside the rings and
    lists it is not written for; absent from the default's compile key."""
    from fastvideo_cute.kernels.cute.block_sparse_fwd64 import sm90_kernel

    base = _variant_report()
    for config in ({}, {"fuse_gate": True, "store_out_s": True}):
        report = _variant_report("block_sparse_fwd64_sm90_rotate", rotate_walk=396, **config)
        print(report.line)
        assert report.ok and report.spill == 0 and report.regs <= 168, report.line
        assert report.count("HGMMA") == base.count("HGMMA")
        assert report.count("WARPGROUP.DEPBAR") == base.count("WARPGROUP.DEPBAR")
        assert inflight_operand_writes(report.sass) == []
    assert report.count("UTMALDG") == _variant_report("block_sparse_fwd64_sm90_gate_train", fuse_gate=True,
                                                      store_out_s=True).count("UTMALDG")
    assert "rotate_walk" not in sm90_kernel().config() and sm90_kernel(rotate_walk=396).config()["rotate_walk"] == 396
    with pytest.raises(ValueError, match="rotate_walk"):
        sm90_kernel(rotate_walk=-1)
    with pytest.raises(ValueError, match="rotate_walk"):
        sm90_kernel(rotate_walk=396, packed_steps=True)
    with pytest.raises(ValueError, match="rotate_walk"):
        sm90_kernel(rotate_walk=396, k_stages=2, ctas_per_sm=2)


def test_tile_prefetch_adds_only_tensor_prefetches():
    """``tile_prefetch`` (list entries ahead): tensor prefetches into the L2 (``UTMAPF``, one per K or V tile;
    the default build has none) beside the default build's loads, HGMMAs and wgmma waits; registers within
    the three-CTAs-per-SM budget, no spill. Refused at distance 1 (K[j + 1] is loaded at step j), beside
    the rings and lists it is not written for; absent from the default's compile key."""
    from fastvideo_cute.kernels.cute.block_sparse_fwd64 import sm90_kernel

    base = _variant_report()
    assert base.count("UTMAPF") == 0
    for p in (2, 4):
        report = _variant_report(f"block_sparse_fwd64_sm90_prefetch{p}", tile_prefetch=p)
        print(report.line)
        assert report.ok and report.spill == 0 and report.regs <= 168, report.line
        assert report.count("UTMAPF") > 0 and report.count("UTMAPF") % 2 == 0  # K and V in pairs
        for op in ("UTMALDG", "HGMMA", "WARPGROUP.DEPBAR"):
            assert report.count(op) == base.count(op), op
        assert inflight_operand_writes(report.sass) == []
    gate = _variant_report("block_sparse_fwd64_sm90_prefetch_gate", fuse_gate=True, store_out_s=True, tile_prefetch=4)
    print(gate.line)  # the VSA route's build (the gate fused): measured 156 registers
    assert gate.ok and gate.spill == 0 and gate.regs <= 168 and gate.count("UTMAPF") > 0, gate.line
    assert "tile_prefetch" not in sm90_kernel().config() and sm90_kernel(tile_prefetch=4).config()["tile_prefetch"] == 4
    for bad in ({"tile_prefetch": 1}, {"tile_prefetch": 9}, {"tile_prefetch": 2, "packed_steps": True},
                {"tile_prefetch": 2, "probe_loads": "tile0"}, {"tile_prefetch": 2, "k_stages": 2, "ctas_per_sm": 2}):
        with pytest.raises(ValueError, match="tile_prefetch"):
            sm90_kernel(**bad)
