"""Adoptions of known subclasses, one function each.

Each function imports the class (its package must be installed), checks that
the installed version is one the preset was written against, and adopts the
class with the declaration its code needs. It returns the
:class:`~opaque_subclass.adoption.adopt.Adoption` (``.undo()`` restores the
class).
"""

from __future__ import annotations

import importlib.metadata

from opaque_subclass.adoption.adopt import Adoption, ContextOpaque, adopt
from opaque_subclass.core.errors import OpaqueValueError

__all__ = ["physicsnemo_shard_tensor"]

#: The nvidia-physicsnemo releases :func:`physicsnemo_shard_tensor` was written against.
PHYSICSNEMO_RELEASES = ("2.2",)


def physicsnemo_shard_tensor() -> Adoption:
    """Adopt NVIDIA PhysicsNeMo's ``ShardTensor`` (``nvidia-physicsnemo`` 2.2.x):
    the ``DeviceMesh`` of its spec becomes the opaque attribute ``_mesh``.

    ``ShardTensor.__tensor_flatten__`` returns ``["_local_tensor"]`` and the
    context ``(spec, requires_grad)``, whose ``spec.mesh`` is the mesh (path
    ``[0].mesh``). PhysicsNeMo builds op outputs and gradients as
    ``ShardTensor`` itself and rebuilds tangents through
    ``__coerce_same_metadata_as_tangent__``: the adoption covers all of them.
    A subclass of ``ShardTensor`` that returns a nested context
    (``__subclass_flatten_context__``) is not covered.

    Raises
    ------
    OpaqueValueError
        The installed nvidia-physicsnemo is not a 2.2 release.
    ImportError
        nvidia-physicsnemo is not installed.
    """
    version = importlib.metadata.version("nvidia-physicsnemo")
    if not version.startswith(tuple(f"{r}." for r in PHYSICSNEMO_RELEASES)):
        raise OpaqueValueError(
            f"opaque_subclass.adoption.physicsnemo_shard_tensor() was written against nvidia-physicsnemo "
            f"{', '.join(f'{r}.x' for r in PHYSICSNEMO_RELEASES)}, and {version} is installed: its "
            "ShardTensor's flatten context may hold the mesh elsewhere. Fix: python -m pip install "
            "'nvidia-physicsnemo==2.2.*', or adopt the class yourself (docs/adopting.md): "
            "`import opaque_subclass; from physicsnemo.domain_parallel import ShardTensor; from "
            "torch.distributed.device_mesh import DeviceMesh; opaque_subclass.adopt(ShardTensor, "
            '{"_mesh": opaque_subclass.ContextOpaque("[0].mesh", DeviceMesh)})`'
        )
    from physicsnemo.domain_parallel import ShardTensor  # type: ignore[import-not-found]  # an optional client package
    from torch.distributed.device_mesh import DeviceMesh

    return adopt(ShardTensor, {"_mesh": ContextOpaque("[0].mesh", DeviceMesh)})
