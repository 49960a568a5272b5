"""Fake-tensor conversion of subclasses with opaque attributes (torch 2.11).

torch 2.11's ``MetaTensorDescriber.describe_tensor`` and ``is_fake`` treat every
flattened attribute as a tensor (``'Mesh' object has no attribute 'is_leaf'``).
As in torch 2.12 (pytorch/pytorch#176457), the patched fake subclass holds fake
inner tensors and the very same real opaques.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from opaque_subclass.backport import messages
from opaque_subclass.backport.hiding import is_opaque_leaf, opaque_attrs, split_attrs, tensor_attrs_decide

__all__ = ["make_describe_tensor", "make_is_fake", "make_maybe_get_fake_mode"]


class _OpaqueRestoringType:
    """Stands in for ``MetaTensorDesc.type``: its ``__tensor_unflatten__`` puts the
    opaques hidden while describing back into the inner dict."""

    __slots__ = ("cls", "opaques")

    def __init__(self, cls: type, opaques: dict[str, Any]) -> None:
        self.cls = cls
        self.opaques = opaques

    def __tensor_unflatten__(self, inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        return self.cls.__tensor_unflatten__({**inner, **self.opaques}, ctx, size, stride)  # type: ignore[attr-defined]  # a wrapper subclass

    def __repr__(self) -> str:
        return repr(self.cls)


@dataclasses.dataclass(frozen=True)
class _OpaqueSlot:
    """The patched describer's result for an opaque (taken out one level up);
    ``id`` ``-1`` (not a tensor) is what torch's structured trace prints."""

    value: Any
    id: int = -1


class _TensorAttrs(dict[str, Any]):
    """The description's ``attrs``: the tensor attributes (what torch iterates),
    and by name each opaque's placeholder. torch 2.11's view replay
    (``view_from_base`` in ``MetaConverter.meta_tensor``) indexes ``attrs`` with
    every flattened name; a placeholder's id ``-1`` matches no tensor."""

    __slots__ = ("opaques",)

    def __init__(self, tensors: dict[str, Any], opaques: dict[str, _OpaqueSlot]) -> None:
        super().__init__(tensors)
        self.opaques = opaques

    def __missing__(self, name: str) -> _OpaqueSlot:
        try:
            return self.opaques[name]
        except KeyError:
            raise KeyError(name) from None


def make_describe_tensor(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``MetaTensorDescriber.describe_tensor`` (torch 2.11).

    Without it, describing a subclass listing an opaque fails (every attribute is
    described as a tensor). With it, torch's recursion (through ``self``) gets a
    placeholder per opaque, the description keeps only tensor attributes, and
    the same opaques are put back when the fake subclass is built; nothing is
    written to the described tensor. For a subclass *view* (the ``expand`` of a
    ``sum()`` gradient, fake-converted by compiled autograd), view replay finds
    each opaque's placeholder by name (``_TensorAttrs``), not ``KeyError:
    '_mesh'`` in ``view_from_base``. Unnecessary since torch 2.12 (pytorch/pytorch#176457).
    """

    def describe_tensor(self: Any, t: Any, *, recurse: bool = True, trace: bool = False) -> Any:
        if is_opaque_leaf(t):
            return _OpaqueSlot(t)
        if opaque_attrs(t):  # validates every attribute of this level first
            desc = original(self, t, recurse=recurse, trace=trace)
            attrs = desc.attrs or {}
            slots = {k: v for k, v in attrs.items() if isinstance(v, _OpaqueSlot)}
            tensors = _TensorAttrs({k: v for k, v in attrs.items() if not isinstance(v, _OpaqueSlot)}, slots)
            opaques = {k: v.value for k, v in slots.items()}
            return dataclasses.replace(desc, attrs=tensors, type=_OpaqueRestoringType(type(t), opaques))
        return original(self, t, recurse=recurse, trace=trace)

    return describe_tensor


def make_is_fake(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._subclasses.fake_tensor.is_fake`` (torch 2.11).

    Without it, ``is_fake`` of a subclass holding an opaque raises "got mixed fake
    and real tensors". With it, only the tensor attributes decide. Unnecessary
    since torch 2.12 (pytorch/pytorch#176457).
    """

    return tensor_attrs_decide(original, all, messages.mixed_fake)


def make_maybe_get_fake_mode(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._subclasses.fake_tensor.maybe_get_fake_mode`` (torch 2.11).

    Without it, the opaque's mode (``None``) is consulted too and Dynamo fails with
    "All fake tensor modes must be the same". With it, only tensor attributes
    are. Unnecessary since torch 2.12 (pytorch/pytorch#176457).
    """

    def maybe_get_fake_mode(t: object) -> Any:
        tensors, opaques = split_attrs(t)
        if not opaques:
            return original(t)
        modes = [maybe_get_fake_mode(inner) for _, inner in tensors]
        if any(m is not modes[0] for m in modes):
            raise AssertionError("All fake tensor modes must be the same")
        return modes[0] if modes else None

    return maybe_get_fake_mode
