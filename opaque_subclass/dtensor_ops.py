"""The ops :class:`opaque_subclass.dtensor.MeshGroupPass` puts in place of collectives
(``torch.ops.opaque_subclass.mesh_all_reduce`` and one per collective of
``dtensor._SCHEMAS`` this torch build has), defined when this module is imported: on
first use (:func:`opaque_subclass.dtensor.mesh_ops`, a ``MeshGroupPass`` made), never by
importing :mod:`opaque_subclass.dtensor`. ``DeviceMesh`` is registered as a reference
opaque first where torch has not (torch 2.11), as the schemas name it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh

from opaque_subclass.core.registry import real_object, register_opaque
from opaque_subclass.dtensor import _COLLECTIVES, NAMESPACE, _op_name
from opaque_subclass.sharded.collectives import note_collective

__all__ = ["LIBRARY", "OPS"]


def _target(namespace: str, name: str) -> Any:
    if namespace == "_dtensor":
        importlib.import_module("torch.distributed.tensor._collective_utils")  # defines torch.ops._dtensor

    return getattr(getattr(torch.ops, namespace), name).default


def _mesh_type_name() -> str:
    """How torch's schemas spell ``DeviceMesh`` (a registered opaque type)."""

    def probe(mesh: DeviceMesh) -> None:
        pass

    schema = torch.library.infer_schema(probe, mutates_args=())
    return schema[1 : schema.index(" mesh")]


def _wait(result: Any) -> Any:
    wait = torch.ops._c10d_functional.wait_tensor
    if isinstance(result, torch.Tensor):
        return wait(result)
    return [wait(t) for t in result]


def _make_impl(target: Any, name: str) -> Callable[..., Any]:
    def impl(*args: Any) -> Any:
        mesh, mesh_dim = args[-2], args[-1]
        group = mesh.get_group(mesh_dim)
        note_collective(name, group, mesh)
        return _wait(target(*args[:-2], group.group_name))

    return impl


def _make_fake(target: Any) -> Callable[..., Any]:
    def fake(*args: Any) -> Any:
        mesh = real_object(args[-2])
        if not isinstance(mesh, DeviceMesh):  # a mesh made up by a tracer: shapes need no group
            return target(*args[:-2], "0")
        return target(*args[:-2], mesh.get_group(args[-1]).group_name)

    return fake


register_opaque(DeviceMesh)  # 2.12+: torch's own registration; 2.11: the library's

#: The fragment that holds the ops (kept alive with this module: torch drops a fragment's
#: definitions when it is collected).
LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")  # type: ignore[no-untyped-call]


def _define() -> dict[tuple[str, str], Any]:
    mesh_type = _mesh_type_name()
    ops: dict[tuple[str, str], Any] = {}
    for (namespace, name), (leading, result) in _COLLECTIVES.items():
        try:
            target = _target(namespace, name)
        except (AttributeError, RuntimeError):  # not in this torch build
            continue
        op_name = _op_name(namespace, name)
        LIBRARY.define(f"{op_name}({leading}, {mesh_type} mesh, int mesh_dim) -> {result}")  # type: ignore[no-untyped-call]
        LIBRARY.impl(op_name, _make_impl(target, f"{namespace}.{name}"), "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
        torch.library.register_fake(f"{NAMESPACE}::{op_name}", _make_fake(target), lib=LIBRARY)
        ops[(namespace, name)] = getattr(getattr(torch.ops, NAMESPACE), op_name).default
    return ops


#: ``(namespace, name)`` of each collective -> the library's op for it; bound last
#: (``dtensor.mesh_ops()`` reads it: the ops are complete once it is bound).
OPS: dict[tuple[str, str], Any] = _define()
