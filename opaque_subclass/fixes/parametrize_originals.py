"""A stored opaque deleted from a parametrization (torch 2.11 - 2.15).

After ``unwrap_subclass_parameters`` (or torch's ``unwrap_tensor_subclass_parameters``), a
subclass parameter ``w`` is stored as its leaves on
``module.parametrizations.w``: tensors as ``original0``, ... and each reference
opaque as a plain attribute ``original{i}``. A leaf deleted from there
(``del module.parametrizations.w.original1``) makes torch's
``ParametrizationList.forward`` raise ``AttributeError`` while the property
``module.w`` is being read, and Python reports any ``AttributeError`` raised in
a property getter as the property itself missing: the user reads
``'ParametrizedM' object has no attribute 'w'``, which names neither the leaf
nor the opaque.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import torch

from opaque_subclass.core.errors import OpaqueSubclassError
from opaque_subclass.core.registry import stored_opaque_leaves
from opaque_subclass.core.spec import OpaqueSlot, SubclassLayout, iter_slots
from opaque_subclass.fixes import messages
from opaque_subclass.fixes.tangent_attributes import opaque_slot_types
from opaque_subclass.patching import composes

__all__ = ["make_forward"]


def _stored(plist: Any, name: str) -> bool:
    """Whether ``plist`` holds ``name`` the way ``ParametrizationList`` stores
    a leaf: a parameter, a buffer, or (an opaque) a plain attribute."""
    return name in plist._parameters or name in plist._buffers or name in vars(plist)


def _torch_meta_opaques(meta: Any, path: str, at: int) -> tuple[list[tuple[int, str, type | None]], int]:
    """The opaque slots of torch's subclass-parametrization metadata (``subclass_meta``
    of ``UnwrapTensorSubclass``): ``(leaf index, attribute path, class or None)``."""
    found: list[tuple[int, str, type | None]] = []
    if meta is None:
        return found, at + 1
    if isinstance(meta, (OpaqueSlot, *opaque_slot_types())):
        return [(at, path, getattr(meta, "opaque_type", None))], at + 1
    attrs = getattr(meta, "attrs", None)
    if not isinstance(attrs, dict):
        return found, at
    for name, sub in attrs.items():
        inner, at = _torch_meta_opaques(sub, f"{path}.{name}" if path else name, at)
        found += inner
    return found, at


def _caller_tensor_name() -> str | None:
    """The name of the parametrized tensor being read, from torch's property
    getter (``get_parametrized``, whose closure holds ``tensor_name``) a few
    frames up; ``None`` when it is not there. Read only to word an error."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(12):  # the disabled wrapper, Module.__call__ and forward lie in between
        if frame is None:
            return None
        if frame.f_code.co_name == "get_parametrized":
            name = frame.f_locals.get("tensor_name")
            return name if isinstance(name, str) else None
        frame = frame.f_back
    return None


def _opaque_leaves(plist: Any, name: str | None) -> Iterator[tuple[int, str, type | None, type | None]]:
    """``(leaf index, attribute path, opaque class, subclass)`` for each opaque
    leaf the first parametrization of ``plist`` rebuilds from, when that
    parametrization is a subclass unwrapping (the library's ``UnwrapSubclass``,
    which has ``spec`` and ``path``, or torch's ``UnwrapTensorSubclass``, which
    has ``subclass_meta``)."""
    first = plist[0] if len(plist) else None
    spec = getattr(first, "spec", None)
    if isinstance(spec, SubclassLayout):
        for path, slot in iter_slots(spec, name or ""):
            if isinstance(slot, OpaqueSlot):
                yield slot.unwrapped_idx, path, slot.opaque_type, spec.subclass_type
        return
    meta = getattr(first, "subclass_meta", None)
    if meta is not None and hasattr(meta, "attrs"):
        for index, path, cls in _torch_meta_opaques(meta, name or "", 0)[0]:
            yield index, path, cls, getattr(meta, "class_type", None)


def _deleted_leaf_error(plist: Any, missing: list[int]) -> OpaqueSubclassError | None:
    """The library's error for the leaves ``missing`` of ``plist``, when one of
    them was an opaque; ``None`` for a list without opaques (torch's own error
    stands)."""
    first = plist[0] if len(plist) else None
    full = getattr(first, "path", None)  # the library's UnwrapSubclass: "layer.w" from the root module
    name = full.rpartition(".")[2] if isinstance(full, str) and full else _caller_tensor_name()
    opaques = {index: (path, cls, owner) for index, path, cls, owner in _opaque_leaves(plist, name)}
    if not any(i in opaques for i in missing) and not stored_opaque_leaves(plist):
        return None
    i = next((i for i in missing if i in opaques), missing[0])
    path, cls, owner = opaques.get(i, (None, None, None))
    return messages.deleted_leaf(f"original{i}", full if isinstance(full, str) else None, name, path, cls, owner)


@composes
def make_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch.nn.utils.parametrize.ParametrizationList.forward``
    (torch 2.11, 2.12, 2.13, 2.14 and 2.15: one fingerprint), which reads the stored leaves
    ``original{i}`` and applies the parametrizations.

    Without it, reading ``module.w`` after ``del module.parametrizations.w.original1``
    (an opaque leaf) fails with ``'ParametrizedM' object has no attribute 'w'``:
    torch's ``AttributeError`` for the leaf is raised inside the property
    ``w``, and Python then reports ``w`` missing. With it, a missing leaf of a
    list that holds opaques raises :class:`opaque_subclass.OpaqueSubclassError`
    (deliberately not an ``AttributeError``, which the property would hide
    again) naming the leaf, the opaque's attribute in the subclass, its class
    and the statement that stores it again. Only the failure is examined: a
    read that succeeds runs torch's function unchanged, and a list without
    opaques keeps torch's error. torch 2.12's native opaque attributes
    (pytorch/pytorch#176457) store opaque leaves as plain attributes, as the
    2.11 backport does, and leave this read as it was.
    """

    # _raise_for_missing_leaf behind torch.compiler.disable, made once: now when Dynamo is
    # imported, else on the first failed read (making it imports Dynamo, which importing
    # the library must not do)
    untraced: list[Callable[[Any], None]] = []
    if "torch._dynamo" in sys.modules:
        untraced.append(_untraced_check())

    def forward(self: Any) -> Any:
        try:
            return original(self)
        except AttributeError:
            if getattr(self, "is_tensor", True):
                raise
            if not untraced:
                untraced.append(_untraced_check())
            untraced[0](self)
            raise

    return forward


def _untraced_check() -> Callable[[Any], None]:
    """:func:`_raise_for_missing_leaf`, which torch.compile must not trace: the
    failing read breaks the graph there and the error is raised by eager code."""
    return torch.compiler.disable(  # type: ignore[no-any-return,no-untyped-call]
        _raise_for_missing_leaf,
        reason=messages.MISSING_LEAF_REASON,
    )


def _raise_for_missing_leaf(plist: Any) -> None:
    """Raise the library's error when a leaf of ``plist`` that is (or sits next
    to) an opaque is missing; return otherwise. Never traced: under
    ``torch.compile`` the failing read breaks the graph here, so the error is
    raised by eager code, as itself, on every release (torch 2.11's Dynamo
    cannot trace the raise of a library exception built in traced code)."""
    missing = [i for i in range(plist.ntensors) if not _stored(plist, f"original{i}")]
    error = _deleted_leaf_error(plist, missing) if missing else None
    if error is not None:
        raise error
