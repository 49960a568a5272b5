"""Collective custom ops that take a ``DeviceMesh`` and resolve its process group
at run time.

The mesh is a graph input (a reference opaque), so a graph reused with another
mesh uses that mesh's group; nothing of the group is baked in. Each op has a
fake implementation and a backward; :func:`record_collectives` records the
group each call used. The ops are defined on first use (:func:`define_ops`), by
the import of :mod:`opaque_subclass.sharded.collective_ops`, which registers
``DeviceMesh`` as a reference opaque (with the library disabled, nothing else
would on torch 2.11).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from opaque_subclass.core.recorder import RECORDER
from opaque_subclass.sharded import messages

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


def note_collective(op: str, group: dist.ProcessGroup, mesh: DeviceMesh | None) -> None:
    """Record a collective on ``group`` (of ``mesh``) in every open
    :func:`record_collectives` block; also used by :mod:`opaque_subclass.dtensor`'s ops."""
    log.debug("%s on process group %s", op, group.group_name)
    RECORDER.broadcast("collectives", CollectiveRecord(op, str(group.group_name), id(group), id(mesh)))


def _group_of(op: str, mesh: DeviceMesh, num_chunks: int | None) -> dist.ProcessGroup:
    if mesh.ndim != 1:
        raise messages.collective_mesh_not_1d(op, mesh.ndim)
    if num_chunks is not None and mesh.size() != num_chunks:
        raise messages.collective_mesh_size(op, num_chunks, mesh.size())
    group = mesh.get_group()
    note_collective(op, group, mesh)
    return group


def _resized(t: torch.Tensor, dim: int, size: Any) -> list[Any]:
    shape = list(t.shape)
    shape[dim] = size
    return shape


def _check_divisible(op: str, t: torch.Tensor, dim: int, num_chunks: int) -> None:
    if not 0 <= dim < t.dim():
        raise messages.dim_out_of_range(op, dim, t.dim())
    if t.shape[dim] % num_chunks != 0:
        raise messages.collective_not_divisible(op, t.shape[dim], dim, num_chunks)


# The ops' schemas name ``DeviceMesh``, accepted once it is a registered opaque. So that
# importing this module defines nothing in torch's op registry, the ops are defined by the
# import of opaque_subclass.sharded.collective_ops, on first access to their names
# (``__getattr__`` below), ``define_ops()`` or a ShardedTensor's first collective (``_ops()``).

_OPS_MODULE = "opaque_subclass.sharded.collective_ops"


def _define() -> Any:
    """The ops (``collective_ops.OPS``), their module imported now if it was not (Python
    imports it once, and a thread importing it meanwhile waits for that import)."""
    from opaque_subclass.sharded import collective_ops

    return collective_ops.OPS


def _ops() -> Any:
    """The ops (``.all_reduce_sum``, ``.all_gather``, ``.local_chunk``), defined on first use
    (never inside torch.compile). ``OPS`` is bound last in its module: a module still being
    imported by another thread has none yet."""
    ops = getattr(sys.modules.get(_OPS_MODULE), "OPS", None)
    if ops is not None:
        return ops
    if torch.compiler.is_compiling():
        raise messages.ops_first_used_compiling()
    return _define()


def define_ops() -> None:
    """Define the collective custom ops now (``torch.ops.opaque_subclass.all_reduce_sum``,
    ``all_gather``, ``local_chunk``), registering ``DeviceMesh`` as a reference
    opaque on torch 2.11 (2.12+ registers it itself). Otherwise done on first
    access to an op or the first :class:`~opaque_subclass.sharded.ShardedTensor`
    collective, not on import. Idempotent."""
    _define()


_OP_NAMES = ("all_reduce_sum", "all_gather", "local_chunk")


def reexporting(module: str) -> Callable[[str], Any]:
    """The PEP 562 ``__getattr__`` of ``module``, which re-exports the ops: they are
    defined on first access to their names (importing ``module`` defines none)."""

    def __getattr__(name: str) -> Any:
        if name in _OP_NAMES:
            return getattr(_define(), name)
        raise messages.no_attribute(module, name)

    return __getattr__


__getattr__ = reexporting(__name__)
