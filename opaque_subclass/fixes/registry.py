"""Which objects torch 2.12 takes for opaques.

torch 2.12 recognises an opaque attribute of a tensor subclass by
``isinstance(value, OpaqueBase)`` (``case OpaqueBase():`` in AOTAutograd,
Dynamo, fake-tensor conversion, export and FSDP). On 2.12 that holds only for
classes that inherit ``OpaqueBase``, although torch's own registry, and the
library's :func:`~opaque_subclass.register_opaque`, accept classes that do not.
torch 2.13 answers the question from the registry instead.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from opaque_subclass.core.registry import opaque_kind
from opaque_subclass.patching import composes

__all__ = ["make_instancecheck"]


@composes
def make_instancecheck(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._opaque_base.OpaqueBaseMeta.__instancecheck__`` (torch 2.12).

    Without it, a subclass whose ``__tensor_flatten__`` lists an object of a
    registered opaque class that does not inherit ``OpaqueBase`` (a class you
    do not own, entered with ``register_opaque``) fails inside AOTAutograd
    with ``AssertionError: expected Tensor or OpaqueBase, got <class ...>``
    under compile, backward, compiled autograd, export and parametrization.
    With it, ``isinstance(obj, OpaqueBase)`` - for ``OpaqueBase`` itself, not
    for its subclasses - also holds for an instance of any registered opaque
    class and for torch's fake wrapper of one, as torch 2.13 answers
    (``OpaqueBaseMeta.__instancecheck__`` consults the registry since 2.13).
    """

    base = importlib.import_module("torch._opaque_base").OpaqueBase

    def __instancecheck__(cls: type, instance: Any) -> bool:
        if original(cls, instance):
            return True
        return cls is base and opaque_kind(instance) is not None

    return __instancecheck__
