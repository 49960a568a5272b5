"""The collective custom ops of :mod:`opaque_subclass.sharded.collectives`
(``torch.ops.opaque_subclass.all_reduce_sum``, ``all_gather``, ``local_chunk``), defined
when this module is imported: on first use (``collectives.define_ops()``, the first
access to an op's name, or a ShardedTensor's first collective), never by importing
:mod:`opaque_subclass.sharded`. ``DeviceMesh`` is registered as a reference opaque first
where torch has not (torch 2.11), as the schemas name it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from opaque_subclass.core.registry import register_opaque
from opaque_subclass.sharded.collectives import _check_divisible, _group_of, _resized

__all__ = ["OPS", "all_gather", "all_reduce_sum", "local_chunk"]


def _all_reduce_sum_impl(t: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """Sum of ``t`` over the ranks of ``mesh`` (group: ``mesh.get_group()`` at run
    time), on every rank. Backward: identity (each partial sum counts once)."""
    out = t.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, group=_group_of("all_reduce_sum", mesh, None))
    return out


def _all_reduce_sum_fake(t: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return t.new_empty(t.shape)


def _all_gather_impl(t: torch.Tensor, mesh: DeviceMesh, dim: int, num_chunks: int) -> torch.Tensor:
    """The ranks' ``t`` concatenated along ``dim`` in rank order, on every rank.

    ``num_chunks``: the mesh size, so tracing never reads the mesh (checked at run
    time). Backward: this rank's slice of the gradient (``local_chunk``).
    """
    group = _group_of("all_gather", mesh, num_chunks)
    parts = [torch.empty_like(t, memory_format=torch.contiguous_format) for _ in range(num_chunks)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, dim)


def _all_gather_fake(t: torch.Tensor, mesh: DeviceMesh, dim: int, num_chunks: int) -> torch.Tensor:
    return t.new_empty(_resized(t, dim, t.shape[dim] * num_chunks))


def _local_chunk_impl(t: torch.Tensor, mesh: DeviceMesh, dim: int, num_chunks: int) -> torch.Tensor:
    """This rank's equal slice of ``t`` along ``dim`` (``t`` equal on every rank;
    rank: ``mesh.get_local_rank()`` at run time). Backward: ``all_gather``."""
    _check_divisible("local_chunk", t, dim, num_chunks)
    _group_of("local_chunk", mesh, num_chunks)
    size = t.shape[dim] // num_chunks
    return t.narrow(dim, mesh.get_local_rank() * size, size).clone(memory_format=torch.contiguous_format)


def _local_chunk_fake(t: torch.Tensor, mesh: DeviceMesh, dim: int, num_chunks: int) -> torch.Tensor:
    _check_divisible("local_chunk", t, dim, num_chunks)
    return t.new_empty(_resized(t, dim, t.shape[dim] // num_chunks))


def _save_mesh_args(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.mesh, ctx.args = inputs[1], inputs[2:]


@dataclass(frozen=True)
class _Ops:
    all_reduce_sum: Any
    all_gather: Any
    local_chunk: Any


register_opaque(DeviceMesh)  # 2.12+: torch's own registration, run now; 2.11: ours
all_reduce_sum = torch.library.custom_op("opaque_subclass::all_reduce_sum", _all_reduce_sum_impl, mutates_args=())
all_gather = torch.library.custom_op("opaque_subclass::all_gather", _all_gather_impl, mutates_args=())
local_chunk = torch.library.custom_op("opaque_subclass::local_chunk", _local_chunk_impl, mutates_args=())
all_reduce_sum.register_fake(_all_reduce_sum_fake)
all_gather.register_fake(_all_gather_fake)
local_chunk.register_fake(_local_chunk_fake)
all_reduce_sum.register_autograd(lambda ctx, grad: (grad, None), setup_context=_save_mesh_args)
all_gather.register_autograd(
    lambda ctx, grad: (local_chunk(grad, ctx.mesh, *ctx.args), None, None, None), setup_context=_save_mesh_args
)
local_chunk.register_autograd(
    lambda ctx, grad: (all_gather(grad, ctx.mesh, *ctx.args), None, None, None), setup_context=_save_mesh_args
)

#: The three ops, bound last (collectives._ops() reads it: the ops are complete once it is bound).
OPS = _Ops(all_reduce_sum, all_gather, local_chunk)
