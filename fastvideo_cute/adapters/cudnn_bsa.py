"""NVIDIA cuDNN-frontend block-sparse attention (``cudnn.block_sparse_attention``) as a backend adapter.

From the library's contract (``docs/semantics.md``: logical q2k lists, per-kv-block valid sizes,
padding may hold anything, natural-log LSE, empty rows exactly 0) to cuDNN's
``block_sparse_attention_forward`` / ``_backward`` (``nvidia-cudnn-frontend==1.32.0``, CuTe-DSL
kernels for sm_90, sm_100/sm_103, sm_110, sm_120/sm_121). Pieces:

- :func:`load_cudnn` imports cuDNN lazily and once (importing this module imports only torch);
  :func:`cudnn_version_problems` says what is off the pin.
- :func:`.cudnn_bsa_support.cudnn_support`: the pure-Python predicate, limits by arch.
- :func:`.cudnn_bsa_metadata.build_cudnn_metadata`: q2k lists -> ``q2k_block_index`` /
  ``q2k_block_nums`` / ``block_sizes`` (256 -> 128 on device); :func:`.cudnn_bsa_metadata.cudnn_lse_to_contract`.
- :func:`cudnn_block_sparse_fwd` / :func:`cudnn_block_sparse_bwd`: call layout in, call layout out
  (cuDNN's ``layout=`` takes BHSD and BSHD and any strides with a unit last stride, so no
  transpose or copy is made), out/dq/dk/dv contiguous in the call layout.

Padding (positions past ``block_sizes``). Every cuDNN kernel loads a partial kv tile whole (TMA)
and masks the scores by *select* (``s if valid else -inf``), so K/V padding never reaches a
score, a row max or a row sum; it leaks only through products with an exact 0:

- forward: ``O += P @ V`` with P = 0 on padded keys -> ``0 * NaN`` from V. K cannot leak.
- backward: ``dP = dO @ V^T`` is NaN on padded columns, ``dS = P * (dP - delta) = 0 * NaN``
  -> NaN into ``dQ = dS @ K`` and ``dK``; and ``dQ = dS @ K`` has ``0 * NaN`` from padded K.
  Both K and V leak.

So the adapter passes cuDNN copies with padded rows zeroed (one fused Triton launch,
``kernels/triton/sanitize_padding.py``), and only when some kv block is partial (``all_full``
False: the caller's cached range check): V alone for an inference forward, K and V for a
forward that a backward will follow, made once there and returned in :class:`CudnnSaved` for the
backward to reuse. With zeroed padding the products are exact zeros, so padded keys also get
``dK = dV = 0`` exactly. No copy-free way exists with cuDNN's kernels as shipped: they take one K
and one V tensor and index kv blocks into it by id, so the padded rows must hold finite values in
the tensor they read, and the caller's tensors must not be written (see docs/backends/cudnn.md).

Empty rows: a row whose list is empty or holds only size-0 blocks needs cuDNN's
``allow_empty_block_nums=True`` (see the metadata module); it is passed unless the caller promises
``rows_nonempty`` (every row has a block with a valid key, e.g. VSA's top-k over full blocks).

Determinism: cuDNN's backward builds its k2q lists with atomics and accumulates dQ (and, with
several q groups, dK/dV) with float atomics, so its gradients are not bitwise reproducible run to
run (the library's Triton route is).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import re
import types
import warnings
from typing import NamedTuple, Optional, Tuple

import torch

from .cudnn_bsa_direct import cudnn_fwd_direct, direct_fwd_problems
from .cudnn_bsa_metadata import CudnnBlockSparseMeta, build_cudnn_metadata, cudnn_lse_to_contract
from .cudnn_bsa_support import CUDNN_PHYSICAL_TILE, cudnn_bwd_bucket, cudnn_support
from ..validation import smallest_block

__all__ = [
    "CUDNN_PINS",
    "CUDNN_MIN_VERSIONS",
    "CudnnUnsupportedError",
    "CudnnSaved",
    "load_cudnn",
    "cudnn_version_problems",
    "padding_plan",
    "cudnn_block_sparse_fwd",
    "cudnn_block_sparse_bwd",
    "cudnn_fwd_prebuilt",
    "cudnn_bwd_prebuilt",
]

# ----------------------------------------------------------------------------------------------
# Versions and loading
# ----------------------------------------------------------------------------------------------

#: Exact pin: cuDNN's sparse metadata is "a caller contract" whose rules can change between releases.
CUDNN_PINS = {"nvidia-cudnn-frontend": "1.32.0"}
#: Floors it needs from the CuTe stack (its BSA kernels require nvidia-cutlass-dsl >= 4.8.0;
#: the library's FA4 pin, 4.8.1, satisfies it).
CUDNN_MIN_VERSIONS = {"nvidia-cutlass-dsl": "4.8.0"}

_INSTALL_HINT = "pip install 'fastvideo-cute[cudnn]'"
_ALLOW_MISMATCH_ENV = "FASTVIDEO_CUTE_CUDNN_ALLOW_VERSION_MISMATCH"


def _version_tuple(text: str) -> Tuple[int, ...]:
    """``"4.8.1"`` -> ``(4, 8, 1)``; stops at the first non-numeric part (``"4.9.0rc1"`` -> ``(4, 9, 0)``)."""
    parts = []
    for piece in text.split(".")[:3]:
        match = re.match(r"\d+", piece)
        if match is None:
            break
        parts.append(int(match.group()))
        if match.end() != len(piece):
            break
    return tuple(parts)


def _installed(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def cudnn_version_problems() -> list:
    """``["name: installed X, pinned Y", ...]`` for every package off its pin or below its floor."""
    problems = []
    for name, want in CUDNN_PINS.items():
        have = _installed(name)
        if have is None:
            problems.append(f"{name}: not installed, pinned {want}")
        elif have != want:
            problems.append(f"{name}: installed {have}, pinned {want}")
    for name, floor in CUDNN_MIN_VERSIONS.items():
        have = _installed(name)
        if have is None:
            problems.append(f"{name}: not installed, needs >= {floor}")
        elif _version_tuple(have) < _version_tuple(floor):
            problems.append(f"{name}: installed {have}, needs >= {floor}")
    return problems


def _import_error_message(problems: list, cause: Optional[BaseException]) -> str:
    lines = ["The cuDNN BSA backend of fastvideo-cute needs "
             + ", ".join(f"{n}=={v}" for n, v in CUDNN_PINS.items()) + " and "
             + ", ".join(f"{n}>={v}" for n, v in CUDNN_MIN_VERSIONS.items()) + "."]
    if problems:
        lines.append("Mismatched: " + "; ".join(problems) + ".")
    if cause is not None:
        lines.append(f"Import failed: {type(cause).__name__}: {cause}")
    lines.append(f"Fix: {_INSTALL_HINT}.")
    lines.append("Without it, the other routes serve every call (unset FASTVIDEO_VSA_BACKEND=cudnn).")
    lines.append(f"(Set {_ALLOW_MISMATCH_ENV}=1 to try a mismatched version anyway.)")
    return "\n".join(lines)


@functools.lru_cache(maxsize=1)
def load_cudnn() -> types.SimpleNamespace:
    """Import cuDNN's BSA API lazily, once. Raises :class:`ImportError` with the fix when it cannot.

    Returns a namespace with ``fwd`` (``block_sparse_attention_forward``), ``bwd``
    (``block_sparse_attention_backward``), ``api`` (the module) and ``versions``.
    """
    problems = cudnn_version_problems()
    if problems and os.environ.get(_ALLOW_MISMATCH_ENV, "") != "1":
        raise ImportError(_import_error_message(problems, None))
    if problems:
        warnings.warn("cuDNN BSA stack off its pins (" + "; ".join(problems) + ")", RuntimeWarning, stacklevel=2)
    try:
        api = importlib.import_module("cudnn.block_sparse_attention.api")
    except Exception as exc:  # noqa: BLE001 - its native module / the CuTe DSL can fail in many ways
        raise ImportError(_import_error_message(problems, exc)) from exc
    return types.SimpleNamespace(
        api=api,
        fwd=api.block_sparse_attention_forward,
        bwd=api.block_sparse_attention_backward,
        versions={n: _installed(n) for n in (*CUDNN_PINS, *CUDNN_MIN_VERSIONS)},
    )


# ----------------------------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------------------------


class CudnnUnsupportedError(ValueError):
    """The cuDNN backend cannot serve this call exactly (the message says why)."""


class CudnnSaved(NamedTuple):
    """What the forward hands the backward: the sanitized K/V copies it made (None where it
    made none: all kv blocks full, or K for an inference forward) and the cuDNN metadata."""

    k: Optional[torch.Tensor]
    v: Optional[torch.Tensor]
    meta: CudnnBlockSparseMeta


def _dims(x: torch.Tensor, bshd: bool) -> Tuple[int, int, int, int]:
    b, a, c, d = x.shape
    return (b, c, a, d) if bshd else (b, a, c, d)


def _check_qkv(q, k, v, bshd: bool):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D ({'[B, S, H, D]' if bshd else '[B, H, S, D]'}), got {tuple(t.shape)}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a unit last (head_dim) stride, got strides {t.stride()}")
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} must have q's dtype and device ({q.dtype}, {q.device}), "
                             f"got {t.dtype}, {t.device}")
    b, h, sq, d = _dims(q, bshd)
    bk, hk, skv, dk = _dims(k, bshd)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if (bk, hk, dk) != (b, h, d):
        raise ValueError(f"k/v batch, heads and head_dim {(bk, hk, dk)} must match q's {(b, h, d)}")
    return b, h, sq, skv, d


def _require_support(q: torch.Tensor, *, head_dim: int, block_size: int, need_grad: bool, q_len: int,
                     kv_len: int, heads: int, bshd: bool, all_full: bool):
    if not q.is_cuda:
        raise CudnnUnsupportedError("cuDNN BSA cannot serve this call: it needs CUDA tensors")
    arch = torch.cuda.get_device_capability(q.device)
    ok, reason = cudnn_support(arch, q.dtype, head_dim, block_size, need_grad, q_len=q_len, kv_len=kv_len,
                               heads_q=heads, heads_kv=heads, bshd=bshd, kv_all_full=all_full)
    if not ok:
        raise CudnnUnsupportedError(f"cuDNN BSA cannot serve this call: {reason}")


def _tma_ready(t: torch.Tensor) -> bool:
    """Base 128-byte aligned (the SM90 blk64 kernels assume it) and every outer stride a multiple of
    16 bytes (TMA); fresh allocations always are, slices of packed tensors may not be."""
    size = t.element_size()
    return t.data_ptr() % 128 == 0 and all(n <= 1 or (st * size) % 16 == 0
                                           for n, st in zip(t.shape[:-1], t.stride()[:-1]))


def _aligned(t: torch.Tensor) -> torch.Tensor:
    return t if _tma_ready(t) else t.contiguous()


def _contiguous_out(x: torch.Tensor, like: torch.Tensor, name: str) -> torch.Tensor:
    """cuDNN's outputs are already ``empty_like(like, memory_format=contiguous_format)``; check it."""
    if x.shape != like.shape or x.dtype != like.dtype:
        raise RuntimeError(f"cuDNN returned {name} {x.dtype} {tuple(x.shape)}, "
                           f"expected {like.dtype} {tuple(like.shape)}")
    return x.contiguous()


# ----------------------------------------------------------------------------------------------
# Padding
# ----------------------------------------------------------------------------------------------


def padding_plan(all_full: bool, need_backward: bool, padding_finite: bool = False) -> Tuple[str, ...]:
    """Which of K / V the forward sanitizes: none when every kv block is full (or the caller
    promises finite padding: ``0 * finite = 0`` cannot leak), ``("v",)`` for an inference forward
    (only V leaks there), ``("k", "v")`` when a backward follows (it needs both, and they are made
    once, here)."""
    if all_full or padding_finite:
        return ()
    return ("k", "v") if need_backward else ("v",)


def _sanitize(k, v, kv_block_sizes, block_size: int, bshd: bool):
    from ..kernels.triton.sanitize_padding import sanitize_kv_padding

    sizes = kv_block_sizes.to(torch.int32).contiguous()
    return sanitize_kv_padding(k, v, sizes, block_size, bshd=bshd)


# ----------------------------------------------------------------------------------------------
# Forward / backward
# ----------------------------------------------------------------------------------------------


def _layout(bshd: bool) -> str:
    return "bshd" if bshd else "bhsd"


def cudnn_fwd_prebuilt(q, k, v, meta: CudnnBlockSparseMeta, *, bshd: bool, softmax_scale: Optional[float],
                       allow_empty: bool = True):
    """cuDNN forward with metadata from :func:`build_cudnn_metadata` (the kernel only, no padding
    handling): ``(out, lse)``, out in the call layout, lse natural-log fp32 ``[B, H, S_q]``.
    On SM90 at 64-token tiles the same kernel is called directly through TVM-FFI
    (:mod:`.cudnn_bsa_direct`: no per-call wrapper work); elsewhere through cuDNN's wrapper."""
    if direct_fwd_problems(q, k, v, bshd=bshd, sparse_block=meta.sparse_block) is None:
        return cudnn_fwd_direct(q, k, v, meta.q2k_block_index, meta.q2k_block_nums, meta.block_sizes,
                                bshd=bshd, softmax_scale=softmax_scale, allow_empty=allow_empty)
    cd = load_cudnn()
    res = cd.fwd(q, k, v, meta.q2k_block_index, None, meta.block_sizes, meta.q2k_block_nums,
                 sparse_block_size=meta.sparse_block, allow_empty_block_nums=allow_empty,
                 softmax_scale=softmax_scale, layout=_layout(bshd))
    return res["o_tensor"], res["lse_tensor"]


def cudnn_bwd_prebuilt(dout, q, k, v, out, lse, meta: CudnnBlockSparseMeta, *, bshd: bool,
                       softmax_scale: Optional[float], dq=None, dk=None, dv=None,
                       bucket_size_blocks: Optional[int] = None):
    """cuDNN backward with prebuilt metadata: ``(dq, dk, dv)`` in the call layout (into ``dq`` /
    ``dk`` / ``dv`` when given). ``bucket_size_blocks``: cuDNN's q-group size of its k2q CSR
    (None: its default; ``benchmarks/sweep_cudnn_bwd.py`` measures others)."""
    cd = load_cudnn()
    extra = {} if bucket_size_blocks is None else {"bucket_size_blocks": int(bucket_size_blocks)}
    res = cd.bwd(dout, q, k, v, out, lse, meta.q2k_block_index, None, meta.block_sizes, meta.q2k_block_nums,
                 softmax_scale=softmax_scale, dq_tensor=dq, dk_tensor=dk, dv_tensor=dv,
                 sparse_block_size=meta.sparse_block, layout=_layout(bshd), **extra)
    return res["dq_tensor"], res["dk_tensor"], res["dv_tensor"]


def cudnn_block_sparse_fwd(q, k, v, q2k_idx, q2k_num, kv_block_sizes, *, block_size: int, bshd: bool,
                           softmax_scale: Optional[float], all_full: bool, need_backward: bool = False,
                           rows_nonempty: bool = False, padding_finite: bool = False):
    """Block-sparse attention forward through cuDNN: ``(out, lse, saved)``.

    ``q/k/v``: the call layout (``[B, S, H, D]`` if ``bshd`` else ``[B, H, S, D]``), any strides
    with a unit last stride. ``q2k_idx``/``q2k_num``: the logical lists of
    ``metadata.map_to_index(block_map)``; ``kv_block_sizes``: logical sizes ``[KVb]``.
    ``all_full``: every kv block is full (a checked fact; a false promise lets padding leak).
    ``need_backward``: a backward will follow, so K is sanitized here too and kept in ``saved``.
    ``rows_nonempty``: the caller's promise that every query block selects a block with a valid
    key (lets cuDNN drop its empty-row handling; a false promise gives NaN rows).
    ``padding_finite``: the caller's promise that K/V padding holds finite values of moderate size
    (e.g. the zeros ``to_tiles`` writes): nothing is copied (a false promise lets NaN/Inf leak).

    Returns ``out`` shaped and strided as ``empty_like(q, memory_format=torch.contiguous_format)``,
    ``lse`` fp32 ``[B, H, S_q]`` natural log (``-inf`` and out = 0 on rows with no valid key),
    and :class:`CudnnSaved` for :func:`cudnn_block_sparse_bwd`.
    """
    b, h, sq, skv, d = _check_qkv(q, k, v, bshd)
    _require_support(q, head_dim=d, block_size=block_size, need_grad=need_backward, q_len=sq, kv_len=skv,
                     heads=h, bshd=bshd, all_full=all_full)
    meta = build_cudnn_metadata(q2k_idx, q2k_num, kv_block_sizes, block_size=block_size, batch=b, heads=h,
                                q_len=sq, kv_len=skv, all_full=all_full,
                                smallest=smallest_block(kv_block_sizes, block_size))
    plan = padding_plan(all_full, need_backward, padding_finite)
    k_clean = v_clean = None
    if plan:
        k_clean, v_clean = _sanitize(k if "k" in plan else None, v, kv_block_sizes, block_size, bshd)
    k_run = k_clean if k_clean is not None else _aligned(k)
    v_run = v_clean if v_clean is not None else _aligned(v)
    out, lse = cudnn_fwd_prebuilt(_aligned(q), k_run, v_run, meta, bshd=bshd, softmax_scale=softmax_scale,
                                  allow_empty=not rows_nonempty)
    out = _contiguous_out(out, q, "out")
    lse = cudnn_lse_to_contract(lse, b, h, sq)
    return out, lse, CudnnSaved(k_clean, v_clean, meta)


def cudnn_block_sparse_bwd(dout, q, k, v, out, lse, q2k_idx, q2k_num, kv_block_sizes, *, block_size: int,
                           bshd: bool, softmax_scale: Optional[float], all_full: bool,
                           saved: Optional[CudnnSaved] = None, padding_finite: bool = False):
    """Backward of :func:`cudnn_block_sparse_fwd`: ``(dq, dk, dv)``, each shaped and strided as
    ``empty_like(x, memory_format=torch.contiguous_format)`` of its input.

    ``saved``: the forward's :class:`CudnnSaved` (its sanitized K/V and metadata are reused);
    without it (or for what it lacks) the metadata is rebuilt and K/V sanitized here when some kv
    block is partial. Pass the same ``all_full`` (and ``padding_finite``) as the forward. Padded
    keys get dk = dv = 0. cuDNN's q-group size is :func:`.cudnn_bsa_support.cudnn_bwd_bucket`'s (one
    group where that measured faster than cuDNN's default).
    """
    b, h, sq, skv, d = _check_qkv(q, k, v, bshd)
    for name, t in (("out", out), ("dout", dout)):
        if not isinstance(t, torch.Tensor) or t.shape != q.shape or t.dtype != q.dtype or t.device != q.device:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must have q's shape {tuple(q.shape)}, dtype {q.dtype} and device, got {got}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a unit last (head_dim) stride, got strides {t.stride()}")
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (b, h, sq) or lse.dtype != torch.float32:
        got = f"{lse.dtype} {tuple(lse.shape)}" if isinstance(lse, torch.Tensor) else type(lse).__name__
        raise ValueError(f"lse must be float32 [B={b}, H={h}, S_q={sq}], got {got}")
    _require_support(q, head_dim=d, block_size=block_size, need_grad=True, q_len=sq, kv_len=skv, heads=h,
                     bshd=bshd, all_full=all_full)
    if saved is not None and not isinstance(saved, CudnnSaved):
        raise TypeError(f"saved must be the forward's CudnnSaved, got {type(saved).__name__}")
    meta = saved.meta if saved is not None else None
    if meta is None or meta.sparse_block != CUDNN_PHYSICAL_TILE[block_size] or (meta.block_sizes is None) != all_full:
        meta = build_cudnn_metadata(q2k_idx, q2k_num, kv_block_sizes, block_size=block_size, batch=b, heads=h,
                                    q_len=sq, kv_len=skv, all_full=all_full,
                                    smallest=smallest_block(kv_block_sizes, block_size))
    k_run = saved.k if saved is not None else None
    v_run = saved.v if saved is not None else None
    if padding_plan(all_full, True, padding_finite) and (k_run is None or v_run is None):
        k_new, v_new = _sanitize(k if k_run is None else None, v if v_run is None else None, kv_block_sizes,
                                 block_size, bshd)
        k_run = k_run if k_run is not None else k_new
        v_run = v_run if v_run is not None else v_new
    for name, t in (("saved.k", k_run), ("saved.v", v_run)):
        if t is not None and (t.shape != k.shape or t.dtype != k.dtype or t.device != k.device):
            raise ValueError(f"{name} must match k's shape/dtype/device, got {t.dtype} {tuple(t.shape)}")
    k_run = k_run if k_run is not None else _aligned(k)
    v_run = v_run if v_run is not None else _aligned(v)
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    bucket = cudnn_bwd_bucket(torch.cuda.get_device_capability(q.device), meta.sparse_block, sq)
    gq, gk, gv = cudnn_bwd_prebuilt(_aligned(dout), _aligned(q), k_run, v_run, _aligned(out), lse.contiguous(),
                                    meta, bshd=bshd, softmax_scale=softmax_scale, dq=dq, dk=dk, dv=dv,
                                    bucket_size_blocks=bucket)
    return _contiguous_out(gq, q, "dq"), _contiguous_out(gk, k, "dk"), _contiguous_out(gv, v, "dv")
