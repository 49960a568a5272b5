"""Straight-line run-time wrap/unwrap functions generated from a subclass meta.

The run-time helpers run on every call of a compiled function, so for each
:class:`~opaque_subclass.schema.SubclassCreationMeta` we generate, once, a
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

Both follow the slot order of :func:`~opaque_subclass.schema.iter_slots`. The
generated source is logged at DEBUG level. Metas whose attribute names are
not Python identifiers fall back to the generic, data-driven path.
"""

from __future__ import annotations

import keyword
import logging
from collections.abc import Callable, Sequence
from typing import Any

from .errors import describe_type, qualified_name
from .schema import SubclassCreationMeta, SymIntMeta, iter_slots

__all__ = ["compiled_unwrap", "compiled_wrap"]

log = logging.getLogger(__name__)


def _identifier(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def _exec(source: str, namespace: dict[str, Any], fn_name: str) -> Callable[..., Any]:
    log.debug("generated %s:\n%s", fn_name, source)
    code = compile(source, f"<opaque_subclass.codegen.{fn_name}>", "exec")
    exec(code, namespace)
    return namespace[fn_name]  # type: ignore[no-any-return]  # defined by the exec above


def _bad_input(meta: SubclassCreationMeta) -> Callable[[object], None]:
    def bad_input(x: object) -> None:
        raise TypeError(
            f"run-time unwrap expected a {qualified_name(meta.subclass_type)} (the type the "
            f"metadata was made from), got {describe_type(x)}. Fix: re-create the metadata "
            "for the new argument types (torch.compile recompiles on a type change)."
        )

    return bad_input


def _unwrap_source(meta: SubclassCreationMeta, append_symints: bool) -> str | None:
    exprs: list[str] = []
    for path, slot in iter_slots(meta, "x"):
        parts = path.split(".")
        if not all(_identifier(p) or p.endswith("]") for p in parts):
            return None
        if isinstance(slot, SymIntMeta) and not append_symints:
            continue
        exprs.append(path)
    body = ", ".join(exprs) + ("," if len(exprs) == 1 else "")
    return (
        "def unwrap(x):\n"
        "    if x.__class__ is not T0 and not isinstance(x, T0):\n"
        "        bad_input(x)\n"
        f"    return ({body})\n"
    )


def compiled_unwrap(meta: SubclassCreationMeta, append_symints: bool) -> Callable[[Any], tuple[Any, ...]]:
    """``unwrap(x) -> leaves`` for a subclass instance described by ``meta``.

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
        from .flatten import append_leaves

        def fn(x: Any) -> tuple[Any, ...]:
            out: list[Any] = []
            append_leaves(x, out)
            return tuple(out)

    else:
        fn = _exec(source, {"T0": meta.subclass_type, "bad_input": _bad_input(meta)}, "unwrap")
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

    def outer(self, meta: SubclassCreationMeta, values: tuple[Any, ...], placeholders: tuple[int, ...], first: int) -> tuple[str, int]:
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
        from .flatten import build

        def fn(flat: Sequence[Any]) -> Any:
            return build(meta, flat, is_runtime=True)

    else:
        from .flatten import _bad_unflatten_result

        metas = emitter.metas

        def bad_result(n: int, result: object) -> None:
            m, path = metas[n]
            raise _bad_unflatten_result(m, result, path)

        emitter.namespace["bad_result"] = bad_result
        source = "def wrap(flat):\n" + "\n".join(emitter.lines) + f"\n    return {root}\n"
        fn = _exec(source, emitter.namespace, "wrap")
    meta._compiled["wrap"] = fn
    return fn
