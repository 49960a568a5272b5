"""Adoptions of known subclasses, one function each.

Each imports the class (its package installed), checks the installed version
is one the preset was written for, adopts it, and returns the
:class:`~opaque_subclass.adoption.adopt.Adoption` (``.undo()`` restores it).
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

    Its flatten context ``(spec, requires_grad)`` holds the mesh at ``[0].mesh``.
    Op outputs, gradients and tangents (``__coerce_same_metadata_as_tangent__``)
    are all covered; a ``ShardTensor`` subclass with a nested context
    (``__subclass_flatten_context__``) is not.

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
