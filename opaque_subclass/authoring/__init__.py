"""Authoring: :class:`OpaqueSubclass`, a declarative base class that derives a correct
``__tensor_flatten__``/``__tensor_unflatten__`` and a default ``__torch_dispatch__`` rule."""

from opaque_subclass.authoring.base import OpaqueSubclass

__all__ = ["OpaqueSubclass"]
