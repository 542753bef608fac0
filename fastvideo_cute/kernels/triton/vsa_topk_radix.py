"""Exact top-k of wide score rows with less work per row than ``vsa_select``'s search kernels
(``_vsa_topk_kernel``, ``_vsa_topk_rows_kernel``): the same index lists, bit for bit.

Both kernels here: grid ``(R,)``, one row per program, the row as one or two power-of-two
chunks of lanes held in registers (``[0, MAIN)`` and ``[MAIN, MAIN + TAIL)``,
:func:`radix_chunks`: 624 columns as 512 + 128 lanes, 1180 as 1024 + 256, 1800 as one chunk
of 2048). The row's fp32 scores are read once (16-byte vector loads when ``KVb % 4 == 0``) and
mapped to order-preserving int32 keys: ``bits ^ (s & 0x7FFFFFFF) - s`` with ``s = bits >> 31``
(negative floats flip their magnitude bits and move up by one, so that ``-0.0`` and ``+0.0``
get the same key 0 and nothing lies between them), every NaN the largest key, lanes past the
row ``INT32_MIN`` (no score has that key: the smallest, ``-inf``'s, is ``INT32_MIN + 2^23``).
These keys are not ``_vsa_topk_kernel``'s numbers but have the same order and the same ties,
which is all the selection sees. The selection is the search kernels': with ``T`` the K-th
largest key, every key ``> T`` plus the lowest-index keys ``== T`` until exactly K; ``IDX[row,
:K]`` holds their columns ascending, ``NUM[row] = K``. Any threshold ``t`` with ``#(key > t) <=
K <= #(key >= t)`` gives that set the same way (``T`` is one; a threshold with exactly K keys
``>= t`` another: that set holds ``{key >= T}``, at least K keys, so it is it).

The selection's slots come from ONE running count (the search kernels take two per chunk):
per lane ``above + (tie << 14)`` (``above``: key ``> t``, ``tie``: key ``== t``; both counts fit
14 bits below a lane's own, rows have <= 16384 columns), whose inclusive prefix gives the lane's
``above`` and ``tie`` lanes up to it, ``a`` and ``e``. The first ``need = K - #above`` ties are
selected, so ``a + min(e, need)`` lanes up to it are; a lane is selected iff that count grows
at it (against the exclusive prefix), and the count before it is its slot.

``_vsa_topk_bisect_kernel`` (variant ``"bisectw{W}"``): ``lo, hi`` = the row's smallest and
largest key (``T`` in ``[lo, hi]``). Bisect: a midpoint ``m`` in ``(lo, hi]`` costs one pass
over the row (count the keys ``>= m``); ``>= K`` of them: ``lo = m``, else ``hi = m - 1``;
exactly K: stop, ``t = m``; ``lo == hi``: ``t = lo = T``. The first ``VALUE_STEPS`` midpoints are
taken in value space (the mean of the bounds as floats, when both are finite and it lands in
``(lo, hi]``), so that each halves the candidates ``lo <= key <= hi`` of a smooth row; a
key-space midpoint (the search kernels') first spends ~9 steps on the sign and exponent bits.
Later midpoints are key-space ones: at most 32 more steps. On Gaussian rows (counted under the
interpreter) that is 10.5 passes per row where ``rows1w1x``'s early-exit search takes 16.2 (1800
columns, K = 225; 2160 / 270: 10.9 vs 18.0; 624 / 78: 10.1 vs 16.4); rows of a few distinct
values (heavy ties at ``T``) take about as many as the search kernels. The lists do not depend on
which midpoints were taken (float rounding, flushed denormals or the interpreter's numpy change
only the number of passes).

Cost (sm_90 SASS of Triton 3.6, not measured): a pass is ~3.8 instructions per key held by a
lane (``rows1w1x``'s: ~3.6), the rest (load, keys, min/max, the one running count, the scatter
store) is straight-line. Per 1800-column row, with the pass counts above: ``bisectw1`` ~5.6K
warp-instructions (220 registers), ``bisectw2`` ~6.4K (128), ``rows1w1x`` ~8.9K (168); 624
columns: ~1.9K (62 registers) vs ~2.8K (55). More warps per row add per-warp scalar work and
cross-warp reductions: ``bisectw4`` ~7.6K at 1800.

``_vsa_topk_radix_kernel`` (variant ``"radixw{W}[x]"``): MSB-first radix select, 4 passes of
8-bit digits (the key with its sign bit flipped, so that the digits' unsigned order is the keys'
order). A pass takes ``tl.histogram(digit, 256, mask=candidate)`` over the row (candidate: the
key's bits above the digit equal ``T``'s bits found so far; every lane of the row in pass 1); a
reverse ``cumsum`` of the counts gives the candidates with digit ``>= d``; ``T``'s digit is the
largest ``d`` with at least ``need`` of them (``need`` = K minus the keys known to be above
``T``), and ``need`` drops by the candidates of the digits above it. After 4 passes the prefix is
``T``. ``"x"``: stop after the first pass whose digit holds exactly ``need`` candidates (every key
``>= L``, ``L`` the smallest key with the prefix found, is selected: exactly K; ``t = L - 1``,
``L > INT32_MIN`` since K < KVb). Its cost is the histogram's lowering: Triton 3.6 (the H200's)
builds it from warp ballots, ~9 ballots and ~70 more instructions per 32 keys per pass per lane,
so a pass costs about as much as 20 search steps (1800 columns: ~24K warp-instructions per row
with 1 warp, ~20K with 4: 2-3x ``rows1w1x``'s); Triton 3.9 uses one shared-memory atomic per key.
Kept for a GPU run to confirm that estimate; not expected to win on Triton 3.6.

Constraints: ``R`` rows of ``KVb`` fp32 scores, contiguous (row ``r`` at ``SCORES + r * KVb``);
``1 <= K < KVb <= 16384`` (``K == KVb`` is the copy-out path of ``_vsa_topk_kernel``: the
launcher in ``vsa_select`` takes it); ``MAIN`` a power of two ``>= 16``, ``TAIL`` one or 0 (one
chunk), ``MAIN + TAIL >= KVb``; ``DIV4``: ``KVb % 4 == 0`` (rows 16-byte aligned; every model's
width is). ``tl.histogram(mask=)`` is in Triton 3.6. Deterministic: every output element is
written by one program, integer counts only. This module does not import torch; the launcher
takes caller-allocated tensors and launches on the current device.
"""

from __future__ import annotations

import re

import triton
import triton.language as tl

from .vsa_common import pow2_lanes

__all__ = ["parse_radix_variant", "radix_chunks", "launch_topk_radix", "VALUE_STEPS"]

# "bisectw{W}" (value-space bisection) and "radixw{W}[x]" (radix select, "x": early exit): one row
# per program, W warps (1, 2, 4, 8).
_VARIANT_RE = re.compile(r"(bisect|radix)w(\d+)(x?)")
VALUE_STEPS = 8  # value-space midpoints at most, then key-space ones


@triton.jit
def _row_keys(SCORES, row64, cols, KVb):
    """Order-preserving int32 keys of ``SCORES[row, cols]`` (module docstring); lanes past the
    row get ``INT32_MIN``."""
    valid = cols < KVb
    x = tl.load(SCORES + row64 * KVb + cols, mask=valid, other=0.0)
    bits = x.to(tl.int32, bitcast=True)
    s = bits >> 31
    key = (bits ^ (s & 0x7FFFFFFF)) - s
    key = tl.where(x != x, 0x7FFFFFFF, key)  # NaN
    return tl.where(valid, key, -2147483648)


@triton.jit
def _store_chunk(IDX_ROW, cols, key, t, base, need):
    """One chunk's selected columns (``base``: the packed counts of the chunks before it). The
    selected lanes up to a lane: its ``above`` ones plus ``min(ties, need)``; a lane is selected
    iff that count grows at it, and its slot is the count before it."""
    v = (key > t).to(tl.int32) + ((key == t).to(tl.int32) << 14)
    incl = tl.cumsum(v, axis=0) + base
    excl = incl - v
    sel_incl = (incl & 0x3FFF) + tl.minimum(incl >> 14, need)
    sel_excl = (excl & 0x3FFF) + tl.minimum(excl >> 14, need)
    tl.store(IDX_ROW + sel_excl, cols, mask=sel_incl > sel_excl)


@triton.jit
def _store_selection(IDX_ROW, ca, key_a, cb, key_b, t, K, TWO: tl.constexpr):
    """The selection for a threshold ``t`` (``#(key > t) <= K <= #(key >= t)``, ``t >
    INT32_MIN`` or no ties needed): keys ``> t``, then the first ``K - #(key > t)`` ties."""
    tot_a = tl.sum((key_a > t).to(tl.int32) + ((key_a == t).to(tl.int32) << 14), axis=0)
    n_above = tot_a & 0x3FFF
    if TWO:
        n_above += tl.sum((key_b > t).to(tl.int32), axis=0)
    need = K - n_above
    _store_chunk(IDX_ROW, ca, key_a, t, 0, need)
    if TWO:
        _store_chunk(IDX_ROW, cb, key_b, t, tot_a, need)


# ---------------------------------------------------------------- value-space bisection


@triton.jit
def _key_to_float(k):
    s = k >> 31
    return ((k + s) ^ (s & 0x7FFFFFFF)).to(tl.float32, bitcast=True)  # inverse of _row_keys' map


@triton.jit
def _float_to_key(x):
    bits = x.to(tl.int32, bitcast=True)
    s = bits >> 31
    return (bits ^ (s & 0x7FFFFFFF)) - s


@triton.jit
def _midpoint(lo, hi, use_value):
    """A threshold in ``(lo, hi]`` (``lo < hi``): the value-space mean of the bounds when
    ``use_value`` and both bounds are finite and it lands in ``(lo, hi]``, else the key-space one."""
    key_mid = ((lo.to(tl.int64) + hi.to(tl.int64) + 1) >> 1).to(tl.int32)
    finite = (lo > -2139095040) & (hi < 0x7F800000)  # the keys of -inf and +inf
    # no overflow; with an inf or NaN bound it is not used (and computed from 0.0: no inf - inf)
    f_mid = _key_to_float(tl.where(finite, lo, 0)) * 0.5 + _key_to_float(tl.where(finite, hi, 0)) * 0.5
    v_mid = _float_to_key(f_mid)
    ok = use_value & finite & (v_mid > lo) & (v_mid <= hi)
    return tl.where(ok, v_mid, key_mid)


@triton.jit
def _vsa_topk_bisect_kernel(
    SCORES, IDX, NUM,
    KVb, K,
    MAIN: tl.constexpr,
    TAIL: tl.constexpr,
    VSTEPS: tl.constexpr,
    DIV4: tl.constexpr,
):
    TWO: tl.constexpr = TAIL > 0
    if DIV4:
        KVb = (KVb // 4) * 4  # the same value; tells the compiler rows are 16-byte aligned
    row64 = tl.program_id(0).to(tl.int64)
    ca = tl.arange(0, MAIN)
    key_a = _row_keys(SCORES, row64, ca, KVb)
    lo = tl.min(tl.where(key_a == -2147483648, 2147483647, key_a), axis=0)  # > INT32_MIN
    hi = tl.max(key_a, axis=0)
    if TWO:
        cb = MAIN + tl.arange(0, TAIL)
        key_b = _row_keys(SCORES, row64, cb, KVb)
        lo = tl.minimum(lo, tl.min(tl.where(key_b == -2147483648, 2147483647, key_b), axis=0))
        hi = tl.maximum(hi, tl.max(key_b, axis=0))
    else:
        cb = ca  # unused
        key_b = key_a
    # T in [lo, hi]: #(key >= lo) >= K > #(key > hi)
    step = tl.zeros([], tl.int32)
    while lo < hi:
        mid = _midpoint(lo, hi, step < VSTEPS)
        cnt = tl.sum((key_a >= mid).to(tl.int32), axis=0)
        if TWO:
            cnt += tl.sum((key_b >= mid).to(tl.int32), axis=0)
        ok = cnt >= K
        lo = tl.where(ok, mid, lo)
        hi = tl.where(cnt == K, mid, tl.where(ok, hi, mid - 1))  # exactly K keys >= mid: t = mid
        step += 1
    _store_selection(IDX + row64 * K, ca, key_a, cb, key_b, lo, K, TWO)
    tl.store(NUM + row64, K)


# ---------------------------------------------------------------- radix select


@triton.jit
def _radix_pass(key_a, key_b, prefix, keep, need, shift, flip, TWO: tl.constexpr):
    """One digit of ``T``: the histogram of the digit at ``shift`` over the candidates (keys of
    the row whose bits under ``keep`` equal ``prefix``'s), the digit holding the ``need``-th
    largest candidate. Returns the prefix with that digit set, the mask widened by it, the new
    ``need`` and the number of candidates with that digit."""
    cand_a = (key_a != -2147483648) & (((key_a ^ prefix) & keep) == 0)
    hist = tl.histogram(((key_a >> shift) & 0xFF) ^ flip, 256, mask=cand_a)
    if TWO:
        cand_b = (key_b != -2147483648) & (((key_b ^ prefix) & keep) == 0)
        hist += tl.histogram(((key_b >> shift) & 0xFF) ^ flip, 256, mask=cand_b)
    bins = tl.arange(0, 256)
    at_least = tl.cumsum(hist, axis=0, reverse=True)  # candidates with digit >= bin
    # at_least[0] = all candidates >= need, and at_least is non-increasing: the digit is the last
    # bin with at_least >= need
    digit = tl.sum((at_least >= need).to(tl.int32), axis=0) - 1
    cnt = tl.sum(tl.where(bins == digit, hist, 0), axis=0)
    above = tl.sum(tl.where(bins > digit, hist, 0), axis=0)
    prefix = prefix | ((digit ^ flip) << shift)
    keep = keep | (tl.full([], 0xFF, tl.int32) << shift)
    return prefix, keep, need - above, cnt


@triton.jit
def _vsa_topk_radix_kernel(
    SCORES, IDX, NUM,
    KVb, K,
    MAIN: tl.constexpr,
    TAIL: tl.constexpr,
    EARLY_EXIT: tl.constexpr,
    DIV4: tl.constexpr,
):
    TWO: tl.constexpr = TAIL > 0
    if DIV4:
        KVb = (KVb // 4) * 4  # the same value; tells the compiler rows are 16-byte aligned
    row64 = tl.program_id(0).to(tl.int64)
    ca = tl.arange(0, MAIN)
    key_a = _row_keys(SCORES, row64, ca, KVb)
    if TWO:
        cb = MAIN + tl.arange(0, TAIL)
        key_b = _row_keys(SCORES, row64, cb, KVb)
    else:
        cb = ca  # unused
        key_b = key_a
    prefix = tl.zeros([], tl.int32)
    keep = tl.zeros([], tl.int32)
    need = tl.zeros([], tl.int32) + K
    if EARLY_EXIT:
        cnt = need + 1
        shift = tl.full([], 24, tl.int32)
        while (shift >= 0) & (cnt != need):
            flip = tl.where(shift == 24, 0x80, 0)
            prefix, keep, need, cnt = _radix_pass(key_a, key_b, prefix, keep, need, shift, flip, TWO)
            shift = shift - 8
        # exactly `need` candidates at the last digit: every key >= prefix is selected
        t = tl.where(cnt == need, prefix - 1, prefix)
    else:
        for p in tl.static_range(4):
            prefix, keep, need, cnt = _radix_pass(key_a, key_b, prefix, keep, need,
                                                  24 - 8 * p, 0x80 if p == 0 else 0, TWO)
        t = prefix  # the K-th largest key
    _store_selection(IDX + row64 * K, ca, key_a, cb, key_b, t, K, TWO)
    tl.store(NUM + row64, K)


# ---------------------------------------------------------------- launch


def parse_radix_variant(variant: str):
    """``(kind, num_warps, early_exit)`` of ``"bisectw{W}"`` (``kind = "bisect"``) or
    ``"radixw{W}[x]"`` (``"radix"``), W one of 1, 2, 4, 8 (else ``ValueError``); ``None`` for a
    name of another form."""
    m = _VARIANT_RE.fullmatch(str(variant))
    if m is None or (m.group(1) == "bisect" and m.group(3)):
        return None
    warps = int(m.group(2))
    if warps not in (1, 2, 4, 8):
        raise ValueError(f"topk variant {variant!r}: warps must be one of 1, 2, 4, 8")
    return m.group(1), warps, bool(m.group(3))


def radix_chunks(kvb: int):
    """(MAIN, TAIL) lanes for ``kvb`` columns: ``vsa_select.topk_chunks``' split (the
    power-of-two half of ``pow2(kvb)`` plus the power of two covering the rest, both >= 16),
    merged into one chunk (``TAIL = 0``) when the halves are equal: one reduction and one running
    count per pass instead of two over the same lanes (1800: 2048 + 0; 624: 512 + 128; 1180: 1024
    + 256)."""
    main = max(16, pow2_lanes(kvb, 16) // 2)
    tail = pow2_lanes(max(int(kvb) - main, 1), 16)
    return (2 * main, 0) if tail == main else (main, tail)


def launch_topk_radix(scores, q2k_idx, q2k_num, rows: int, KVb: int, k_eff: int, cfg) -> None:
    """``q2k_idx [rows, k_eff]`` (ascending) and ``q2k_num [rows]`` of fp32 ``scores [rows, KVb]``
    (all contiguous, int32 outputs), ``1 <= k_eff < KVb <= 16384``; ``cfg``:
    :func:`parse_radix_variant`'s tuple."""
    assert 1 <= k_eff < KVb <= 16384, (k_eff, KVb)
    kind, warps, early = cfg
    main, tail = radix_chunks(KVb)
    div4 = KVb % 4 == 0
    if kind == "bisect":
        _vsa_topk_bisect_kernel[(rows,)](
            scores, q2k_idx, q2k_num,
            KVb, k_eff,
            MAIN=main, TAIL=tail, VSTEPS=VALUE_STEPS, DIV4=div4,
            num_warps=warps,
        )
    else:
        _vsa_topk_radix_kernel[(rows,)](
            scores, q2k_idx, q2k_num,
            KVb, k_eff,
            MAIN=main, TAIL=tail, EARLY_EXIT=bool(early), DIV4=div4,
            num_warps=warps,
        )
