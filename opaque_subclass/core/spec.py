"""The schema: one frozen description of a flattened, possibly nested subclass.

A traceable wrapper subclass is flattened into a flat list of *leaves*: plain
tensors and reference opaques, in a deterministic depth-first order (the order
of the names returned by ``__tensor_flatten__``), optionally followed, per
subclass, by the symbolic entries of its outer size and stride. Every leaf has a
*slot*: its index in the flat list, described by one of

* :class:`PlainTensorMeta` - a plain tensor (or, at the top level, any other
  value that passes through unchanged, such as an ``int``);
* :class:`OpaqueMeta` - a reference opaque; it takes exactly one slot;
* :class:`SymIntMeta` - a symbolic size or stride entry of a subclass;

and a subclass is described by :class:`SubclassCreationMeta`, whose ``attrs``
map each flattened attribute name to the meta of that attribute. All metas are
frozen: a form that is safe to keep at run time is a new object
(:meth:`SubclassCreationMeta.runtime_safe`), never a mutation.

:func:`iter_slots` is the one walk over a meta's slots, shared by flattening,
unflattening, wrapping, unwrapping and diagnostics; :func:`rebuild` builds the
value a meta describes from a flat list (the walk over a live instance is
:mod:`opaque_subclass.core.walk`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, Union

import torch

from opaque_subclass.core.errors import (
    OpaqueTypeError,
    OpaqueValueError,
    describe_type,
    import_fix,
    qualified_name,
    subject,
)
from opaque_subclass.core.registry import opaque_kind

__all__ = [
    "FlatMeta",
    "OpaqueMeta",
    "PlainTensorMeta",
    "SlotMeta",
    "SubclassCreationMeta",
    "SymIntMeta",
    "bad_unflatten_type",
    "iter_slots",
    "iter_subclasses",
    "rebuild",
    "symint_placeholders",
    "unflatten_checked",
]

IntLike = int | torch.SymInt


@dataclass(frozen=True, slots=True)
class PlainTensorMeta:
    """A slot holding a plain tensor (or a top-level value passed through as is).

    Attributes
    ----------
    unwrapped_idx
        Index of the slot in the flat list.
    attr
        Name of the attribute of the enclosing subclass, ``None`` at the top level.
    memory_format
        Memory format expected of a tangent for this slot (set when the meta was
        created with ``with_memory_format=True``), else ``None``.
    """

    unwrapped_idx: int
    attr: str | None = None
    memory_format: torch.memory_format | None = None


@dataclass(frozen=True, slots=True)
class OpaqueMeta:
    """A slot holding a reference opaque object.

    Opaques are never differentiable: tangent processing passes them through
    untouched. They are compared by identity, never by value.

    Attributes
    ----------
    unwrapped_idx
        Index of the slot in the flat list.
    attr
        Name of the attribute of the enclosing subclass, ``None`` for an opaque
        passed directly as a top-level argument.
    opaque_type
        The class of the opaque object seen when the meta was made.
    """

    unwrapped_idx: int
    attr: str | None
    opaque_type: type


@dataclass(frozen=True, slots=True)
class SymIntMeta:
    """A slot holding a symbolic entry of a subclass's outer size or stride."""

    unwrapped_idx: int
    kind: Literal["size", "stride"]
    dim: int


SlotMeta = Union[
    PlainTensorMeta, OpaqueMeta, "SubclassCreationMeta"
]  # a forward reference, which `|` cannot take at run time
FlatMeta = PlainTensorMeta | OpaqueMeta | SymIntMeta


class _FrozenAttrs(dict):  # type: ignore[type-arg]  # str -> SlotMeta, checked on build
    """A read-only ``dict``: iteration and lookup at ``dict`` speed, no mutation."""

    __slots__ = ()

    def _readonly(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise OpaqueTypeError(
            "SubclassCreationMeta.attrs is read-only (metas are shared by compiled code). Fix: build a "
            "new meta with the attributes you want, `import dataclasses; "
            "meta = dataclasses.replace(meta, attrs={**meta.attrs, name: slot_meta})` (name, slot_meta: "
            "the entry to add, numbered after the others), or make one from an instance with "
            "opaque_subclass.create_subclass_meta([x])[0]"
        )

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
    """Dimensions of an outer size/stride whose value is read from the flat list.

    Before :meth:`SubclassCreationMeta.runtime_safe` those are the non-nested
    ``SymInt`` entries; after it, the entries replaced by ``None``.
    """
    return tuple(i for i, s in enumerate(outer) if s is None or _is_symbolic(s))


@dataclass(frozen=True, slots=True)
class SubclassCreationMeta:
    """How to rebuild one (possibly nested) subclass from a flat list of leaves.

    Attributes
    ----------
    flat_tensor_start_idx
        Index of this subclass's first slot in the flat list.
    attrs
        Attribute name -> meta, in ``__tensor_flatten__`` order. Read-only.
    meta
        The flatten context (second return value of ``__tensor_flatten__``).
    outer_size, outer_stride
        The subclass's size and stride; ``SymInt`` entries while tracing, ``None``
        placeholders in the runtime-safe form.
    subclass_type
        The subclass; ``__tensor_unflatten__`` of this class rebuilds it.
    attr
        Name of the attribute of the enclosing subclass, ``None`` at the top level.
    included_subclass_symints
        Whether the symbolic entries of ``outer_size``/``outer_stride`` occupy
        slots after this subclass's attributes.
    memory_format
        Memory format expected of a tangent for this subclass, or ``None``.
    original_subclass
        The (fake) tensor the meta was made from, used while tracing to mirror
        autograd metadata; ``None`` in the runtime-safe form.

    Derived (not constructor arguments): ``arg_count`` (slots taken, nested
    subclasses and symbolic sizes included), ``num_tensors``, ``num_opaques``,
    ``size_placeholders`` and ``stride_placeholders``.
    """

    flat_tensor_start_idx: int
    attrs: Mapping[str, SlotMeta]
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
            given = self.subclass_type
            shown = qualified_name(given) if isinstance(given, type) else describe_type(given)
            raise OpaqueTypeError(
                f"SubclassCreationMeta.subclass_type must be a torch.Tensor subclass, got {shown}"
                f"{' (a class that is not a tensor)' if isinstance(given, type) else ''}. Fix: pass the "
                "wrapper subclass the meta describes (subclass_type=MeshTensor for a MeshTensor), not the class "
                "of one of its attributes, or make the meta from an instance: `import opaque_subclass; "
                "meta = opaque_subclass.create_subclass_meta([x])[0]` (x: an instance)"
            )
        count = tensors = opaques = 0
        expected = self.flat_tensor_start_idx
        for name, sub in attrs.items():
            if isinstance(sub, SubclassCreationMeta):
                start, width = sub.flat_tensor_start_idx, sub.arg_count
                tensors += sub.num_tensors
                opaques += sub.num_opaques
            elif isinstance(sub, (PlainTensorMeta, OpaqueMeta)):
                start, width = sub.unwrapped_idx, 1
                if isinstance(sub, OpaqueMeta):
                    opaques += 1
                else:
                    tensors += 1
            else:
                raise OpaqueTypeError(
                    f"{subject(self.subclass_type)} meta: attrs[{name!r}] must be a "
                    f"PlainTensorMeta, OpaqueMeta or SubclassCreationMeta, got {describe_type(sub)}. Fix: "
                    f"describe a tensor attribute with `PlainTensorMeta({expected}, {name!r})`, an opaque with "
                    f"OpaqueMeta({expected}, {name!r}, <its class>), a nested subclass with its own "
                    "SubclassCreationMeta"
                )
            if sub.attr != name:
                raise OpaqueValueError(
                    f"{subject(self.subclass_type)} meta: attrs[{name!r}] describes "
                    f"attribute {sub.attr!r}; the key and the meta's attr must agree. Fix: build "
                    f"attrs[{name!r}] with attr={name!r}, `import dataclasses; "
                    f"slot = dataclasses.replace(slot, attr={name!r})` (slot: that meta)"
                )
            if start != expected:
                field_name = "flat_tensor_start_idx" if isinstance(sub, SubclassCreationMeta) else "unwrapped_idx"
                raise OpaqueValueError(
                    f"{subject(self.subclass_type)} meta: attribute {name!r} starts at flat "
                    f"slot {start}, expected {expected} (slots must be contiguous, in order). Fix: give "
                    f"attrs[{name!r}] {field_name}={expected}, and number the attributes after it on from there"
                )
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
            _rebuild_subclass_meta,
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

    def runtime_safe(self) -> SubclassCreationMeta:
        """A copy that holds no tracing objects: no original subclass, no ``SymInt``.

        Symbolic sizes/strides become ``None`` (read from the flat list at run
        time); nested ints become ``-1`` (nested-tensor subclasses ignore them).
        Returns ``self`` when it is already runtime safe.
        """

        def safe(x: IntLike | None) -> int | None:
            if isinstance(x, torch.SymInt):
                return -1 if x.node.is_nested_int() else None
            return x

        attrs = {k: v.runtime_safe() if isinstance(v, SubclassCreationMeta) else v for k, v in self.attrs.items()}
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
        """Rebuild the subclass from the flat list ``leaves``.

        ``leaves`` is indexed by this meta's absolute slot indices. Opaque
        slots receive the very objects given; no copies are made. Every leaf
        is checked against its slot, as by :func:`unflatten_checked`.
        """
        result: torch.Tensor = unflatten_checked(leaves, self)
        return result


def _rebuild_subclass_meta(kwargs: dict[str, Any]) -> SubclassCreationMeta:
    return SubclassCreationMeta(**kwargs)


def iter_slots(meta: SlotMeta, prefix: str = "") -> Iterator[tuple[str, FlatMeta]]:
    """Yield ``(path, slot_meta)`` for every flat slot of ``meta``, in flat order.

    Paths are attribute paths relative to the object ``meta`` describes, joined
    to ``prefix``: with ``prefix="w"`` a nested opaque yields ``"w._inner._mesh"``.
    Symbolic size and stride slots yield paths such as ``"w.size()[0]"``.
    """
    if isinstance(meta, SubclassCreationMeta):
        for name, sub in meta.attrs.items():
            yield from iter_slots(sub, f"{prefix}.{name}" if prefix else name)
        if meta.included_subclass_symints:
            idx = meta.symint_start_idx
            for kind, dims in (("size", meta.size_placeholders), ("stride", meta.stride_placeholders)):
                for d in dims:
                    yield f"{prefix}.{kind}()[{d}]" if prefix else f"{kind}()[{d}]", SymIntMeta(idx, kind, d)  # type: ignore[arg-type]  # kind is one of the two literals
                    idx += 1
    elif isinstance(meta, (PlainTensorMeta, OpaqueMeta)):
        yield prefix, meta
    else:
        raise AssertionError(f"iter_slots: unexpected meta {meta!r}")


def iter_subclasses(meta: SlotMeta, prefix: str = "") -> Iterator[tuple[str, SubclassCreationMeta]]:
    """Yield ``(path, subclass_meta)`` for ``meta`` and every subclass nested in
    it, outermost first; paths as in :func:`iter_slots` (``""`` for the top level
    when ``prefix`` is empty). Plain tensors and opaques yield nothing."""
    if isinstance(meta, SubclassCreationMeta):
        yield prefix, meta
        for name, sub in meta.attrs.items():
            yield from iter_subclasses(sub, f"{prefix}.{name}" if prefix else name)


# ---------------------------------------------------------------- rebuilding


def bad_unflatten_type(cls: type, result: object, path: str, *, found: str | None = None) -> TypeError:
    """The error for a ``__tensor_unflatten__`` of ``cls`` that returned ``result``,
    which is not an instance of ``cls`` (``found``: how to name what it returned,
    when not by ``result``'s type)."""
    return OpaqueTypeError(
        f"{subject(cls)}.__tensor_unflatten__ (rebuilding {path!r}) returned "
        f"{found or describe_type(result)}, expected an instance of {cls.__qualname__}. Fix: "
        f"make {cls.__qualname__}.__tensor_unflatten__ return "
        f"{cls.__qualname__}(...) built from inner_tensors, the context and outer_size/"
        "outer_stride."
    )


def _fill_placeholders(meta: SubclassCreationMeta, leaves: Sequence[Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    it = iter(leaves[meta.symint_start_idx : meta.flat_tensor_start_idx + meta.arg_count])
    size = list(meta.outer_size)
    for d in meta.size_placeholders:
        size[d] = next(it)
    stride = list(meta.outer_stride)
    for d in meta.stride_placeholders:
        stride[d] = next(it)
    return tuple(size), tuple(stride)


def rebuild(meta: SlotMeta, leaves: Sequence[Any], *, is_runtime: bool, path: str = "x") -> Any:
    """Rebuild the value described by ``meta`` from the absolute slots of ``leaves``.

    The generic (not code-generated) path; used while tracing and for checked
    unflattening. Outer sizes come from the meta, or from ``leaves`` for
    symbolic placeholders when ``is_runtime``. A ``__tensor_unflatten__`` that
    returns anything but an instance of its class is refused.
    """
    if not isinstance(meta, SubclassCreationMeta):
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
        raise bad_unflatten_type(cls, result, path)
    if not is_runtime and meta.original_subclass is not None:
        torch._mirror_autograd_meta_to(meta.original_subclass, result)  # type: ignore[attr-defined]  # private C binding present on all supported torch
    return result


def _check_leaf(path: str, slot: FlatMeta, leaf: object, owner: str) -> None:
    if isinstance(slot, OpaqueMeta):
        if isinstance(leaf, torch.Tensor) or opaque_kind(leaf) != "reference":
            if not isinstance(leaf, torch.Tensor) and opaque_kind(leaf) is None and isinstance(leaf, slot.opaque_type):
                raise OpaqueTypeError(
                    f"unflatten of {owner}: slot {slot.unwrapped_idx} ({path!r}) holds a "
                    f"{qualified_name(type(leaf))}, which is not registered as a reference opaque in this "
                    "process. Fix: "
                    + import_fix(type(leaf), 'opaque_subclass.register_opaque({cls}, kind="reference")')
                    + " before rebuilding."
                )
            raise OpaqueTypeError(
                f"unflatten of {owner}: slot {slot.unwrapped_idx} ({path!r}) expects a "
                f"reference opaque of type {qualified_name(slot.opaque_type)}, got "
                f"{describe_type(leaf)}. Fix: pass leaves in the order flatten_subclass "
                "returned them."
            )
    elif isinstance(slot, PlainTensorMeta) and slot.attr is not None:
        if not isinstance(leaf, torch.Tensor):
            raise OpaqueTypeError(
                f"unflatten of {owner}: slot {slot.unwrapped_idx} ({path!r}) expects a "
                f"tensor, got {describe_type(leaf)}. Fix: pass leaves in the order "
                "flatten_subclass returned them."
            )


def unflatten_checked(leaves: Sequence[Any], spec: SlotMeta, *, name: str = "x") -> Any:
    """Rebuild a value from ``leaves`` and ``spec``, checking the leaf count and
    every leaf against its slot (tensor or opaque) first; errors name the
    subclass and the attribute path. Opaque leaves are placed as the very
    same objects."""
    if isinstance(spec, SubclassCreationMeta):
        start, width, owner = spec.flat_tensor_start_idx, spec.arg_count, subject(spec.subclass_type)
    elif isinstance(spec, (PlainTensorMeta, OpaqueMeta)):
        start, width, owner = spec.unwrapped_idx, 1, "a plain value"
    else:
        raise OpaqueTypeError(
            f"unflatten_subclass expects a spec from flatten_subclass, got {describe_type(spec)}. "
            "Fix: pass the second value returned by flatten_subclass (or a meta from "
            "create_subclass_meta)."
        )
    if len(leaves) != start + width:
        detail = ""
        if isinstance(spec, SubclassCreationMeta):
            detail = f" ({spec.num_tensors} tensors, {spec.num_opaques} opaques)"
        raise OpaqueValueError(
            f"unflatten of {owner}: the spec describes {width} leaves{detail} starting at "
            f"slot {start}, but {len(leaves)} leaves were given. Fix: pass exactly the "
            "leaves flatten_subclass returned for this spec (same subclass structure)."
        )
    for path, slot in iter_slots(spec, name):
        _check_leaf(path, slot, leaves[slot.unwrapped_idx], owner)
    return rebuild(spec, leaves, is_runtime=True, path=name)
