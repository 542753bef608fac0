"""torch.library custom ops: the one boundary every route sits behind.

The ops take the *logical* block map and sizes; the chosen backend builds whatever
metadata it needs (q2k/k2q lists for Triton, BlockSparseTensors for FA4) inside the op,
so ``torch.compile`` sees two opaque ops with fake implementations and traces every public
API with ``fullgraph=True``. Route selection also happens inside (it is static per call).
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from .backends import BACKENDS
from .routes import call_info, select_route

__all__ = ["block_sparse_attn_op"]


def _head_dim_and_len(q: Tensor, bshd: bool) -> Tuple[int, int, int]:
    b = q.shape[0]
    h, s = (q.shape[2], q.shape[1]) if bshd else (q.shape[1], q.shape[2])
    return b, h, s


@torch.library.custom_op("fastvideo_cute::block_sparse_attn_fwd", mutates_args=())
def _fwd(q: Tensor, k: Tensor, v: Tensor, block_map: Tensor, kv_block_sizes: Tensor, block_size: int,
         bshd: bool, need_grad: bool, sm_scale: float, need_lse: bool) -> Tuple[Tensor, Tensor]:
    route = select_route(call_info(q, k, block_size, need_grad, bshd, need_lse, kv_block_sizes))
    return BACKENDS[route.name].forward(q, k, v, block_map, kv_block_sizes, block_size=block_size, bshd=bshd,
                                        need_backward=need_grad, sm_scale=sm_scale)


@_fwd.register_fake
def _fwd_fake(q, k, v, block_map, kv_block_sizes, block_size, bshd, need_grad, sm_scale, need_lse):
    b, h, s = _head_dim_and_len(q, bshd)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return out, q.new_empty((b, h, s), dtype=torch.float32)


@torch.library.custom_op("fastvideo_cute::block_sparse_attn_bwd", mutates_args=())
def _bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, block_map: Tensor,
         kv_block_sizes: Tensor, block_size: int, bshd: bool, sm_scale: float, route: str) -> Tuple[Tensor, Tensor,
                                                                                                 Tensor]:
    """``route`` is the one the forward took (recorded when autograd saved the context), so a
    change of environment variables between forward and backward cannot split them."""
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    return BACKENDS[route].backward(q, k, v, out, dout, lse, block_map, kv_block_sizes, block_size=block_size,
                                         bshd=bshd, sm_scale=sm_scale)


@_bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, block_map, kv_block_sizes, block_size, bshd, sm_scale, route):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format))


def _setup_context(ctx, inputs, output):
    q, k, v, block_map, kv_block_sizes, block_size, bshd, need_grad, sm_scale, need_lse = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, block_map, kv_block_sizes)
    ctx.block_size, ctx.bshd, ctx.sm_scale = block_size, bshd, sm_scale
    # The same selection the forward op made (same inputs, same environment, same moment).
    ctx.route = select_route(call_info(q, k, block_size, True, bshd, need_lse, kv_block_sizes)).name


def _backward(ctx, dout, dlse):
    # lse is a non-differentiable aux output (the public API returns it detached).
    q, k, v, out, lse, block_map, kv_block_sizes = ctx.saved_tensors
    dq, dk, dv = _bwd(dout, q, k, v, out, lse, block_map, kv_block_sizes, ctx.block_size, ctx.bshd, ctx.sm_scale,
                      ctx.route)
    return dq, dk, dv, None, None, None, None, None, None, None


torch.library.register_autograd("fastvideo_cute::block_sparse_attn_fwd", _backward, setup_context=_setup_context)


def block_sparse_attn_op(q: Tensor, k: Tensor, v: Tensor, block_map: Tensor, kv_block_sizes: Tensor, *,
                         block_size: int, bshd: bool, sm_scale: float, need_lse: bool = True) -> Tuple[Tensor, Tensor]:
    """Run the forward op (autograd-enabled). Inputs must already be validated. With
    ``need_lse=False`` the caller promises to discard the LSE (a backend may then return none)."""
    need_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    out, lse = _fwd(q, k, v, block_map, kv_block_sizes, block_size, bshd, need_grad, sm_scale, need_lse)
    return out, lse.detach()
