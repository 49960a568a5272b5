"""Straight-line run-time wrap/unwrap functions generated from a subclass meta.

The run-time helpers run on every call of a compiled function, so for each
:class:`~opaque_subclass.core.spec.SubclassLayout` a Python function with every
index, attribute name and type baked in is generated once. For ``MeshTensor``
holding ``_data`` and ``_mesh``::

    def unwrap(x):
        if x.__class__ is not T0 and not isinstance(x, T0):
            bad_input(x)
        return (x._data, x._mesh)

    def wrap(flat):
        r0 = T0.__tensor_unflatten__({'_data': flat[0], '_mesh': flat[1]}, C0, S0, R0)
        if r0.__class__ is not T0 and not isinstance(r0, T0):
            bad_result(0, r0)
        return r0

Both follow the slot order of :func:`~opaque_subclass.core.spec.iter_slots`; the
source is logged at DEBUG level. Metas whose attribute names are not
identifiers fall back to the generic, data-driven path.
"""

from __future__ import annotations

import keyword
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from opaque_subclass.core import messages
from opaque_subclass.core.errors import OpaqueAttributeError, qualified_name, subject
from opaque_subclass.core.flatten import append_leaves, flat_width
from opaque_subclass.core.registry import opaque_kind, opaque_type_of
from opaque_subclass.core.spec import (
    Layout,
    OpaqueSlot,
    SubclassLayout,
    SymIntSlot,
    TensorSlot,
    _check_leaf,
    iter_slots,
    iter_subclasses,
    rebuild,
)
from opaque_subclass.core.walk import read_level

__all__ = ["DEFAULT_CHECKS", "ArgumentsPlan", "RuntimeChecks", "check_structure", "compiled_unwrap", "compiled_wrap"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RuntimeChecks:
    """The checks a generated function makes: a parameter of its generation and part of its
    per-meta cache key. Tensor slots are always checked. See docs/core.md, "Run-time checks".

    Attributes
    ----------
    names
        The API's unwrap compares the names each level's ``__tensor_flatten__`` lists with the
        metadata's (a changed list would otherwise be read at the old names: a stale attribute).
    opaque_slots
        What an opaque slot holds is a registered reference opaque (unwrap and wrap).
    """

    names: bool = True
    opaque_slots: bool = True


#: The checks the library's run-time helpers make.
DEFAULT_CHECKS = RuntimeChecks()


def _cache_key(kind: str, checks: RuntimeChecks) -> str | tuple[str, RuntimeChecks]:
    """A generated function's key in its meta's cache: the bare kind for the default checks
    (what the run-time helpers look up per call), else with them."""
    return kind if checks == DEFAULT_CHECKS else (kind, checks)


def _identifier(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def _exec(source: str, namespace: dict[str, Any], fn_name: str) -> Callable[..., Any]:
    log.debug("generated %s:\n%s", fn_name, source)
    code = compile(source, f"<opaque_subclass.core.codegen.{fn_name}>", "exec")
    exec(code, namespace)
    return namespace[fn_name]  # type: ignore[no-any-return]  # defined by the exec above


def _bad_input(meta: SubclassLayout) -> Callable[[object, str], None]:
    def bad_input(x: object, name: str) -> None:
        raise messages.unwrap_wrong_type(meta.subclass_type, name, x)

    return bad_input


def _bad_leaf(meta: SubclassLayout) -> Callable[[str, object], None]:
    def bad_leaf(path: str, value: object) -> None:
        raise messages.unwrap_slot_not_a_tensor(meta.subclass_type, path, value)

    return bad_leaf


def _is_reference(value: object) -> bool:
    """Whether ``value`` may fill an opaque slot: a registered reference opaque."""
    return not isinstance(value, Tensor) and opaque_kind(value) == "reference"


def _found(value: object) -> tuple[type, bool]:
    """The class of ``value``, found in an opaque slot, and whether it is a class to register (``value``
    is no tensor and its class is no opaque)."""
    found = opaque_type_of(value)
    return found, not isinstance(value, Tensor) and opaque_kind(found) is None


def _bad_opaque(meta: SubclassLayout) -> Callable[[str, object, type], None]:
    def bad_opaque(path: str, value: object, expected: type) -> None:
        raise messages.unwrap_slot_not_an_opaque(meta.subclass_type, path, value, expected, *_found(value))

    return bad_opaque


def _slot_reads(
    meta: SubclassLayout,
    root: str,
    append_symints: bool,
    tag: str,
    lines: list[str],
    shown: str | None = None,
    bad_leaf: str = "bad_leaf",
    namespace: dict[str, Any] | None = None,
    bad_opaque: str = "bad_opaque",
    check_opaques: bool = True,
) -> list[str] | None:
    """The expressions reading ``meta``'s flat slots from ``root``, or ``None`` when an attribute
    name is not an identifier. First adds to ``lines`` a type check of every tensor slot (one ``is``
    test, so an int or None raises instead of reaching the graph) calling ``bad_leaf``; with a
    ``namespace`` and ``check_opaques``, also of every opaque slot (an ``is`` test against the
    meta's type, else the registry) calling ``bad_opaque``. Errors show ``root`` as ``shown``, or
    as the generated function's ``name`` argument when ``shown`` is ``None``."""
    exprs: list[str] = []
    check_opaques = namespace is not None and check_opaques
    for n, (path, slot) in enumerate(iter_slots(meta, root)):
        parts = path.split(".")
        if not all(_identifier(p) or p.endswith("]") for p in parts):
            return None
        if isinstance(slot, SymIntSlot):
            if append_symints:
                exprs.append(path)
            continue
        suffix = path[len(root) :]
        where = repr(shown + suffix) if shown is not None else f"name + {suffix!r}"
        if isinstance(slot, TensorSlot):
            local = f"{tag}_{n}"
            lines.append(f"    {local} = {path}")
            lines.append(f"    if {local}.__class__ is not Tensor and not isinstance({local}, Tensor):")
            lines.append(f"        {bad_leaf}({where}, {local})")
            exprs.append(local)
        elif check_opaques and isinstance(slot, OpaqueSlot) and slot.opaque_type is not object:
            assert namespace is not None  # check_opaques says so
            local, kind = f"{tag}_{n}", f"{tag}_O{n}"
            namespace[kind] = slot.opaque_type
            namespace.setdefault("is_reference", _is_reference)
            lines.append(f"    {local} = {path}")
            lines.append(f"    if {local}.__class__ is not {kind} and not is_reference({local}):")
            lines.append(f"        {bad_opaque}({where}, {local}, {kind})")
            exprs.append(local)
        else:
            exprs.append(path)
    return exprs


def _unwrap_source(
    meta: SubclassLayout, append_symints: bool, namespace: dict[str, Any], checks: RuntimeChecks
) -> str | None:
    """The API's unwrap: the argument's type, then (``checks.names``) each level's type and flatten
    names, then the slots; an ``AttributeError`` (a deleted attribute) goes to :func:`check_structure`."""
    lines = ["    if x.__class__ is not T0 and not isinstance(x, T0):", "        bad_input(x, name)"]
    body: list[str] = []
    if checks.names:
        for k, (suffix, level) in enumerate(iter_subclasses(meta, "")):
            if not all(_identifier(p) for p in suffix.split(".") if suffix):
                return None
            expr = "x"
            if k:
                expr = f"s{k}"
                namespace[f"T{k}"] = level.subclass_type
                body.append(f"    {expr} = x.{suffix}")
                body.append(f"    if {expr}.__class__ is not T{k} and not isinstance({expr}, T{k}):")
                body.append("        structure_error(x, name)")
            names = list(level.attrs)
            namespace[f"N{k}"], namespace[f"M{k}"] = names, tuple(names)
            body.append(f"    n{k} = {expr}.__tensor_flatten__()[0]")
            body.append(f"    if n{k} != N{k} and n{k} != M{k}:")
            body.append("        structure_error(x, name)")
    exprs = _slot_reads(meta, "x", append_symints, "v", body, namespace=namespace, check_opaques=checks.opaque_slots)
    if exprs is None:
        return None
    result = ", ".join(exprs) + ("," if len(exprs) == 1 else "")
    if checks.names:
        # zero cost unless raised: a deleted attribute becomes the named error
        body = [
            "    try:",
            *("    " + line for line in body),
            "    except AttributeError:",
            "        structure_error(x, name)",
            "        raise",
        ]
    return "\n".join(["def unwrap(x, name='x'):", *lines, *body]) + f"\n    return ({result})\n"


def compiled_unwrap(
    meta: SubclassLayout, append_symints: bool, checks: RuntimeChecks = DEFAULT_CHECKS
) -> Callable[..., tuple[Any, ...]]:
    """``unwrap(x, name="x") -> leaves`` for a subclass instance described by ``meta``; errors name
    the instance ``name`` (``args[1]``, ``args[1]._data``).

    With ``append_symints`` (and a meta including symbolic sizes), each subclass's size/stride
    entries follow its leaves. Attributes are read as the meta lists them, after checking (see
    :class:`RuntimeChecks`) that each level's ``__tensor_flatten__`` still lists them: a changed
    list is an error. Generated once per meta and ``checks``.
    """
    key = _cache_key("unwrap+symints" if append_symints else "unwrap", checks)
    fn = meta._compiled.get(key)
    if fn is not None:
        return fn  # type: ignore[no-any-return]  # cache holds what we stored
    namespace: dict[str, Any] = {
        "T0": meta.subclass_type,
        "Tensor": Tensor,
        "bad_input": _bad_input(meta),
        "bad_leaf": _bad_leaf(meta),
        "bad_opaque": _bad_opaque(meta),
        "structure_error": _structure_error(meta),
    }
    source = _unwrap_source(meta, append_symints, namespace, checks)
    if source is None:

        def fn(x: Any, name: str = "x") -> tuple[Any, ...]:
            check_structure(meta, x, name)
            out: list[Any] = []
            append_leaves(x, out, name, symints=append_symints)
            return tuple(out)

    else:
        fn = _exec(source, namespace, "unwrap")
    meta._compiled[key] = fn
    return fn


class _WrapEmitter:
    def __init__(self, checked: bool = True) -> None:
        self.checked = checked
        self.lines: list[str] = []
        self.namespace: dict[str, Any] = {}
        self.metas: list[tuple[SubclassLayout, str]] = []

    def const(self, prefix: str, value: object) -> str:
        name = f"{prefix}{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def outer(
        self, meta: SubclassLayout, values: tuple[Any, ...], placeholders: tuple[int, ...], first: int
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

    def emit(self, meta: SubclassLayout, path: str) -> str | None:
        inner: list[str] = []
        for name, sub in meta.attrs.items():
            if isinstance(sub, SubclassLayout):
                expr = self.emit(sub, f"{path}.{name}")
                if expr is None:
                    return None
            elif isinstance(sub, TensorSlot):
                expr = f"t{sub.unwrapped_idx}"
                self.namespace.setdefault("Tensor", Tensor)
                self.namespace.setdefault("bad_slot", _bad_slot)
                self.lines.append(f"    {expr} = flat[{sub.unwrapped_idx}]")
                self.lines.append(f"    if {expr}.__class__ is not Tensor and not isinstance({expr}, Tensor):")
                owner = qualified_name(meta.subclass_type)
                self.lines.append(f"        bad_slot({sub.unwrapped_idx}, {owner!r}, {path + '.' + name!r}, {expr})")
            elif self.checked and isinstance(sub, OpaqueSlot) and sub.opaque_type is not object:
                expr = f"o{sub.unwrapped_idx}"
                kind = self.const("O", sub.opaque_type)
                self.namespace.setdefault("is_reference", _is_reference)
                self.namespace.setdefault("bad_opaque_slot", _bad_opaque_slot)
                self.lines.append(f"    {expr} = flat[{sub.unwrapped_idx}]")
                self.lines.append(f"    if {expr}.__class__ is not {kind} and not is_reference({expr}):")
                owner = qualified_name(meta.subclass_type)
                self.lines.append(
                    f"        bad_opaque_slot({sub.unwrapped_idx}, {owner!r}, {path + '.' + name!r}, {expr}, {kind})"
                )
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


def compiled_wrap(
    meta: SubclassLayout, *, checked: bool = True, checks: RuntimeChecks = DEFAULT_CHECKS
) -> Callable[[Sequence[Any]], Any]:
    """``wrap(flat) -> subclass`` rebuilding ``meta``'s subclass at run time from its absolute slots
    (symbolic sizes too, when the meta includes them).

    Every slot's value is checked (see :class:`RuntimeChecks`); ``checked=False`` skips the opaque
    slots, for a caller whose leaves were checked when stored and that runs inside compiled code,
    where an opaque's members (``__class__`` included) are off limits (the parametrization's
    rebuild). Generated once per meta, ``checked`` and ``checks``.
    """
    key = _cache_key("wrap" if checked else "wrap-unchecked", checks)
    fn = meta._compiled.get(key)
    if fn is not None:
        return fn  # type: ignore[no-any-return]  # cache holds what we stored
    emitter = _WrapEmitter(checked and checks.opaque_slots)
    root = emitter.emit(meta, "x")
    if root is None:
        owner = subject(meta.subclass_type)

        def fn(flat: Sequence[Any]) -> Any:
            if checked:
                for path, slot in iter_slots(meta, "x"):
                    if not isinstance(slot, SymIntSlot):
                        _check_leaf(path, slot, flat[slot.unwrapped_idx], owner)
            return rebuild(meta, flat, is_runtime=True)

    else:
        metas = emitter.metas

        def bad_result(n: int, result: object) -> None:
            m, path = metas[n]
            raise messages.unflatten_returned_wrong_type(m.subclass_type, result, path)

        emitter.namespace["bad_result"] = bad_result
        source = "def wrap(flat):\n" + "\n".join(emitter.lines) + f"\n    return {root}\n"
        fn = _exec(source, emitter.namespace, "wrap")
    meta._compiled[key] = fn
    return fn


class ArgumentsPlan:
    """Generated unwrap and wrap for a list of metas: one function call per list, not per argument.

    ``unwrap(args)`` returns all arguments' flat leaves (symbolic sizes included with
    ``append_symints``); ``wrap(flat)`` returns one value per meta from exactly :attr:`width`
    leading slots. Metas with non-identifier attribute names fall back to per-subclass functions.
    """

    __slots__ = ("_unwrap", "_unwrap_symints", "_wrap", "checks", "metas", "width")

    def __init__(self, metas: Sequence[Any], checks: RuntimeChecks = DEFAULT_CHECKS) -> None:
        self.metas = tuple(metas)
        self.checks = checks
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
            if not isinstance(meta, SubclassLayout):
                exprs.append(f"a{i}")
                continue
            if _unwrap_source(meta, append_symints, {}, self.checks) is None:
                namespace[f"U{i}"] = compiled_unwrap(meta, append_symints, self.checks)
                exprs.append(f"*U{i}(a{i}, 'args[{i}]')")
                continue
            namespace[f"T{i}"] = meta.subclass_type
            namespace[f"B{i}"] = _bad_input(meta)
            namespace[f"L{i}"] = _bad_leaf(meta)
            namespace[f"P{i}"] = _bad_opaque(meta)
            lines.append(f"    if a{i}.__class__ is not T{i} and not isinstance(a{i}, T{i}):")
            lines.append(f"        B{i}(a{i}, 'args[{i}]')")
            reads = _slot_reads(
                meta,
                f"a{i}",
                append_symints,
                f"v{i}",
                lines,
                shown=f"args[{i}]",
                bad_leaf=f"L{i}",
                namespace=namespace,
                bad_opaque=f"P{i}",
                check_opaques=self.checks.opaque_slots,
            )
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
        emitter = _WrapEmitter(self.checks.opaque_slots)
        exprs: list[str] = []
        for i, meta in enumerate(self.metas):
            if not isinstance(meta, SubclassLayout):
                exprs.append(f"flat[{meta.unwrapped_idx}]")
                continue
            root = emitter.emit(meta, f"args[{i}]")
            if root is None:
                name = emitter.const("W", compiled_wrap(meta, checks=self.checks))
                root = f"{name}(flat)"
            exprs.append(root)
        metas = emitter.metas

        def bad_result(n: int, result: object) -> None:
            m, path = metas[n]
            raise messages.unflatten_returned_wrong_type(m.subclass_type, result, path)

        emitter.namespace["bad_result"] = bad_result
        body = ", ".join(exprs) + ("," if len(exprs) == 1 else "")
        source = "def wrap(flat):\n" + "\n".join(emitter.lines) + f"\n    return ({body})\n"
        self._wrap = _exec(source, emitter.namespace, "wrap")
        return self._wrap


def _bad_slot(idx: int, owner: str, path: str, value: object) -> None:
    raise messages.wrap_slot_not_a_tensor(idx, owner, path, value)


def _bad_count(expected: int) -> Callable[[Sequence[Any]], None]:
    def bad_count(args: Sequence[Any]) -> None:
        raise messages.unwrap_count(expected, len(args))

    return bad_count


def _bad_opaque_slot(idx: int, owner: str, path: str, value: object, expected: type) -> None:
    raise messages.wrap_slot_not_an_opaque(idx, owner, path, value, expected, *_found(value))


def _structure_error(meta: SubclassLayout) -> Callable[[object, str], None]:
    """The generated unwrap's diagnosis of an argument not shaped like ``meta``: :func:`check_structure`
    raises (a return means it matches after all, e.g. a tuple of names where the metadata has a list)."""

    def structure_error(x: object, name: str) -> None:
        check_structure(meta, x, name)

    return structure_error


def check_structure(meta: SubclassLayout, x: object, path: str = "x") -> None:
    """The slow path behind the generated unwrap: check that live ``x`` (at ``path``) has ``meta``'s
    structure level by level (type, the names ``__tensor_flatten__`` lists now, and what each attribute
    holds: a tensor, a nested subclass of the meta's type, or a registered reference opaque).

    Raises :class:`~opaque_subclass.core.errors.OpaqueAttributeError` for a listed attribute the
    instance lacks (``del x._mesh``), else :class:`~opaque_subclass.core.errors.OpaqueTypeError`,
    naming the subclass, path, what was found and the fix."""
    cls = meta.subclass_type
    if x.__class__ is not cls and not isinstance(x, cls):
        _bad_input(meta)(x, path)
    try:
        level = read_level(x, path, strict=False)  # type: ignore[arg-type]  # a subclass of cls: a tensor
    except OpaqueAttributeError:
        listed = list(x.__tensor_flatten__()[0])  # type: ignore[attr-defined]  # a wrapper subclass
        gone = [n for n in listed if n in meta.attrs and not hasattr(x, n)]
        if listed != list(meta.attrs) or not gone:
            raise
        held_type, opaque = _held(meta.attrs[gone[0]])
        raise messages.unwrap_attribute_missing(cls, type(x), path, gone[0], held_type, opaque) from None
    if list(level.names) != list(meta.attrs):
        raise messages.unwrap_names_changed(cls, path, level.attrs, list(meta.attrs))
    for a, sub in zip(level.attrs, meta.attrs.values(), strict=True):
        if isinstance(sub, SubclassLayout):
            check_structure(sub, a.value, a.path)
        elif isinstance(sub, OpaqueSlot):
            if a.kind != "opaque":
                _bad_opaque(meta)(a.path, a.value, sub.opaque_type)
        elif a.kind not in ("tensor",):
            if a.kind == "subclass":
                raise messages.unwrap_nested_where_tensor(cls, a.path, a.value)
            _bad_leaf(meta)(a.path, a.value)


def _held(sub: Layout) -> tuple[type | None, bool]:
    """The class the metadata ``sub`` was made from (``None`` for a tensor), and whether it is an opaque."""
    if isinstance(sub, OpaqueSlot):
        return sub.opaque_type, True
    if isinstance(sub, SubclassLayout):
        return sub.subclass_type, False
    return None, False
