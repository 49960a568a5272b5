"""The ops :class:`opaque_subclass.dtensor.MeshGroupPass` puts in place of collectives
(``torch.ops.opaque_subclass.mesh_all_reduce``, taking a mesh and dimension, and
``mesh_all_reduce_on_group``, taking a ``ProcessGroup``: two per collective of
``dtensor._SCHEMAS`` this torch build has), defined when this module is imported: on
first use (:func:`opaque_subclass.dtensor.mesh_ops`, a ``MeshGroupPass`` made), never by
importing :mod:`opaque_subclass.dtensor`. ``DeviceMesh`` and ``ProcessGroup`` are registered as
reference opaques first where torch has not (torch 2.11), as the schemas name them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh

from opaque_subclass.core.registry import real_object, register_opaque
from opaque_subclass.dtensor import _COLLECTIVES, NAMESPACE, _op_name
from opaque_subclass.sharded.collectives import note_collective

__all__ = ["LIBRARY", "OPS"]


def _target(namespace: str, name: str) -> Any:
    if namespace == "_dtensor":
        importlib.import_module("torch.distributed.tensor._collective_utils")  # defines torch.ops._dtensor

    return getattr(getattr(torch.ops, namespace), name).default


def _type_name(cls: type) -> str:
    """How torch's schemas spell ``cls`` (a registered opaque type)."""

    def probe(obj: Any) -> None:
        pass

    probe.__annotations__ = {"obj": cls, "return": None}
    schema = torch.library.infer_schema(probe, mutates_args=())
    return schema[1 : schema.index(" obj")]


def _wait(result: Any) -> Any:
    wait = torch.ops._c10d_functional.wait_tensor
    if isinstance(result, torch.Tensor):
        return wait(result)
    return [wait(t) for t in result]


#: How an op's trailing arguments name its group: ``(leading arguments, the group, the mesh or None)``.
_Split = Callable[[tuple[Any, ...]], tuple[tuple[Any, ...], Any, Any]]


def _mesh_and_dim(args: tuple[Any, ...]) -> tuple[tuple[Any, ...], Any, Any]:
    mesh = real_object(args[-2])
    if not isinstance(mesh, DeviceMesh):  # a mesh made up by a tracer: shapes need no group
        return args[:-2], None, None
    return args[:-2], mesh.get_group(args[-1]), mesh


def _group(args: tuple[Any, ...]) -> tuple[tuple[Any, ...], Any, Any]:
    group = real_object(args[-1])
    return args[:-1], group if isinstance(group, ProcessGroup) else None, None  # None: made up by a tracer


def _make_impl(target: Any, name: str, split: _Split) -> Callable[..., Any]:
    def impl(*args: Any) -> Any:
        leading, group, mesh = split(args)
        note_collective(name, group, mesh)
        return _wait(target(*leading, group.group_name))

    return impl


def _make_fake(target: Any, split: _Split) -> Callable[..., Any]:
    def fake(*args: Any) -> Any:
        leading, group, _ = split(args)
        return target(*leading, group.group_name if group is not None else "0")

    return fake


register_opaque(DeviceMesh)  # 2.12+: torch's own registration; 2.11: the library's
register_opaque(ProcessGroup)

#: The fragment that holds the ops (kept alive with this module: torch drops a fragment's
#: definitions when it is collected).
LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")  # type: ignore[no-untyped-call]


def _define() -> dict[Any, Any]:
    mesh_type, group_type = _type_name(DeviceMesh), _type_name(ProcessGroup)
    ops: dict[Any, Any] = {}
    for (namespace, name), (leading, result) in _COLLECTIVES.items():
        try:
            target = _target(namespace, name)
        except (AttributeError, RuntimeError):  # not in this torch build
            continue
        op_name, full = _op_name(namespace, name), f"{namespace}.{name}"
        on_group = f"{op_name}_on_group"
        LIBRARY.define(f"{op_name}({leading}, {mesh_type} mesh, int mesh_dim) -> {result}")  # type: ignore[no-untyped-call]
        LIBRARY.impl(op_name, _make_impl(target, full, _mesh_and_dim), "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
        torch.library.register_fake(f"{NAMESPACE}::{op_name}", _make_fake(target, _mesh_and_dim), lib=LIBRARY)
        LIBRARY.define(f"{on_group}({leading}, {group_type} group) -> {result}")  # type: ignore[no-untyped-call]
        LIBRARY.impl(on_group, _make_impl(target, full, _group), "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
        torch.library.register_fake(f"{NAMESPACE}::{on_group}", _make_fake(target, _group), lib=LIBRARY)
        ops[(namespace, name)] = getattr(getattr(torch.ops, NAMESPACE), op_name).default
        ops[(namespace, name), "group"] = getattr(getattr(torch.ops, NAMESPACE), on_group).default
    return ops


#: ``(namespace, name)`` of each collective -> the library's op taking a mesh and dimension;
#: ``((namespace, name), "group")`` -> the one taking a ``ProcessGroup``. Bound last
#: (``dtensor.mesh_ops()`` reads it: the ops are complete once it is bound).
OPS: dict[Any, Any] = _define()
