"""The warm-up plan: which route serves each workload on a target, and which of our kernels it compiles."""

import os

import pytest

from fastvideo_cute import warmup
from fastvideo_cute.routes import route_names
from fastvideo_cute.warmup import Target, Workload

from ._helpers import needs_fa4, plan_of


@needs_fa4
def test_plan_sm90_cute(clean_route_env):
    plan = plan_of(Target("cuda", (9, 0), False), "cute")
    # FA4's sm_90 backward needs 128-wide kv tiles: a 64-block training call goes to our wgmma
    # kernels (sm90: forward and warp-specialized backward, both compiled), the 64-block inference
    # forward to FA4.
    train = plan[64, "train"]
    assert train.route == "sm90" and set(train.keys) == {"fwd", "bwd"}
    assert dict(train.keys["bwd"].detail)["kernel"] == "block_sparse_bwd64_sm90_ws"
    assert plan[64, "infer"].route == "fa4"
    for b in (128, 256):
        assert plan[b, "train"].route == plan[b, "infer"].route == "fa4"
        assert set(plan[b, "train"].keys) == {"fwd", "bwd"} and set(plan[b, "infer"].keys) == {"fwd"}
        # the inference forward is the training forward's kernel: one compile serves both
        assert plan[b, "train"].keys["fwd"] == plan[b, "infer"].keys["fwd"]
    assert dict(plan[64, "infer"].keys["fwd"].detail)["tile"] == "64x64"
    assert dict(plan[128, "train"].keys["bwd"].detail)["tile"] == "64x128"  # FA4's sm_90 bwd tile for d128


@needs_fa4
def test_plan_sm100_cute(clean_route_env):
    plan = plan_of(Target("cuda", (10, 0), False), "cute")
    assert plan[64, "train"].route == plan[64, "infer"].route == "triton"
    assert plan[128, "train"].route == plan[256, "train"].route == "fa4"
    assert dict(plan[128, "train"].keys["fwd"].detail)["plan"].endswith("/1stage")
    assert not dict(plan[256, "train"].keys["fwd"].detail)["plan"].endswith("/1stage")


@needs_fa4
def test_plan_fp32_and_head_dim_fall_back_or_fail(clean_route_env):
    plan = plan_of(Target("cuda", (9, 0), False), "cute", blocks=(128,), dtype="fp32")
    assert plan[128, "train"].route == "triton"  # FA4 takes fp16/bf16 only
    plan = plan_of(Target("cuda", (9, 0), False), "cute", blocks=(128,), head_dim=96)
    assert plan[128, "train"].route is None and "head_dim 96" in plan[128, "train"].error
    plan = plan_of(Target("cuda", (12, 0), False), "auto", blocks=(128,), backend="fa4")
    assert plan[128, "train"].route is None and "FASTVIDEO_VSA_BACKEND=fa4" in plan[128, "train"].error


def test_plan_sm120_cute_never_fa4(clean_route_env):
    plan = plan_of(Target("cuda", (12, 0), False), "cute")
    for unit in plan.values():
        assert unit.route != "fa4"
        if "sm120" not in route_names():
            assert unit.route == "triton"


def _router_knows(*fields):
    import dataclasses

    from fastvideo_cute.routes import CallInfo

    return set(fields) <= {f.name for f in dataclasses.fields(CallInfo)}


@pytest.mark.skipif("sm120" not in route_names() or not _router_knows("need_lse", "kv_all_full"),
                    reason="the sm120 backend is not registered in this tree")
def test_plan_sm121_cute_sm120_serves_vsa_inference_only(clean_route_env):
    spark = Target("cuda", (12, 1), False)
    full = [Workload("m", 1, 12, 4 * b, 128, b, "bf16", entry=e) for b in (128, 256) for e in ("vsa", "bsa")]
    units = {(u.workload.block_size, u.workload.entry, u.mode): u
             for u in warmup.enumerate_plan(full, spark, ("train", "infer"), "cute")}
    for b in (128, 256):
        assert units[b, "vsa", "infer"].route == "sm120"  # no grad, LSE discarded, every block full
        assert units[b, "vsa", "train"].route == "triton"  # no backward
        assert units[b, "bsa", "infer"].route == "triton"  # block_sparse_attn returns the LSE
    # one compiled kernel serves both block sizes (256 runs as 2x2 tiles of 128)
    assert units[128, "vsa", "infer"].keys["fwd"] == units[256, "vsa", "infer"].keys["fwd"]
    # ragged tiles (a real preset grid) go to Triton
    (ragged,) = warmup.preset_workloads("wan2.1-1.3b-480p", [128], None, "bhsd", 1, None)
    assert not ragged.all_full
    (unit,) = warmup.enumerate_plan([ragged], spark, ("infer",), "cute")
    assert unit.route == "triton" and "ragged" in unit.note


def test_plan_triton_and_default_routes(clean_route_env):
    for arch in ((9, 0), (10, 0), (12, 1)):
        for route in ("triton", "auto"):
            plan = plan_of(Target("cuda", arch, False), route)
            assert {u.route for u in plan.values()} == {"triton"}
    # CPU tensors: the Triton route under the interpreter (conftest sets TRITON_INTERPRET=1 on CPU boxes)
    if os.environ.get("TRITON_INTERPRET") == "1":
        plan = plan_of(Target("cpu", None, True), "cute")
        assert {u.route for u in plan.values()} == {"triton"}
        assert all(k.arch == "cpu" for u in plan.values() for k in u.keys.values())


def test_route_env_restores(monkeypatch):
    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    monkeypatch.delenv("FASTVIDEO_VSA_CUTEDSL", raising=False)
    with warmup.route_env("cute"):
        assert os.environ.get("FASTVIDEO_VSA_CUTEDSL") == "1" and "FASTVIDEO_VSA_TRITON" not in os.environ
    assert os.environ["FASTVIDEO_VSA_TRITON"] == "1" and "FASTVIDEO_VSA_CUTEDSL" not in os.environ
    with warmup.route_env("auto"):
        assert os.environ["FASTVIDEO_VSA_TRITON"] == "1"


def test_own_kernels_policy(clean_route_env):
    from fastvideo_cute.kernels.cute import REGISTRY

    spark = Target("cuda", (12, 1), False)
    names = [spec.name for spec in REGISTRY if "sm_121a" in spec.archs]
    assert warmup.own_kernels_for(spark, "all", "auto") == [(n, "sm_121a") for n in names]
    wanted = warmup.SM120_REGISTRY_NAMES[warmup.sm120_variant(spark.arch)]
    assert warmup.own_kernels_for(spark, "auto", "cute") == [(n, "sm_121a") for n in names if n == wanted]
    assert warmup.own_kernels_for(spark, "none", "cute", [names[0]]) == [(names[0], "sm_121a")]
    with pytest.raises(ValueError, match="no CuTe kernel named"):
        warmup.own_kernels_for(spark, "auto", "cute", ["nope"])
    assert warmup.own_kernels_for(spark, "auto", "triton") == []
    assert warmup.own_kernels_for(spark, "none", "cute") == []
    h200 = Target("cuda", (9, 0), True)
    assert warmup.own_kernels_for(h200, "auto", "cute") == []  # FA4 is the CuTe route there
    assert [a for _, a in warmup.own_kernels_for(h200, "all", "auto")] == ["sm_90a"] * len(
        [s for s in REGISTRY if "sm_90a" in s.archs])
    assert warmup.own_kernels_for(Target("cpu", None, True), "all", "cute") == []


# ---------------------------------------------------------------------------------------------- cache keys


def test_plan_follows_the_shipped_route_table_per_direction(monkeypatch):
    from fastvideo_cute import route_table

    for name in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND",
                 "FASTVIDEO_VSA_ROUTE_TABLE"):
        monkeypatch.delenv(name, raising=False)
    if not route_table.DEFAULT_PATH.is_file():
        pytest.skip("no route table shipped")
    # Pretend every backend is installed and serves what its predicate's static part allows.
    from fastvideo_cute.backends import BACKENDS

    monkeypatch.setattr(BACKENDS["cudnn"], "support", lambda call: (call.head_dim == 128, "test"))
    plan = plan_of(Target("cuda", (9, 0), False), "auto", blocks=(64,))
    unit = plan[(64, "train")]
    # 64 full tiles (table v10): our sm90 forward and backward (cuDNN's second for the backward)
    assert unit.route == "sm90", unit.route
    assert unit.keys["fwd"].route == "sm90" and unit.keys["bwd"].route == "sm90"
    # with our backward unable to serve, the table's next backend plans it: each key from its own backend
    monkeypatch.setattr(BACKENDS["sm90"], "support", lambda call: (not call.need_grad, "test"))
    unit = plan_of(Target("cuda", (9, 0), False), "auto", blocks=(64,))[(64, "train")]
    assert unit.route == "sm90|cudnn", unit.route
    assert unit.keys["fwd"].route == "sm90" and unit.keys["bwd"].route == "cudnn"


def test_plan_gated_vsa_inference_on_sm90_compiles_the_fused_gate_kernel(clean_route_env):
    """video_sparse_attn's own rule (routes.select_vsa_routes) in the plan: gated inference at
    64-token blocks on sm_90 plans the sm90 forward's fused-gate variant (another compiled kernel
    than the plain forward); gated training there the variant that also stores out_s; ungated
    (--no-gate) it plans the route table's choice; block_sparse_attn entries are unaffected."""
    import dataclasses
    import importlib.util

    if importlib.util.find_spec("cutlass") is None:
        pytest.skip("the sm90 backend's predicate needs the CuTe DSL")
    h200 = Target("cuda", (9, 0), False)
    gated = Workload("m", 1, 12, 256, 128, 64, "bf16")
    plain = dataclasses.replace(gated, gated=False)
    bsa = dataclasses.replace(gated, entry="bsa")
    units = warmup.enumerate_plan([gated, plain, bsa], h200, ("infer", "train"), "auto", None)
    by = {(u.workload.gated, u.workload.entry, u.mode): u for u in units}
    fused = by[(True, "vsa", "infer")]
    assert fused.route == "sm90" and dict(fused.keys["fwd"].detail)["gate"] == "fused", fused
    unfused = by[(False, "vsa", "infer")].keys["fwd"]
    assert unfused.digest() != fused.keys["fwd"].digest()
    assert dict(unfused.detail).get("gate") in (None, "none")
    # (no route table here: training does not run its forward on sm90, so no fused gate)
    for key in ((True, "vsa", "train"), (True, "bsa", "infer")):
        fwd_key = by[key].keys["fwd"]
        assert dict(fwd_key.detail).get("gate") in (None, "none"), (key, fwd_key)


def test_plan_gated_vsa_training_with_the_table_compiles_the_out_s_build(monkeypatch):
    """Gated training whose forward the shipped route table gives to sm90 (v10: its backward too)
    plans the fused-gate build that also stores out_s: another kernel than the inference one and
    than the plain forward."""
    import dataclasses
    import importlib.util

    from fastvideo_cute import route_table
    from fastvideo_cute.backends import BACKENDS

    if importlib.util.find_spec("cutlass") is None:
        pytest.skip("the sm90 backend's predicate needs the CuTe DSL")
    if not route_table.DEFAULT_PATH.is_file():
        pytest.skip("no route table shipped")
    for name in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND",
                 "FASTVIDEO_VSA_ROUTE_TABLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(BACKENDS["cudnn"], "support", lambda call: (call.head_dim == 128, "test"))
    gated = Workload("m", 1, 12, 256, 128, 64, "bf16")
    units = warmup.enumerate_plan([gated, dataclasses.replace(gated, gated=False)], Target("cuda", (9, 0), False),
                                  ("infer", "train"), "auto", None)
    by = {(u.workload.gated, u.mode): u for u in units}
    train = by[(True, "train")]
    assert train.route == "sm90" and dict(train.keys["fwd"].detail)["gate"] == "fused+out_s", train
    others = {by[(True, "infer")].keys["fwd"].digest(), by[(False, "train")].keys["fwd"].digest()}
    assert train.keys["fwd"].digest() not in others and len(others) == 2
    assert dict(by[(False, "train")].keys["fwd"].detail).get("gate") in (None, "none")


def test_cli_no_gate_plans_ungated_vsa_workloads():
    from fastvideo_cute.warmup.cli import build_parser, build_workloads

    args = build_parser().parse_args(["--preset", "wan2.1-1.3b-480p", "--entry", "both", "--no-gate"])
    ws = build_workloads(args, Target("cpu", None, True))
    assert ws and all(not w.gated for w in ws if w.entry == "vsa")
    args = build_parser().parse_args(["--preset", "wan2.1-1.3b-480p"])
    assert all(w.gated for w in build_workloads(args, Target("cpu", None, True)))
