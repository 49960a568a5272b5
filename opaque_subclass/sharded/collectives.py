"""Collective custom ops that take a ``DeviceMesh`` and resolve its process group
at run time.

The mesh is a graph input (a reference opaque), so a graph reused with another
mesh uses that mesh's group; nothing of the group is baked in. Each op has a
fake implementation and a backward; :func:`record_collectives` records the
group each call used. The ops are defined on first use (:func:`define_ops`),
which registers ``DeviceMesh`` as a reference opaque (with the library
disabled, nothing else would on torch 2.11).
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
    """Collect a :class:`CollectiveRecord` for every collective run inside the block
    (when it *runs*, eagerly or compiled: the group a graph really used)."""
    records: list[CollectiveRecord] = []
    block = _Block()
    RECORDER.collecting("collectives", block, records)
    try:
        yield records
    finally:
        RECORDER.stop_collecting("collectives", block)


def note_collective(op: str, group: dist.ProcessGroup, mesh: DeviceMesh) -> None:
    """Record a collective on ``group`` (of ``mesh``) in every open
    :func:`record_collectives` block; also used by :mod:`opaque_subclass.dtensor`'s ops."""
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


# The schemas name ``DeviceMesh``, accepted once it is a registered opaque. So that
# importing defines nothing in torch's op registry, the ops are defined on first access to
# their names (``__getattr__`` below) or a ShardedTensor's first collective (``_ops()``).


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
    opaque on torch 2.11 (2.12+ registers it itself). Otherwise done on first
    access to an op or the first :class:`~opaque_subclass.sharded.ShardedTensor`
    collective, not on import. Idempotent."""
    _define_ops()


_OP_NAMES = ("all_reduce_sum", "all_gather", "local_chunk")


def __getattr__(name: str) -> Any:
    # PEP 562: the ops exist from their first access on (see _define_ops).
    if name in _OP_NAMES:
        return getattr(_define_ops(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
