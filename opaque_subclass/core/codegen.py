"""Straight-line run-time wrap/unwrap functions generated from a subclass meta.

The run-time helpers run on every call of a compiled function, so for each
:class:`~opaque_subclass.core.spec.SubclassCreationMeta` we generate, once, a
Python function with every index, attribute name and type baked in. For a
subclass ``MeshTensor`` holding ``_data`` and ``_mesh`` the generated code is::

    def unwrap(x):
        if x.__class__ is not T0 and not isinstance(x, T0):
            bad_input(x)
        return (x._data, x._mesh)

    def wrap(flat):
        r0 = T0.__tensor_unflatten__({'_data': flat[0], '_mesh': flat[1]}, C0, S0, R0)
        if r0.__class__ is not T0 and not isinstance(r0, T0):
            bad_result(0, r0)
        return r0

Both follow the slot order of :func:`~opaque_subclass.core.spec.iter_slots`. The
generated source is logged at DEBUG level. Metas whose attribute names are
not Python identifiers fall back to the generic, data-driven path.
"""

from __future__ import annotations

import keyword
import logging
from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor

from opaque_subclass.core.errors import describe_type, qualified_name
from opaque_subclass.core.flatten import append_leaves, flat_width
from opaque_subclass.core.spec import (
    PlainTensorMeta,
    SubclassCreationMeta,
    SymIntMeta,
    bad_unflatten_type,
    iter_slots,
    rebuild,
)

__all__ = ["ArgumentsPlan", "compiled_unwrap", "compiled_wrap"]

log = logging.getLogger(__name__)


def _identifier(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def _exec(source: str, namespace: dict[str, Any], fn_name: str) -> Callable[..., Any]:
    log.debug("generated %s:\n%s", fn_name, source)
    code = compile(source, f"<opaque_subclass.core.codegen.{fn_name}>", "exec")
    exec(code, namespace)
    return namespace[fn_name]  # type: ignore[no-any-return]  # defined by the exec above


def _bad_input(meta: SubclassCreationMeta) -> Callable[[object, str], None]:
    def bad_input(x: object, name: str) -> None:
        raise TypeError(
            f"run-time unwrap expected a {qualified_name(meta.subclass_type)} at {name} (the type the "
            f"metadata was made from), got {describe_type(x)}. Fix: re-create the metadata "
            "for the new argument types (torch.compile recompiles on a type change)."
        )

    return bad_input


def _bad_leaf(meta: SubclassCreationMeta) -> Callable[[str, object], None]:
    def bad_leaf(path: str, value: object) -> None:
        raise TypeError(
            f"run-time unwrap of {qualified_name(meta.subclass_type)}: {path} is a tensor slot "
            f"(the metadata was made from a tensor there), got {describe_type(value)}. Fix: "
            f"give {path} a tensor, or re-create the metadata (create_subclass_meta) from "
            "arguments of the new structure."
        )

    return bad_leaf


def _slot_reads(
    meta: SubclassCreationMeta,
    root: str,
    append_symints: bool,
    tag: str,
    lines: list[str],
    shown: str | None = None,
    bad_leaf: str = "bad_leaf",
) -> list[str] | None:
    """The expressions reading ``meta``'s flat slots from ``root``, after adding to
    ``lines`` a type check of every tensor slot (one ``is`` test in the common
    case, so that an int or None in a tensor attribute raises instead of
    reaching the graph) that calls the generated code's ``bad_leaf`` function;
    error messages show ``root`` as ``shown``, or as the generated function's
    ``name`` argument when ``shown`` is ``None``. ``None`` when an attribute
    name is not an identifier."""
    exprs: list[str] = []
    for n, (path, slot) in enumerate(iter_slots(meta, root)):
        parts = path.split(".")
        if not all(_identifier(p) or p.endswith("]") for p in parts):
            return None
        if isinstance(slot, SymIntMeta):
            if append_symints:
                exprs.append(path)
            continue
        if isinstance(slot, PlainTensorMeta):
            local = f"{tag}_{n}"
            lines.append(f"    {local} = {path}")
            lines.append(f"    if {local}.__class__ is not Tensor and not isinstance({local}, Tensor):")
            suffix = path[len(root) :]
            where = repr(shown + suffix) if shown is not None else f"name + {suffix!r}"
            lines.append(f"        {bad_leaf}({where}, {local})")
            exprs.append(local)
        else:
            exprs.append(path)
    return exprs


def _unwrap_source(meta: SubclassCreationMeta, append_symints: bool) -> str | None:
    lines = [
        "def unwrap(x, name='x'):",
        "    if x.__class__ is not T0 and not isinstance(x, T0):",
        "        bad_input(x, name)",
    ]
    exprs = _slot_reads(meta, "x", append_symints, "v", lines)
    if exprs is None:
        return None
    body = ", ".join(exprs) + ("," if len(exprs) == 1 else "")
    return "\n".join(lines) + f"\n    return ({body})\n"


def compiled_unwrap(meta: SubclassCreationMeta, append_symints: bool) -> Callable[..., tuple[Any, ...]]:
    """``unwrap(x, name="x") -> leaves`` for a subclass instance described by
    ``meta``; errors name the instance ``name`` (``args[1]``, ``args[1]._data``).

    With ``append_symints`` (and a meta that includes symbolic sizes), the
    symbolic size/stride entries are included after each subclass's leaves.
    The attributes are read as the meta lists them; ``__tensor_flatten__`` is
    not called.
    """
    key = "unwrap+symints" if append_symints else "unwrap"
    fn = meta._compiled.get(key)
    if fn is not None:
        return fn  # type: ignore[no-any-return]  # cache holds what we stored
    source = _unwrap_source(meta, append_symints)
    if source is None:

        def fn(x: Any, name: str = "x") -> tuple[Any, ...]:
            out: list[Any] = []
            append_leaves(x, out, name)
            return tuple(out)

    else:
        namespace = {
            "T0": meta.subclass_type,
            "Tensor": Tensor,
            "bad_input": _bad_input(meta),
            "bad_leaf": _bad_leaf(meta),
        }
        fn = _exec(source, namespace, "unwrap")
    meta._compiled[key] = fn
    return fn


class _WrapEmitter:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.namespace: dict[str, Any] = {}
        self.metas: list[tuple[SubclassCreationMeta, str]] = []

    def const(self, prefix: str, value: object) -> str:
        name = f"{prefix}{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def outer(
        self, meta: SubclassCreationMeta, values: tuple[Any, ...], placeholders: tuple[int, ...], first: int
    ) -> tuple[str, int]:
        if not (meta.included_subclass_symints and placeholders):
            return self.const("S", values), first
        items = []
        idx = first
        for d, v in enumerate(values):
            if d in placeholders:
                items.append(f"flat[{idx}]")
                idx += 1
            else:
                items.append(repr(int(v)))
        return "(" + ", ".join(items) + ",)", idx

    def emit(self, meta: SubclassCreationMeta, path: str) -> str | None:
        inner: list[str] = []
        for name, sub in meta.attrs.items():
            if isinstance(sub, SubclassCreationMeta):
                expr = self.emit(sub, f"{path}.{name}")
                if expr is None:
                    return None
            elif isinstance(sub, PlainTensorMeta):
                expr = f"t{sub.unwrapped_idx}"
                self.namespace.setdefault("Tensor", Tensor)
                self.namespace.setdefault("bad_slot", _bad_slot)
                self.lines.append(f"    {expr} = flat[{sub.unwrapped_idx}]")
                self.lines.append(f"    if {expr}.__class__ is not Tensor and not isinstance({expr}, Tensor):")
                owner = qualified_name(meta.subclass_type)
                self.lines.append(f"        bad_slot({sub.unwrapped_idx}, {owner!r}, {path + '.' + name!r}, {expr})")
            else:
                expr = f"flat[{sub.unwrapped_idx}]"
            inner.append(f"{name!r}: {expr}")
        for v in (*meta.outer_size, *meta.outer_stride):
            if v is not None and not isinstance(v, int):
                if meta.included_subclass_symints:
                    continue
                return None
        size, nxt = self.outer(meta, meta.outer_size, meta.size_placeholders, meta.symint_start_idx)
        stride, _ = self.outer(meta, meta.outer_stride, meta.stride_placeholders, nxt)
        n = len(self.metas)
        self.metas.append((meta, path))
        t = self.const("T", meta.subclass_type)
        c = self.const("C", meta.meta)
        self.lines.append(f"    r{n} = {t}.__tensor_unflatten__({{{', '.join(inner)}}}, {c}, {size}, {stride})")
        self.lines.append(f"    if r{n}.__class__ is not {t} and not isinstance(r{n}, {t}):")
        self.lines.append(f"        bad_result({n}, r{n})")
        return f"r{n}"


def compiled_wrap(meta: SubclassCreationMeta) -> Callable[[Sequence[Any]], Any]:
    """``wrap(flat) -> subclass`` rebuilding ``meta``'s subclass at run time.

    Reads the absolute slots of ``meta`` from ``flat``; symbolic sizes are read
    from their slots when the meta includes them.
    """
    fn = meta._compiled.get("wrap")
    if fn is not None:
        return fn  # type: ignore[no-any-return]  # cache holds what we stored
    emitter = _WrapEmitter()
    root = emitter.emit(meta, "x")
    if root is None:

        def fn(flat: Sequence[Any]) -> Any:
            return rebuild(meta, flat, is_runtime=True)

    else:
        metas = emitter.metas

        def bad_result(n: int, result: object) -> None:
            m, path = metas[n]
            raise bad_unflatten_type(m.subclass_type, result, path)

        emitter.namespace["bad_result"] = bad_result
        source = "def wrap(flat):\n" + "\n".join(emitter.lines) + f"\n    return {root}\n"
        fn = _exec(source, emitter.namespace, "wrap")
    meta._compiled["wrap"] = fn
    return fn


class ArgumentsPlan:
    """Generated unwrap and wrap for a whole list of metas: one function call per
    list instead of one per argument.

    ``unwrap(args)`` returns the flat leaves of all arguments (symbolic sizes
    included when built with ``append_symints``); ``wrap(flat)`` returns one value
    per meta, reading exactly :attr:`width` leading slots of ``flat``. Metas
    whose attribute names are not identifiers make the plan fall back to the
    per-subclass functions.
    """

    __slots__ = ("_unwrap", "_unwrap_symints", "_wrap", "metas", "width")

    def __init__(self, metas: Sequence[Any]) -> None:
        self.metas = tuple(metas)
        self.width = flat_width(self.metas)
        self._unwrap: Callable[[Sequence[Any]], list[Any]] | None = None
        self._unwrap_symints: Callable[[Sequence[Any]], list[Any]] | None = None
        self._wrap: Callable[[Sequence[Any]], tuple[Any, ...]] | None = None

    def unwrap(self, args: Sequence[Any], append_symints: bool = False) -> list[Any]:
        return self.unwrap_function(append_symints)(args)

    def wrap(self, flat: Sequence[Any]) -> tuple[Any, ...]:
        return self.wrap_function()(flat)

    def unwrap_function(self, append_symints: bool = False) -> Callable[[Sequence[Any]], list[Any]]:
        """The generated ``unwrap(args) -> flat`` (built on first use)."""
        fn = self._unwrap_symints if append_symints else self._unwrap
        return fn if fn is not None else self._build_unwrap(append_symints)

    def wrap_function(self) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
        """The generated ``wrap(flat) -> values`` (built on first use)."""
        return self._wrap if self._wrap is not None else self._build_wrap()

    def _build_unwrap(self, append_symints: bool) -> Callable[[Sequence[Any]], list[Any]]:
        namespace: dict[str, Any] = {"bad_count": _bad_count(len(self.metas)), "Tensor": Tensor}
        lines = ["def unwrap(args):", f"    if len(args) != {len(self.metas)}:", "        bad_count(args)"]
        exprs: list[str] = []
        for i, meta in enumerate(self.metas):
            lines.append(f"    a{i} = args[{i}]")
            if not isinstance(meta, SubclassCreationMeta):
                exprs.append(f"a{i}")
                continue
            source = _unwrap_source(meta, append_symints)
            if source is None:
                namespace[f"U{i}"] = compiled_unwrap(meta, append_symints)
                exprs.append(f"*U{i}(a{i}, 'args[{i}]')")
                continue
            namespace[f"T{i}"] = meta.subclass_type
            namespace[f"B{i}"] = _bad_input(meta)
            namespace[f"L{i}"] = _bad_leaf(meta)
            lines.append(f"    if a{i}.__class__ is not T{i} and not isinstance(a{i}, T{i}):")
            lines.append(f"        B{i}(a{i}, 'args[{i}]')")
            reads = _slot_reads(meta, f"a{i}", append_symints, f"v{i}", lines, shown=f"args[{i}]", bad_leaf=f"L{i}")
            if reads is None:  # _unwrap_source above accepted these names
                raise AssertionError(f"unreadable attribute names in {meta!r}")
            exprs.extend(reads)
        lines.append(f"    return [{', '.join(exprs)}]")
        fn = _exec("\n".join(lines) + "\n", namespace, "unwrap")
        if append_symints:
            self._unwrap_symints = fn
        else:
            self._unwrap = fn
        return fn

    def _build_wrap(self) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
        emitter = _WrapEmitter()
        exprs: list[str] = []
        for i, meta in enumerate(self.metas):
            if not isinstance(meta, SubclassCreationMeta):
                exprs.append(f"flat[{meta.unwrapped_idx}]")
                continue
            root = emitter.emit(meta, f"args[{i}]")
            if root is None:
                name = emitter.const("W", compiled_wrap(meta))
                root = f"{name}(flat)"
            exprs.append(root)
        metas = emitter.metas

        def bad_result(n: int, result: object) -> None:
            m, path = metas[n]
            raise bad_unflatten_type(m.subclass_type, result, path)

        emitter.namespace["bad_result"] = bad_result
        body = ", ".join(exprs) + ("," if len(exprs) == 1 else "")
        source = "def wrap(flat):\n" + "\n".join(emitter.lines) + f"\n    return ({body})\n"
        self._wrap = _exec(source, emitter.namespace, "wrap")
        return self._wrap


def _bad_slot(idx: int, owner: str, path: str, value: object) -> None:
    raise TypeError(
        f"run-time wrap of {owner}: flat slot {idx} rebuilds the tensor attribute {path}, got "
        f"{describe_type(value)}. Fix: pass the flat values in the order the metadata "
        "describes (the order unwrap_tensor_subclasses returns), or re-create the metadata "
        "(create_subclass_meta) for the new structure."
    )


def _bad_count(expected: int) -> Callable[[Sequence[Any]], None]:
    def bad_count(args: Sequence[Any]) -> None:
        raise TypeError(
            f"run-time unwrap expected {expected} arguments (the metadata describes {expected}), "
            f"got {len(args)}. Fix: re-create the metadata for these arguments."
        )

    return bad_count
