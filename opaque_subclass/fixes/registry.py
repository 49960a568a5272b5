"""Which objects torch 2.12 takes for opaques.

torch 2.12 recognises an opaque attribute by ``isinstance(value, OpaqueBase)``
(AOTAutograd, Dynamo, fake tensors, export, FSDP), true only for ``OpaqueBase``
subclasses, though the registries (:func:`~opaque_subclass.register_opaque`)
accept others. torch 2.13 asks the registry instead.
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

    Without it, listing a registered opaque not inheriting ``OpaqueBase`` (a class
    you do not own) fails in AOTAutograd with ``AssertionError: expected Tensor
    or OpaqueBase, got <class ...>`` (compile, backward, compiled autograd,
    export, parametrization). With it, ``isinstance(obj, OpaqueBase)`` (not its
    subclasses) holds for any registered opaque and torch's fake of one, as the
    registry-consulting ``__instancecheck__`` of torch 2.13 answers.
    """

    base = importlib.import_module("torch._opaque_base").OpaqueBase

    def __instancecheck__(cls: type, instance: Any) -> bool:
        if original(cls, instance):
            return True
        return cls is base and opaque_kind(instance) is not None

    return __instancecheck__
