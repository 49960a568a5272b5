"""The schema: one frozen description of a flattened, possibly nested subclass.

A traceable wrapper subclass flattens into a list of *leaves*, plain tensors and
reference opaques, depth-first in the order of ``__tensor_flatten__``'s names,
optionally followed per subclass by the symbolic entries of its outer size and
stride. Each leaf's *slot* (its index in the list) is described by one of

* :class:`TensorSlot` - a plain tensor (or, at the top level, any value passed
  through unchanged, such as an ``int``);
* :class:`OpaqueSlot` - a reference opaque, taking exactly one slot;
* :class:`SymIntSlot` - a symbolic size or stride entry of a subclass;

and a subclass by :class:`SubclassLayout`, whose ``attrs`` map each flattened
attribute name to its meta. Metas are frozen: the form safe to keep at run time
is a new object (:meth:`SubclassLayout.runtime_safe`), never a mutation.

:func:`iter_slots` is the one walk over a meta's slots (flatten, unflatten,
wrap, unwrap, diagnostics); :func:`rebuild` builds a meta's value from a flat
list (the walk over a live instance is :mod:`opaque_subclass.core.walk`).

The classes mirror torch 2.12's AOTAutograd metadata (``schemas.PlainTensorMeta``,
``schemas.OpaqueMeta``, ``schemas.SubclassCreationMeta``; torch 2.11 has the
first and the last) with torch's field names, but are the library's own
classes: torch's and ours are never interchangeable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, Union

import torch

from opaque_subclass.core import messages
from opaque_subclass.core.errors import subject
from opaque_subclass.core.registry import opaque_kind

__all__ = [
    "Layout",
    "LeafSlot",
    "OpaqueSlot",
    "SubclassLayout",
    "SymIntSlot",
    "TensorSlot",
    "iter_slots",
    "iter_subclasses",
    "rebuild",
    "symint_placeholders",
    "unflatten_checked",
]

IntLike = int | torch.SymInt


@dataclass(frozen=True, slots=True)
class TensorSlot:
    """A slot holding a plain tensor (or a passed-through top-level value); mirrors ``schemas.PlainTensorMeta``.

    Attributes
    ----------
    unwrapped_idx
        Index of the slot in the flat list.
    attr
        Name of the attribute of the enclosing subclass, ``None`` at the top level.
    memory_format
        Memory format expected of a tangent for this slot (when made ``with_memory_format=True``), else ``None``.
    """

    unwrapped_idx: int
    attr: str | None = None
    memory_format: torch.memory_format | None = None


@dataclass(frozen=True, slots=True)
class OpaqueSlot:
    """A slot holding a reference opaque object; mirrors torch 2.12's ``schemas.OpaqueMeta``.

    Opaques are never differentiable (tangent processing passes them through) and compare by identity.

    Attributes
    ----------
    unwrapped_idx
        Index of the slot in the flat list.
    attr
        Name of the attribute of the enclosing subclass, ``None`` for a top-level argument.
    opaque_type
        The class of the opaque object seen when the meta was made.
    """

    unwrapped_idx: int
    attr: str | None
    opaque_type: type


@dataclass(frozen=True, slots=True)
class SymIntSlot:
    """A slot holding a symbolic entry of a subclass's outer size or stride."""

    unwrapped_idx: int
    kind: Literal["size", "stride"]
    dim: int


Layout = Union[TensorSlot, OpaqueSlot, "SubclassLayout"]  # a forward reference, which `|` cannot take at run time
LeafSlot = TensorSlot | OpaqueSlot | SymIntSlot


class _FrozenAttrs(dict):  # type: ignore[type-arg]  # str -> Layout, checked on build
    """A read-only ``dict``: iteration and lookup at ``dict`` speed, no mutation."""

    __slots__ = ()

    def _readonly(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise messages.layout_read_only()

    # deliberately disabled
    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _readonly
    __ior__ = _readonly

    def __hash__(self) -> int:  # type: ignore[override]  # immutable, so hashable
        return hash(tuple(self.items()))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (dict(self),))


def _is_symbolic(x: object) -> bool:
    return isinstance(x, torch.SymInt) and not x.node.is_nested_int()


def symint_placeholders(outer: tuple[IntLike | None, ...]) -> tuple[int, ...]:
    """Dimensions of an outer size/stride read from the flat list: the non-nested ``SymInt``
    entries, or after :meth:`SubclassLayout.runtime_safe` the entries replaced by ``None``."""
    return tuple(i for i, s in enumerate(outer) if s is None or _is_symbolic(s))


@dataclass(frozen=True, slots=True)
class SubclassLayout:
    """How to rebuild one (possibly nested) subclass from a flat list of leaves;
    mirrors torch's ``schemas.SubclassCreationMeta``.

    Attributes
    ----------
    flat_tensor_start_idx
        Index of this subclass's first slot in the flat list.
    attrs
        Attribute name -> meta, in ``__tensor_flatten__`` order. Read-only.
    meta
        The flatten context (second return value of ``__tensor_flatten__``).
    outer_size, outer_stride
        ``SymInt`` entries while tracing, ``None`` placeholders in the runtime-safe form.
    subclass_type
        The subclass, whose ``__tensor_unflatten__`` rebuilds it.
    attr
        Name of the attribute of the enclosing subclass, ``None`` at the top level.
    included_subclass_symints
        Whether the symbolic entries of ``outer_size``/``outer_stride`` take slots after the attributes.
    memory_format
        Memory format expected of a tangent for this subclass, or ``None``.
    original_subclass
        The (fake) tensor the meta was made from, to mirror autograd metadata while tracing;
        ``None`` in the runtime-safe form.

    Derived: ``arg_count`` (slots taken, nested subclasses and symbolic sizes included),
    ``num_tensors``, ``num_opaques``, ``size_placeholders`` and ``stride_placeholders``.
    """

    flat_tensor_start_idx: int
    attrs: Mapping[str, Layout]
    meta: Any
    outer_size: tuple[IntLike | None, ...]
    outer_stride: tuple[IntLike | None, ...]
    subclass_type: type
    attr: str | None = None
    included_subclass_symints: bool = False
    memory_format: torch.memory_format | None = None
    original_subclass: torch.Tensor | None = field(default=None, compare=False, repr=False)

    arg_count: int = field(init=False, compare=False)
    num_tensors: int = field(init=False, compare=False, repr=False)
    num_opaques: int = field(init=False, compare=False, repr=False)
    size_placeholders: tuple[int, ...] = field(init=False, compare=False, repr=False)
    stride_placeholders: tuple[int, ...] = field(init=False, compare=False, repr=False)
    # Compiled run-time helpers (see opaque_subclass.core.codegen); a cache, not metadata.
    _compiled: dict[object, Any] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        setattr_ = object.__setattr__
        attrs = self.attrs if type(self.attrs) is _FrozenAttrs else _FrozenAttrs(self.attrs)
        setattr_(self, "attrs", attrs)
        setattr_(self, "outer_size", tuple(self.outer_size))
        setattr_(self, "outer_stride", tuple(self.outer_stride))
        if not isinstance(self.subclass_type, type) or not issubclass(self.subclass_type, torch.Tensor):
            raise messages.layout_not_a_tensor_class(self.subclass_type)
        count = tensors = opaques = 0
        expected = self.flat_tensor_start_idx
        for name, sub in attrs.items():
            if isinstance(sub, SubclassLayout):
                start, width = sub.flat_tensor_start_idx, sub.arg_count
                tensors += sub.num_tensors
                opaques += sub.num_opaques
            elif isinstance(sub, (TensorSlot, OpaqueSlot)):
                start, width = sub.unwrapped_idx, 1
                if isinstance(sub, OpaqueSlot):
                    opaques += 1
                else:
                    tensors += 1
            else:
                raise messages.layout_slot_wrong_type(self.subclass_type, name, sub, expected)
            if sub.attr != name:
                raise messages.layout_slot_attr_differs(self.subclass_type, name, sub.attr)
            if start != expected:
                field_name = "flat_tensor_start_idx" if isinstance(sub, SubclassLayout) else "unwrapped_idx"
                raise messages.layout_slot_misplaced(self.subclass_type, name, start, expected, field_name)
            expected += width
            count += width
        size_ph = symint_placeholders(self.outer_size)
        stride_ph = symint_placeholders(self.outer_stride)
        if self.included_subclass_symints:
            count += len(size_ph) + len(stride_ph)
        setattr_(self, "arg_count", count)
        setattr_(self, "num_tensors", tensors)
        setattr_(self, "num_opaques", opaques)
        setattr_(self, "size_placeholders", size_ph)
        setattr_(self, "stride_placeholders", stride_ph)
        setattr_(self, "_compiled", {})

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuild through __init__ so derived fields and caches are recomputed.
        return (
            _rebuild_layout,
            (
                {
                    f.name: getattr(self, f.name)
                    for f in dataclasses.fields(self)
                    if f.init and f.name != "original_subclass"
                },
            ),
        )

    @property
    def symint_start_idx(self) -> int:
        """Flat index of this subclass's first symbolic size slot."""
        return (
            self.flat_tensor_start_idx
            + self.arg_count
            - (len(self.size_placeholders) + len(self.stride_placeholders) if self.included_subclass_symints else 0)
        )

    def runtime_safe(self) -> SubclassLayout:
        """A copy holding no tracing objects (no original subclass, no ``SymInt``), or ``self`` if it holds none.

        Symbolic sizes/strides become ``None`` (read from the flat list at run time); nested ints
        become ``-1`` (nested-tensor subclasses ignore them).
        """

        def safe(x: IntLike | None) -> int | None:
            if isinstance(x, torch.SymInt):
                return -1 if x.node.is_nested_int() else None
            return x

        attrs = {k: v.runtime_safe() if isinstance(v, SubclassLayout) else v for k, v in self.attrs.items()}
        size = tuple(map(safe, self.outer_size))
        stride = tuple(map(safe, self.outer_stride))
        if (
            self.original_subclass is None
            and size == self.outer_size
            and stride == self.outer_stride
            and all(a is b for a, b in zip(attrs.values(), self.attrs.values(), strict=True))
        ):
            return self
        return dataclasses.replace(self, attrs=attrs, outer_size=size, outer_stride=stride, original_subclass=None)

    def unflatten(self, leaves: list[Any] | tuple[Any, ...]) -> torch.Tensor:
        """Rebuild the subclass from ``leaves``, indexed by this meta's absolute slots.

        Opaque slots receive the very objects given. Every leaf is checked as by :func:`unflatten_checked`.
        """
        result: torch.Tensor = unflatten_checked(leaves, self)
        return result


def _rebuild_layout(kwargs: dict[str, Any]) -> SubclassLayout:
    return SubclassLayout(**kwargs)


def iter_slots(meta: Layout, prefix: str = "") -> Iterator[tuple[str, LeafSlot]]:
    """Yield ``(path, slot_meta)`` for every flat slot of ``meta``, in flat order.

    Paths are relative to the object ``meta`` describes, joined to ``prefix``: with ``prefix="w"``,
    ``"w._inner._mesh"`` for a nested opaque, ``"w.size()[0]"`` for a symbolic size slot.
    """
    if isinstance(meta, SubclassLayout):
        for name, sub in meta.attrs.items():
            yield from iter_slots(sub, f"{prefix}.{name}" if prefix else name)
        if meta.included_subclass_symints:
            idx = meta.symint_start_idx
            for kind, dims in (("size", meta.size_placeholders), ("stride", meta.stride_placeholders)):
                for d in dims:
                    yield f"{prefix}.{kind}()[{d}]" if prefix else f"{kind}()[{d}]", SymIntSlot(idx, kind, d)  # type: ignore[arg-type]  # kind is one of the two literals
                    idx += 1
    elif isinstance(meta, (TensorSlot, OpaqueSlot)):
        yield prefix, meta
    else:
        raise AssertionError(f"iter_slots: unexpected meta {meta!r}")


def iter_subclasses(meta: Layout, prefix: str = "") -> Iterator[tuple[str, SubclassLayout]]:
    """Yield ``(path, subclass_meta)`` for ``meta`` and every nested subclass, outermost first;
    paths as in :func:`iter_slots` (``""`` for the top level with no ``prefix``)."""
    if isinstance(meta, SubclassLayout):
        yield prefix, meta
        for name, sub in meta.attrs.items():
            yield from iter_subclasses(sub, f"{prefix}.{name}" if prefix else name)


# ---------------------------------------------------------------- rebuilding


def _fill_placeholders(meta: SubclassLayout, leaves: Sequence[Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    it = iter(leaves[meta.symint_start_idx : meta.flat_tensor_start_idx + meta.arg_count])
    size = list(meta.outer_size)
    for d in meta.size_placeholders:
        size[d] = next(it)
    stride = list(meta.outer_stride)
    for d in meta.stride_placeholders:
        stride[d] = next(it)
    return tuple(size), tuple(stride)


def rebuild(meta: Layout, leaves: Sequence[Any], *, is_runtime: bool, path: str = "x") -> Any:
    """Rebuild the value described by ``meta`` from the absolute slots of ``leaves``.

    The generic path, used while tracing and for checked unflattening. Outer sizes come from the
    meta, or from ``leaves`` for symbolic placeholders when ``is_runtime``. A ``__tensor_unflatten__``
    returning anything but an instance of its class is refused.
    """
    if not isinstance(meta, SubclassLayout):
        return leaves[meta.unwrapped_idx]
    inner = {
        name: rebuild(sub, leaves, is_runtime=is_runtime, path=f"{path}.{name}") for name, sub in meta.attrs.items()
    }
    size, stride = meta.outer_size, meta.outer_stride
    if is_runtime and meta.included_subclass_symints and (meta.size_placeholders or meta.stride_placeholders):
        size, stride = _fill_placeholders(meta, leaves)
    cls = meta.subclass_type
    result = cls.__tensor_unflatten__(inner, meta.meta, size, stride)  # type: ignore[attr-defined]  # a wrapper subclass
    if not isinstance(result, cls):
        raise messages.unflatten_returned_wrong_type(cls, result, path)
    if not is_runtime and meta.original_subclass is not None:
        torch._mirror_autograd_meta_to(meta.original_subclass, result)  # type: ignore[attr-defined]  # private C binding present on all supported torch
    return result


def _check_leaf(path: str, slot: LeafSlot, leaf: object, owner: str) -> None:
    if isinstance(slot, OpaqueSlot):
        if isinstance(leaf, torch.Tensor) or opaque_kind(leaf) != "reference":
            if not isinstance(leaf, torch.Tensor) and opaque_kind(leaf) is None and isinstance(leaf, slot.opaque_type):
                raise messages.leaf_unregistered(owner, slot.unwrapped_idx, path, leaf)
            raise messages.leaf_not_the_opaque(owner, slot.unwrapped_idx, path, slot.opaque_type, leaf)
    elif isinstance(slot, TensorSlot) and slot.attr is not None:
        if not isinstance(leaf, torch.Tensor):
            raise messages.leaf_not_a_tensor(owner, slot.unwrapped_idx, path, leaf)


def unflatten_checked(leaves: Sequence[Any], spec: Layout, *, name: str = "x") -> Any:
    """Rebuild a value from ``leaves`` and ``spec`` after checking the leaf count and each leaf against
    its slot (errors name the subclass and attribute path). Opaque leaves are placed as the same objects."""
    if isinstance(spec, SubclassLayout):
        start, width, owner = spec.flat_tensor_start_idx, spec.arg_count, subject(spec.subclass_type)
    elif isinstance(spec, (TensorSlot, OpaqueSlot)):
        start, width, owner = spec.unwrapped_idx, 1, "a plain value"
    else:
        raise messages.not_a_spec(spec)
    if len(leaves) != start + width:
        counts = (spec.num_tensors, spec.num_opaques) if isinstance(spec, SubclassLayout) else None
        raise messages.leaf_count(owner, width, start, len(leaves), counts)
    for path, slot in iter_slots(spec, name):
        _check_leaf(path, slot, leaves[slot.unwrapped_idx], owner)
    return rebuild(spec, leaves, is_runtime=True, path=name)
