"""Collective custom ops that take a ``DeviceMesh`` and resolve its process group
at run time.

A compiled graph that calls these ops takes the mesh as a graph input (it is a
reference opaque), so a graph reused with another mesh talks to that mesh's
process group: nothing about the group is baked in while tracing. Each op has a
fake implementation (shapes only) and a backward formula; :func:`record_collectives`
records the group each call actually used.

Importing this module defines no op: the ops, whose schemas name
``DeviceMesh``, are defined on first use (:func:`define_ops`), which makes
sure ``DeviceMesh`` is a registered reference opaque (``import
opaque_subclass`` registers it on every release; with the library disabled,
nothing else would on torch 2.11).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from opaque_subclass.core.errors import OpaqueSubclassError, OpaqueValueError
from opaque_subclass.core.recorder import RECORDER
from opaque_subclass.core.registry import register_opaque

__all__ = ["CollectiveRecord", "all_gather", "all_reduce_sum", "define_ops", "local_chunk", "record_collectives"]  # noqa: F822 - the ops come from __getattr__

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CollectiveRecord:
    """One collective as it ran: the op, and the process group it used."""

    op: str
    group_name: str
    group_id: int  # id() of the ProcessGroup object
    mesh_id: int  # id() of the DeviceMesh passed to the op


class _Block:
    """The key of one :func:`record_collectives` block in the recorder."""


@contextlib.contextmanager
def record_collectives() -> Iterator[list[CollectiveRecord]]:
    """Collect a :class:`CollectiveRecord` for every collective run inside the block.

    Records are made when the ops *run* (eagerly or inside a compiled graph),
    so they show which process group a compiled graph really used.
    """
    records: list[CollectiveRecord] = []
    block = _Block()
    RECORDER.collecting("collectives", block, records)
    try:
        yield records
    finally:
        RECORDER.stop_collecting("collectives", block)


def note_collective(op: str, group: dist.ProcessGroup, mesh: DeviceMesh) -> None:
    """Record one collective that runs now on ``group`` (of ``mesh``) in every
    :func:`record_collectives` block open; also used by :mod:`opaque_subclass.dtensor`'s ops."""
    log.debug("%s on process group %s", op, group.group_name)
    RECORDER.broadcast("collectives", CollectiveRecord(op, str(group.group_name), id(group), id(mesh)))


def _group_of(op: str, mesh: DeviceMesh, num_chunks: int | None) -> dist.ProcessGroup:
    if mesh.ndim != 1:
        raise OpaqueValueError(
            f"opaque_subclass::{op}: the DeviceMesh has {mesh.ndim} dimensions; ShardedTensor "
            "collectives use a 1-D mesh. Fix: pass a 1-D submesh, e.g. mesh['tp'] for a mesh "
            "with mesh_dim_names=('dp', 'tp')."
        )
    if num_chunks is not None and mesh.size() != num_chunks:
        raise OpaqueValueError(
            f"opaque_subclass::{op}: the tensor is split in {num_chunks} shards but its DeviceMesh "
            f"has {mesh.size()} ranks. Fix: build the ShardedTensor on a mesh with {num_chunks} "
            "ranks, or re-shard it with ShardedTensor.from_full(full, mesh, shard_dim)."
        )
    group = mesh.get_group()
    note_collective(op, group, mesh)
    return group


def _resized(t: torch.Tensor, dim: int, size: Any) -> list[Any]:
    shape = list(t.shape)
    shape[dim] = size
    return shape


def _check_divisible(op: str, t: torch.Tensor, dim: int, num_chunks: int) -> None:
    if not 0 <= dim < t.dim():
        raise OpaqueValueError(f"opaque_subclass::{op}: dim {dim} is out of range for a {t.dim()}-d tensor")
    if t.shape[dim] % num_chunks != 0:
        raise OpaqueValueError(
            f"opaque_subclass::{op}: size {t.shape[dim]} of dim {dim} does not split into "
            f"{num_chunks} equal shards. Fix: pad dim {dim} to a multiple of {num_chunks}."
        )


# The ops' schemas name ``DeviceMesh``, which torch accepts only once the class
# is a registered opaque (``import opaque_subclass`` registers it). So that
# importing this module defines nothing in torch's op registry, the ops are
# defined when first needed: on the first access to their names (module ``__getattr__`` below),
# or on the first collective of a ShardedTensor (``_ops()``).


def _all_reduce_sum_impl(t: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """Sum of ``t`` over the ranks of ``mesh``, returned on every rank.

    The process group is ``mesh.get_group()`` at run time. Backward: identity
    (the partial sums each contribute once to one global loss).
    """
    out = t.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, group=_group_of("all_reduce_sum", mesh, None))
    return out


def _all_reduce_sum_fake(t: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    return t.new_empty(t.shape)


def _all_gather_impl(t: torch.Tensor, mesh: DeviceMesh, dim: int, num_chunks: int) -> torch.Tensor:
    """The ranks' ``t`` concatenated along ``dim`` in rank order, on every rank.

    ``num_chunks`` is the mesh size, given so that tracing never reads the
    mesh; it is checked against ``mesh.size()`` at run time. Backward: this
    rank's slice of the gradient (``local_chunk``).
    """
    group = _group_of("all_gather", mesh, num_chunks)
    parts = [torch.empty_like(t, memory_format=torch.contiguous_format) for _ in range(num_chunks)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, dim)


def _all_gather_fake(t: torch.Tensor, mesh: DeviceMesh, dim: int, num_chunks: int) -> torch.Tensor:
    return t.new_empty(_resized(t, dim, t.shape[dim] * num_chunks))


def _local_chunk_impl(t: torch.Tensor, mesh: DeviceMesh, dim: int, num_chunks: int) -> torch.Tensor:
    """This rank's equal slice of ``t`` along ``dim`` (``t`` is the same on every rank).

    The rank is ``mesh.get_local_rank()`` at run time. Backward: ``all_gather``
    of the gradient.
    """
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


_OPS: _Ops | None = None
_OPS_LOCK = threading.Lock()


def _define_ops() -> _Ops:
    """Define the three custom ops (once), registering ``DeviceMesh`` as a
    reference opaque first where torch has not (torch 2.11)."""
    global _OPS
    with _OPS_LOCK:
        if _OPS is not None:
            return _OPS
        register_opaque(DeviceMesh)  # 2.12+: torch's own registration, run now; 2.11: ours
        reduce_op = torch.library.custom_op("opaque_subclass::all_reduce_sum", _all_reduce_sum_impl, mutates_args=())
        gather_op = torch.library.custom_op("opaque_subclass::all_gather", _all_gather_impl, mutates_args=())
        chunk_op = torch.library.custom_op("opaque_subclass::local_chunk", _local_chunk_impl, mutates_args=())
        reduce_op.register_fake(_all_reduce_sum_fake)
        gather_op.register_fake(_all_gather_fake)
        chunk_op.register_fake(_local_chunk_fake)
        reduce_op.register_autograd(lambda ctx, grad: (grad, None), setup_context=_save_mesh_args)
        gather_op.register_autograd(
            lambda ctx, grad: (chunk_op(grad, ctx.mesh, *ctx.args), None, None, None), setup_context=_save_mesh_args
        )
        chunk_op.register_autograd(
            lambda ctx, grad: (gather_op(grad, ctx.mesh, *ctx.args), None, None, None), setup_context=_save_mesh_args
        )
        _OPS = _Ops(reduce_op, gather_op, chunk_op)
        return _OPS


def _ops() -> _Ops:
    ops = _OPS
    if ops is not None:
        return ops
    if torch.compiler.is_compiling():
        raise OpaqueSubclassError(
            "opaque_subclass collectives: the ops are defined on first use, and their first use "
            "is inside torch.compile, which cannot define them. Fix: call "
            "opaque_subclass.sharded.collectives.define_ops() before compiling (it also registers "
            "DeviceMesh as a reference opaque where torch has not), or build the ShardedTensor "
            "arguments outside the compiled function."
        )
    return _define_ops()


def define_ops() -> None:
    """Define the collective custom ops now (``torch.ops.opaque_subclass.all_reduce_sum``,
    ``all_gather``, ``local_chunk``), registering ``DeviceMesh`` as a reference
    opaque where torch has not (torch 2.11; from 2.12 torch registers it
    itself). Importing this module does neither; the first access to one of
    the ops (``from opaque_subclass.sharded.collectives import all_gather``) or the
    first :class:`~opaque_subclass.sharded.ShardedTensor` collective does. Idempotent."""
    _define_ops()


_OP_NAMES = ("all_reduce_sum", "all_gather", "local_chunk")


def __getattr__(name: str) -> Any:
    # PEP 562: the ops exist from their first access on (see _define_ops).
    if name in _OP_NAMES:
        return getattr(_define_ops(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
