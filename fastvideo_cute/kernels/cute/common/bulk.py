# SPDX-License-Identifier: Apache-2.0
"""Bulk (non-tensor) async copies shared by the backward kernels (sm_90a and sm_100a alike)."""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

__all__ = ["L2_EVICT_FIRST", "L2_EVICT_LAST", "bulk_reduce_add_f32", "bulk_copy_g2s", "bulk_copy_s2g", "tma_policy"]

#: L2 cache policies for the ``.L2::cache_hint`` forms (what ``createpolicy.fractional.L2::evict_first`` /
#: ``evict_last`` with fraction 1.0 produce; CUTLASS's ``CacheHintSm90``): also what a TMA copy takes as
#: ``cute.copy(..., cache_policy=Int64(...))``
L2_EVICT_FIRST = 0x12F0000000000000
L2_EVICT_LAST = 0x14F0000000000000


def tma_policy(policy: int) -> dict:
    """``cute.copy``'s keywords for a TMA copy with the L2 policy ``policy`` (0: none, no keyword), the
    convention of the bulk copies' ``cache_hint`` (trace time)."""
    return {"cache_policy": Int64(policy)} if policy else {}


@dsl_user_op
def bulk_reduce_add_f32(smem_ptr: cute.Pointer, gmem_ptr: cute.Pointer, num_bytes, *, loc=None, ip=None):
    """``cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32``: ``num_bytes`` (a multiple of
    16, both addresses 16-byte aligned) of fp32 in shared memory added into global memory by the
    TMA unit, as one member of the issuing thread's bulk group (commit and wait with
    ``cute.arch.cp_async_bulk_commit_group`` / ``cp_async_bulk_wait_group``)."""
    llvm.inline_asm(
        None,
        [gmem_ptr.llvm_ptr, smem_ptr.toint(loc=loc, ip=ip).ir_value(), Int32(num_bytes).ir_value()],
        "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], $2;",
        "l,r,r",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dsl_user_op
def bulk_copy_g2s(gmem_ptr: cute.Pointer, smem_ptr: cute.Pointer, mbar_ptr: cute.Pointer, num_bytes, *,
                  cache_hint: int = 0, loc=None, ip=None):
    """``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes``: ``num_bytes`` (a
    multiple of 16, both addresses 16-byte aligned) from global to shared memory by the TMA unit,
    completing on the mbarrier ``mbar_ptr`` (whose expected transaction bytes must include them).
    Issue from one thread (``cute.arch.elect_one``). ``cache_hint`` (a Python int, e.g.
    :data:`L2_EVICT_FIRST`; 0: none): the ``.L2::cache_hint`` form with that policy."""
    args = [gmem_ptr.llvm_ptr, smem_ptr.toint(loc=loc, ip=ip).ir_value(), mbar_ptr.toint(loc=loc, ip=ip).ir_value(),
            Int32(num_bytes).ir_value()]
    asm, cons = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$1], [$0], $3, [$2];", "l,r,r,r"
    if cache_hint:
        args.append(Int64(cache_hint).ir_value())
        asm, cons = ("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
                     "[$1], [$0], $3, [$2], $4;"), "l,r,r,r,l"
    llvm.inline_asm(
        None,
        args,
        asm,
        cons,
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dsl_user_op
def bulk_copy_s2g(smem_ptr: cute.Pointer, gmem_ptr: cute.Pointer, num_bytes, *, cache_hint: int = 0, loc=None,
                  ip=None):
    """``cp.async.bulk.global.shared::cta.bulk_group``: ``num_bytes`` (a multiple of 16, both
    addresses 16-byte aligned) from shared to global memory by the TMA unit, as one member of the
    issuing thread's bulk group. ``cache_hint``: as :func:`bulk_copy_g2s`'s."""
    args = [gmem_ptr.llvm_ptr, smem_ptr.toint(loc=loc, ip=ip).ir_value(), Int32(num_bytes).ir_value()]
    asm, cons = "cp.async.bulk.global.shared::cta.bulk_group [$0], [$1], $2;", "l,r,r"
    if cache_hint:
        args.append(Int64(cache_hint).ir_value())
        asm, cons = "cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [$0], [$1], $2, $3;", "l,r,r,l"
    llvm.inline_asm(
        None,
        args,
        asm,
        cons,
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )
