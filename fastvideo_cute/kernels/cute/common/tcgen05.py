# SPDX-License-Identifier: Apache-2.0
"""tcgen05 thread-sync fences (sm_100a / sm_103a), for the tcgen05 kernels
(``block_sparse_fwd64_sm100``, ``block_sparse_bwd64_sm100``).

tcgen05 operations (MMA, TMEM loads and stores) are asynchronous to the issuing thread; around a
hand-off between threads (an mbarrier arrive/wait, a CTA barrier) they are ordered by
``tcgen05.fence::before_thread_sync`` (this thread's tcgen05 ops happen before the hand-off) and
``tcgen05.fence::after_thread_sync`` (tcgen05 ops after the wait see what was handed off).
"""

from __future__ import annotations

from cutlass._mlir.dialects import nvvm
from cutlass.cutlass_dsl import dsl_user_op


@dsl_user_op
def fence_before(*, loc=None, ip=None):
    """``tcgen05.fence::before_thread_sync``: order this thread's tcgen05 ops before a barrier."""
    nvvm.tcgen05_fence(nvvm.Tcgen05FenceKind.BEFORE_THREAD_SYNC, loc=loc, ip=ip)


@dsl_user_op
def fence_after(*, loc=None, ip=None):
    """``tcgen05.fence::after_thread_sync``: order tcgen05 ops after a barrier / mbarrier wait."""
    nvvm.tcgen05_fence(nvvm.Tcgen05FenceKind.AFTER_THREAD_SYNC, loc=loc, ip=ip)
