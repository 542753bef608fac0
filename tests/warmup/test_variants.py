"""Compile keys of the plan: stable digests, Triton specialisation, the sm120 mode per arch."""

import os
import subprocess
import sys

import pytest

from fastvideo_cute import warmup
from fastvideo_cute.routes import route_names
from fastvideo_cute.warmup import Target, VariantKey, Workload

from ._helpers import ROOT


def test_variant_key_digest_is_stable():
    key = VariantKey("fa4", "fwd", "sm_90", "bf16", 128, 128, (("tile", "128x128"), ("plan", "q128/kv128")))
    # sha256 of canonical JSON: the same in every process and on every machine (not hash()).
    assert key.digest() == VariantKey("fa4", "fwd", "sm_90", "bf16", 128, 128,
                                      (("tile", "128x128"), ("plan", "q128/kv128"))).digest()
    # Pinned: a change of the key's format invalidates every warmed cache's bookkeeping, so it
    # must be deliberate (update this value with it).
    assert key.digest() == "d4a95b2acca2"
    out = subprocess.run([sys.executable, "-c",
                          "from fastvideo_cute.warmup import VariantKey as V;"
                          "print(V('fa4','fwd','sm_90','bf16',128,128,(('tile','128x128'),('plan','q128/kv128')))"
                          ".digest())"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "PYTHONHASHSEED": "123"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == key.digest()
    assert VariantKey("fa4", "bwd", "sm_90", "bf16", 128, 128, key.detail).digest() != key.digest()


def test_triton_key_follows_triton_specialization(clean_route_env):
    target = Target("cuda", (9, 0), False)

    def key(heads, seq, layout="bhsd", block=64):
        w = Workload("m", 1, heads, seq, 128, block, "bf16", layout)
        return warmup.variant_key("triton", w, "fwd", target).digest()

    # heads 12 and 40 are the same class (neither 1 nor a multiple of 16): one compiled kernel
    assert key(12, 39936) == key(40, 39936)
    assert key(12, 39936) != key(16, 39936) != key(1, 39936)
    assert key(12, 64 * 624) != key(12, 64 * 625)  # 625 blocks: not a multiple of 16
    assert key(12, 39936, block=64) != key(12, 39936, block=128)


def test_int_class_matches_triton():
    native = pytest.importorskip("triton._C.libtriton").native_specialize_impl
    from triton.backends.compiler import BaseBackend

    for n in (1, 2, 12, 16, 40, 624, 625, 39936, 2 ** 31 - 16, 2 ** 31, 2 ** 33 + 3):
        kind, hint = native(BaseBackend, n, False, True, True)[:2]
        want = "1" if kind == "constexpr" else kind + ("/16" if hint == "D" else "")
        assert warmup._int_class(n) == want, n


def test_sm120_variant_follows_the_target_arch(clean_route_env, monkeypatch):
    """The plan names the variant the sm120 adapter will compile for the target GPU (issue 11,
    item 18): w4r3 on sm_90 (reachable by name), simple_split on sm_12x, the environment overriding
    both; the variant key and the own-kernel list follow."""
    from fastvideo_cute.adapters.cute_sm120 import default_variant

    monkeypatch.delenv("FASTVIDEO_CUTE_SM120_KERNEL", raising=False)
    assert warmup.sm120_variant((9, 0)) == default_variant("sm_90a") == "w4r3"
    assert warmup.sm120_variant((12, 1)) == warmup.sm120_variant((12, 0)) == "simple_split"
    h200, spark = Target("cuda", (9, 0), False), Target("cuda", (12, 1), False)
    w = Workload("m", 1, 12, 4 * 128, 128, 128, "bf16")
    assert dict(warmup.variant_key("sm120", w, "fwd", h200).detail)["kernel"] == "block_sparse_fwd128_sm120_w4r3"
    assert dict(warmup.variant_key("sm120", w, "fwd", spark).detail)["kernel"] == \
        "block_sparse_fwd128_sm120_simple_split"
    assert warmup.own_kernels_for(spark, "auto", "cute") == [("block_sparse_fwd128_sm120_simple_split", "sm_121a")]
    monkeypatch.setenv("FASTVIDEO_CUTE_SM120_KERNEL", "w4r3")
    assert warmup.sm120_variant((12, 1)) == "w4r3"
    assert warmup.own_kernels_for(spark, "auto", "cute") == [("block_sparse_fwd128_sm120_w4r3", "sm_121a")]
    monkeypatch.setenv("FASTVIDEO_CUTE_SM120_KERNEL", "simple")  # removed: an error, not a silent default
    with pytest.raises(ValueError, match="FASTVIDEO_CUTE_SM120_KERNEL"):
        warmup.sm120_variant((12, 1))


@pytest.mark.skipif("sm120" not in route_names(), reason="the sm120 backend is not registered in this tree")
def test_plan_sm90_by_name_keys_the_w4r3_kernel(clean_route_env, monkeypatch):
    monkeypatch.delenv("FASTVIDEO_CUTE_SM120_KERNEL", raising=False)
    w = Workload("m", 1, 12, 4 * 128, 128, 128, "bf16")
    (unit,) = warmup.enumerate_plan([w], Target("cuda", (9, 0), False), ("infer",), "auto", "sm120")
    assert unit.route == "sm120"
    assert dict(unit.keys["fwd"].detail)["kernel"] == "block_sparse_fwd128_sm120_w4r3"


# ---------------------------------------------------------------------------------------------- cache dirs
