"""The ops :class:`opaque_subclass.dtensor.MeshGroupPass` puts in place of collectives
(``torch.ops.opaque_subclass.mesh_all_reduce`` and one per collective of
``dtensor._SCHEMAS`` this torch build has), defined when this module is imported: on
first use (:func:`opaque_subclass.dtensor.mesh_ops`, a ``MeshGroupPass`` made), never by
importing :mod:`opaque_subclass.dtensor`. ``DeviceMesh`` is registered as a reference
opaque first where torch has not (torch 2.11), as the schemas name it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh

from opaque_subclass.core.registry import register_opaque
from opaque_subclass.dtensor import _COLLECTIVES, NAMESPACE, _make_fake, _make_impl, _mesh_type_name, _op_name, _target

__all__ = ["LIBRARY", "OPS"]

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
