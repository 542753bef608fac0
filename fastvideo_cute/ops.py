"""torch.library custom ops: the one boundary every route sits behind.

The ops take the *logical* selection, as a bool block map or as q2k lists (``q2k_idx`` /
``q2k_num``, with ``block_map`` None: ``video_sparse_attn``'s top-k and the index-native API
pass lists), and the sizes; the chosen backend gets a :class:`~fastvideo_cute.metadata.BlockSparsity`
and builds whatever metadata it needs (cuDNN takes the lists as they are; FA4 its
BlockSparseTensors from the map) inside the op, so ``torch.compile`` sees two opaque ops with
fake implementations and traces every public API with ``fullgraph=True``. ``kv_padding_zero``
(internal: ``video_sparse_attn`` passes K/V whose padding rows its compression pass zeroed) tells
a backend that copies K/V to zero their padding (cuDNN, FA4) that it need not.

The backend is chosen in :func:`block_sparse_attn_op` (eagerly on every call; once, at trace
time, under ``torch.compile``) and passed to the forward op as its ``route`` argument, which
autograd saves for the backward: the forward and backward of one call always run on one backend,
also inside a compiled graph. The sizes range check runs inside the forward op, so it holds under
``torch.compile`` too (see :func:`fastvideo_cute.validation.check_sizes_range`).

``fastvideo_cute::block_sparse_attn_fwd_gated`` is ``video_sparse_attn``'s inference forward
on a backend that fuses the gate composition into its epilogue (``fuses_gate``, the ``sm90``
backend): it returns ``out_s + gate * out_c`` and has no autograd (only no-grad calls take it).
``fastvideo_cute::block_sparse_attn_fwd_gated_train`` is its training twin: ``(out, out_s, lse)``,
the sparse branch's output and LSE beside the composition, for ``video_sparse_attn``'s own
backward (``vsa_autograd``), which runs the route's block-sparse backward on them.

Padding (eager calls): where only the backward's backend would copy K/V to zero their padding
rows (a partial-tile call whose forward runs on ``sm90`` or Triton and whose backward on cuDNN or
FA4), the forward launches a :class:`~fastvideo_cute.padding_probe.PaddingProbe` (reads only the
padding rows, no host sync) and the backward skips the copy when the probe read zeros there (what
a tiler writes); NaN, Inf or any non-zero value keeps the copy. ``torch.compile``'d calls copy.

``dispatch_counts`` counts, per ``(backend, "fwd" | "bwd")``, the calls the ops ran on each
backend (tests observe which backend served a call through it; the gated forward counts as
``"fwd"``).
"""

from __future__ import annotations

import collections
from typing import Optional, Tuple

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from .backends import BACKENDS
from .call import call_info
from .metadata import BlockSparsity
from .padding_probe import PaddingProbe
from .routes import ROUTE_SEP, select_route_name
from .validation import check_sizes_range, has_partial_blocks

__all__ = ["block_sparse_attn_op", "dispatch_counts", "ForwardADError", "EMPTY_ROUTE"]

#: (backend name, direction) -> number of calls the ops ran there in this process.
dispatch_counts: "collections.Counter[Tuple[str, str]]" = collections.Counter()

EMPTY_ROUTE = _EMPTY_ROUTE = "none"  # B == 0 or H == 0 (or meta tensors): nothing to launch


class ForwardADError(NotImplementedError):
    """Forward-mode AD (``torch.func.jvp``, dual tensors) reached an op that has no JVP rule."""


def _bhs(q: Tensor, bshd: bool) -> Tuple[int, int, int]:
    b = q.shape[0]
    h, s = (q.shape[2], q.shape[1]) if bshd else (q.shape[1], q.shape[2])
    return b, h, s


def _sparsity(block_map: Optional[Tensor], q2k_idx: Optional[Tensor], q2k_num: Optional[Tensor],
              kv_block_sizes: Tensor) -> BlockSparsity:
    return BlockSparsity(block_map, q2k_idx, q2k_num, num_kv_blocks=kv_block_sizes.shape[0])


def _fwd_impl(q: Tensor, k: Tensor, v: Tensor, block_map: Optional[Tensor], kv_block_sizes: Tensor, block_size: int,
         bshd: bool, need_grad: bool, sm_scale: float, need_lse: bool, route: str,
         range_checked: bool, q2k_idx: Optional[Tensor] = None,
         q2k_num: Optional[Tensor] = None, kv_padding_zero: bool = False) -> Tuple[Tensor, Tensor]:
    if not range_checked:  # traced by torch.compile: the API's eager check did not run
        check_sizes_range(kv_block_sizes, block_size)
    if route == _EMPTY_ROUTE:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        return out, q.new_empty(_bhs(q, bshd), dtype=torch.float32)
    route = route.split(ROUTE_SEP)[0]
    dispatch_counts[(route, "fwd")] += 1
    return BACKENDS[route].forward(q, k, v, _sparsity(block_map, q2k_idx, q2k_num, kv_block_sizes), kv_block_sizes,
                                   block_size=block_size, bshd=bshd, need_backward=need_grad, sm_scale=sm_scale,
                                   kv_padding_zero=kv_padding_zero)


_fwd = torch.library.custom_op("fastvideo_cute::block_sparse_attn_fwd", mutates_args=())(_fwd_impl)


@_fwd.register_fake
def _fwd_fake(q, k, v, block_map, kv_block_sizes, block_size, bshd, need_grad, sm_scale, need_lse, route,
              range_checked, q2k_idx=None, q2k_num=None, kv_padding_zero=False):
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, q.new_empty(_bhs(q, bshd), dtype=torch.float32)


def _fwd_gated_impl(q: Tensor, k: Tensor, v: Tensor, kv_block_sizes: Tensor, block_size: int, bshd: bool,
                    sm_scale: float, route: str, range_checked: bool, q2k_idx: Tensor, q2k_num: Tensor, gate: Tensor,
                    out_c: Tensor) -> Tensor:
    """``video_sparse_attn``'s inference forward on a backend whose epilogue fuses the gate
    (``fuses_gate``: ``sm90``): ``out_s + gate * out_c`` (``out_c`` ``[B, H, Qb, D]``, one row per q
    block), the LSE not returned (the VSA discards it). No autograd: only no-grad calls take it."""
    return _run_gated(q, k, v, kv_block_sizes, block_size, bshd, sm_scale, route, range_checked, q2k_idx, q2k_num,
                      gate, out_c)[0]


def _run_gated(q, k, v, kv_block_sizes, block_size, bshd, sm_scale, route, range_checked, q2k_idx, q2k_num, gate,
               out_c, out_s=None):
    """The gated ops' shared body: ``(out, lse)`` of the route's forward backend's ``forward_gated``."""
    if not range_checked:  # traced by torch.compile: the API's eager check did not run
        check_sizes_range(kv_block_sizes, block_size)
    route = route.split(ROUTE_SEP)[0]
    dispatch_counts[(route, "fwd")] += 1
    return BACKENDS[route].forward_gated(q, k, v, _sparsity(None, q2k_idx, q2k_num, kv_block_sizes), kv_block_sizes,
                                         gate, out_c, block_size=block_size, bshd=bshd, sm_scale=sm_scale,
                                         out_s=out_s)


_fwd_gated = torch.library.custom_op("fastvideo_cute::block_sparse_attn_fwd_gated", mutates_args=())(_fwd_gated_impl)


@_fwd_gated.register_fake
def _fwd_gated_fake(q, k, v, kv_block_sizes, block_size, bshd, sm_scale, route, range_checked, q2k_idx, q2k_num,
                    gate, out_c):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def _fwd_gated_train_impl(q: Tensor, k: Tensor, v: Tensor, kv_block_sizes: Tensor, block_size: int, bshd: bool,
                          sm_scale: float, route: str, range_checked: bool, q2k_idx: Tensor, q2k_num: Tensor,
                          gate: Tensor, out_c: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """``video_sparse_attn``'s training forward on a backend whose epilogue fuses the gate:
    ``(out_s + gate * out_c, out_s, lse)`` (``out_s``, ``lse``: the sparse branch's, what the
    route's block-sparse backward takes). No autograd of its own (``vsa_autograd`` owns it)."""
    out_s = torch.empty_like(q, memory_format=torch.contiguous_format)
    out, lse = _run_gated(q, k, v, kv_block_sizes, block_size, bshd, sm_scale, route, range_checked, q2k_idx,
                          q2k_num, gate, out_c, out_s)
    return out, out_s, lse


_fwd_gated_train = torch.library.custom_op("fastvideo_cute::block_sparse_attn_fwd_gated_train",
                                           mutates_args=())(_fwd_gated_train_impl)


@_fwd_gated_train.register_fake
def _fwd_gated_train_fake(q, k, v, kv_block_sizes, block_size, bshd, sm_scale, route, range_checked, q2k_idx,
                          q2k_num, gate, out_c):
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, torch.empty_like(out), q.new_empty(_bhs(q, bshd), dtype=torch.float32)


def _bwd_impl(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, block_map: Optional[Tensor],
         kv_block_sizes: Tensor, block_size: int, bshd: bool, sm_scale: float, route: str,
         q2k_idx: Optional[Tensor] = None, q2k_num: Optional[Tensor] = None,
         kv_padding_zero: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """``route`` is the forward op's route argument (saved by autograd): its backward half runs."""
    route = route.split(ROUTE_SEP)[-1]
    if route == _EMPTY_ROUTE:
        return tuple(torch.zeros_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dispatch_counts[(route, "bwd")] += 1
    return BACKENDS[route].backward(q, k, v, out, dout, lse, _sparsity(block_map, q2k_idx, q2k_num, kv_block_sizes),
                                    kv_block_sizes, block_size=block_size, bshd=bshd, sm_scale=sm_scale,
                                    kv_padding_zero=kv_padding_zero)


_bwd = torch.library.custom_op("fastvideo_cute::block_sparse_attn_bwd", mutates_args=())(_bwd_impl)


@_bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, block_map, kv_block_sizes, block_size, bshd, sm_scale, route, q2k_idx=None,
              q2k_num=None, kv_padding_zero=False):
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, block_map, kv_block_sizes, block_size, bshd, need_grad, sm_scale, need_lse, route, _ = inputs[:12]
    q2k_idx, q2k_num, kv_padding_zero = (tuple(inputs[12:]) + (None, None, False))[:3]
    out, lse = output
    _save(ctx, q, k, v, out, lse, block_map, kv_block_sizes, q2k_idx, q2k_num, block_size, bshd, sm_scale, route,
          kv_padding_zero)


def _save(ctx, q, k, v, out, lse, block_map, kv_block_sizes, q2k_idx, q2k_num, block_size, bshd, sm_scale, route,
          kv_padding_zero):
    ctx.save_for_backward(q, k, v, out, lse, block_map, kv_block_sizes, q2k_idx, q2k_num)
    ctx.block_size, ctx.bshd, ctx.sm_scale, ctx.route = block_size, bshd, sm_scale, route
    ctx.kv_padding_zero = kv_padding_zero


def _run_backward(ctx, dout, bwd, kv_padding_zero: bool = False):
    """dq, dk, dv through ``bwd`` (the op, or its implementation) from what :func:`_save` kept;
    ``kv_padding_zero``: also tell the backend K/V padding is zero (a probe's answer)."""
    q, k, v, out, lse, block_map, kv_block_sizes, q2k_idx, q2k_num = ctx.saved_tensors
    return bwd(dout, q, k, v, out, lse, block_map, kv_block_sizes, ctx.block_size, ctx.bshd, ctx.sm_scale,
               ctx.route, q2k_idx, q2k_num, ctx.kv_padding_zero or kv_padding_zero)


def _backward(ctx, dout, dlse):
    # lse is a non-differentiable aux output (the public API returns it detached).
    return tuple(_run_backward(ctx, dout, _bwd)) + (None,) * 12


torch.library.register_autograd("fastvideo_cute::block_sparse_attn_fwd", _backward, setup_context=_setup_context)


def _clean_once(route: str, kv_block_sizes: Tensor, block_size: int, need_grad: bool) -> bool:
    """Whether the eager forward zeroes K's and V's padding rows once, up front, for the backward to
    reuse: a backward follows, some kv block is partial (the range check's record), and both halves
    of the route run on a backend that would otherwise copy them itself (cuDNN, FA4: they read
    partial kv tiles whole). Without it the forward copies V and the backward K and V again (on
    the H200, Wan-1.3B grid, 64-token tiles: 57 + 112 us where one 112 us pass serves both)."""
    if not need_grad:
        return False
    parts = route.split(ROUTE_SEP)
    if not all(getattr(BACKENDS.get(p), "zeroes_kv_padding", False) for p in (parts[0], parts[-1])):
        return False
    return has_partial_blocks(kv_block_sizes, block_size)


def _probe_padding(route: str, kv_block_sizes: Tensor, block_size: int, need_grad: bool, clean: bool) -> bool:
    """Whether the eager forward probes K/V padding for its backward (:mod:`.padding_probe`): a
    backward follows on a backend that would copy K/V to zero their padding, the forward did not
    already make such copies (:func:`_clean_once`), and some kv block is partial."""
    if not need_grad or clean:
        return False
    if not getattr(BACKENDS.get(route.split(ROUTE_SEP)[-1]), "zeroes_kv_padding", False):
        return False
    return has_partial_blocks(kv_block_sizes, block_size)


def _zeroed_padding(k: Tensor, v: Tensor, kv_block_sizes: Tensor, block_size: int, bshd: bool):
    """K and V copied with their padding rows (positions at or past each kv block's size) set to 0:
    one Triton launch (the routes that need it run on CUDA only)."""
    from .kernels.triton.sanitize_padding import sanitize_kv_padding

    return sanitize_kv_padding(k, v, kv_block_sizes.to(torch.int32).contiguous(), block_size, bshd=bshd)


class _BlockSparseEager(torch.autograd.Function):
    """The forward op's implementation and its backward, as an autograd function: what an eager
    call runs (``torch.compile`` traces the custom op instead), as ``video_sparse_attn`` does. Under
    cProfile on the H200 host the custom op's ``backend_impl`` showed ~0.5 ms of self time per
    ``block_sparse_attn_128`` call; the wall-clock host time per call was not measurably lower
    with this function (0.48 and 1.0 ms in two machine loans, whose VSA host times moved by as
    much: benchmarks/results/host_profile_h200_{5f81125,ac88ba1}.json). The computation is the
    same ``_fwd_impl`` / ``_bwd_impl`` either way."""

    @staticmethod
    def forward(ctx, q, k, v, block_map, kv_block_sizes, block_size, bshd, need_grad, sm_scale, need_lse, route,
                range_checked, q2k_idx, q2k_num):
        # With padding-zeroed copies (see _clean_once) both halves read them and k / v are not kept.
        # The backend's backward ran its kernels on such copies before too: the same gradients.
        clean = _clean_once(route, kv_block_sizes, block_size, need_grad)
        if clean:
            k, v = _zeroed_padding(k, v, kv_block_sizes, block_size, bshd)
        out, lse = _fwd_impl(q, k, v, block_map, kv_block_sizes, block_size, bshd, need_grad, sm_scale, need_lse,
                             route, range_checked, q2k_idx, q2k_num, clean)
        if need_grad:
            _save(ctx, q, k, v, out, lse, block_map, kv_block_sizes, q2k_idx, q2k_num, block_size, bshd, sm_scale,
                  route, clean)
            ctx.padding_probe = (PaddingProbe.launch(k, v, kv_block_sizes, block_size, bshd)
                                 if _probe_padding(route, kv_block_sizes, block_size, need_grad, clean) else None)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        probe = ctx.padding_probe
        zero = probe is not None and probe.padding_zero()
        return tuple(_run_backward(ctx, dout, _bwd_impl, zero)) + (None,) * 11


def _refuse_forward_ad(*tensors: Tensor) -> None:
    """The ops have no JVP rule; without this check forward-mode AD would see a zero tangent."""
    if any(fwAD.unpack_dual(t).tangent is not None for t in tensors):
        raise ForwardADError(
            "fastvideo_cute::block_sparse_attn_fwd has no forward-mode AD (JVP) rule: torch.func.jvp / dual "
            "tensors through block_sparse_attn* and video_sparse_attn* are not supported (reverse mode is)")


def block_sparse_attn_op(q: Tensor, k: Tensor, v: Tensor, block_map: Optional[Tensor], kv_block_sizes: Tensor, *,
                         block_size: int, bshd: bool, sm_scale: float, need_lse: bool = True,
                         q2k: Optional[Tuple[Tensor, Tensor]] = None) -> Tuple[Tensor, Tensor]:
    """Run the forward op (autograd-enabled). Inputs must already be validated
    (:mod:`fastvideo_cute.validation`; in eager mode that includes the sizes' range, under
    ``torch.compile`` the op checks it). With ``need_lse=False`` the caller promises to discard the
    LSE (a backend may then return none). ``q2k``: the selection as checked ``(idx, num)`` lists
    ``[B, H, Qb, W]`` / ``[B, H, Qb]`` (ascending, distinct, in range) instead of ``block_map``
    (then None)."""
    need_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    compiling = torch.compiler.is_compiling()
    if not compiling:
        _refuse_forward_ad(q, k, v)
    b, h, _ = _bhs(q, bshd)
    if q.device.type == "meta" or b == 0 or h == 0:
        route = _EMPTY_ROUTE
    else:
        route = select_route_name(call_info(q, k, block_size, need_grad, bshd, need_lse, kv_block_sizes))
    idx, num = q2k if q2k is not None else (None, None)
    if compiling:
        out, lse = _fwd(q, k, v, block_map, kv_block_sizes, block_size, bshd, need_grad, sm_scale, need_lse, route,
                        False, idx, num)
    else:  # eager: the same implementation without the custom op's dispatch (see _BlockSparseEager)
        out, lse = _BlockSparseEager.apply(q, k, v, block_map, kv_block_sizes, block_size, bshd, need_grad, sm_scale,
                                           need_lse, route, True, idx, num)
    return out, lse.detach()
