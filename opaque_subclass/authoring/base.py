"""``OpaqueSubclass``: declare inner tensors, opaque attributes and metadata;
get a correct, compile-ready wrapper subclass.

Example::

    class MeshTensor(OpaqueSubclass):
        tensor_attrs = ("_data",)
        opaque_attrs = {"_mesh": Mesh}
        meta_attrs = ("_tag",)

    x = MeshTensor(torch.randn(4), Mesh(), "t")

The class gets ``__tensor_flatten__`` (tensors then opaques, metadata in the
context), ``__tensor_unflatten__``, a ``__repr__`` that never reads tensor
data, a per-class op table (:meth:`OpaqueSubclass.implements`) and a default
``__torch_dispatch__`` (see :mod:`opaque_subclass.authoring.dispatch`). Declarations are
checked when the class statement runs, not on first use (only the registration
of opaque classes may be left to the first instance, with
``register_opaques=True``).
"""

from __future__ import annotations

import dataclasses
import difflib
import keyword
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch

from opaque_subclass.authoring.dispatch import dispatch
from opaque_subclass.core.errors import (
    OpaqueSubclassError,
    OpaqueTypeError,
    OpaqueValueError,
    describe_type,
    import_fix,
    qualified_name,
    subject,
)
from opaque_subclass.core.registry import (
    is_torch_handled_type,
    is_torch_own_opaque_type,
    opaque_kind,
    opaque_type_of,
    register_opaque,
)
from opaque_subclass.core.stable_hash import stable_subclass_hash

__all__ = ["OpaqueAttr", "OpaqueSubclass"]


# Attributes of torch.Tensor a declaration may not shadow (data, grad, shape, ...).
_TENSOR_NAMES = frozenset(dir(torch.Tensor))


def _declaration_error(cls: type, message: str) -> TypeError:
    return OpaqueTypeError(f"{subject(cls)}: {message}")


@dataclasses.dataclass(frozen=True)
class OpaqueAttr:
    """An ``opaque_attrs`` entry that also says how its class is registered:
    ``opaque_attrs = {"_gauge": OpaqueAttr(Gauge, members={"scale": Member.USE_REAL})}``.

    The options are :func:`opaque_subclass.register_opaque`'s (``members``,
    ``guard``, ``hoist``, ``reconstruct``), with the same checks and errors. A
    class nobody registered yet is registered with them when the class
    statement runs (with ``register_opaques=True``: when the first instance
    is built); a class registered already must have been registered with the
    same options (otherwise the error says how to make them agree).
    """

    cls: type
    members: Mapping[str, Any] | None = None
    guard: Callable[[Any], Any] | None = None
    hoist: bool = False
    reconstruct: Callable[..., Any] | None = None

    def options(self) -> dict[str, Any]:
        """The keyword arguments for ``register_opaque``."""
        given = {"members": self.members, "guard": self.guard, "reconstruct": self.reconstruct}
        return {k: v for k, v in given.items() if v is not None} | ({"hoist": True} if self.hoist else {})


def _register_declared(cls: type, name: str, opaque_cls: type, options: dict[str, Any]) -> None:
    """``register_opaque`` for an ``OpaqueAttr`` of ``cls``: its errors keep their
    type and say which declaration they come from."""
    try:
        register_opaque(opaque_cls, **options)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{subject(cls)}: opaque_attrs[{name!r}]: {e}") from e


# Classes declared with ``register_opaques=True`` whose opaque classes are still
# to be registered (on the first instance), kept here rather than on the class,
# with the options of their ``OpaqueAttr`` declarations.
_PENDING: dict[type, tuple[type, ...]] = {}
_PENDING_OPTIONS: dict[type, dict[type, dict[str, Any]]] = {}
_PENDING_LOCK = threading.Lock()


def _register_pending(cls: type) -> None:
    if torch.compiler.is_compiling():
        raise OpaqueTypeError(
            f"{subject(cls)}: its first instance is built inside torch.compile, where its opaque "
            f"classes ({', '.join(qualified_name(c) for c in _PENDING.get(cls, ()))}) cannot be registered. "
            f"Fix: build one {cls.__qualname__} before compiling, or register them first: "
            + "; ".join(
                import_fix(c, 'opaque_subclass.register_opaque({cls}, kind="reference")') for c in _PENDING.get(cls, ())
            )
        )
    with _PENDING_LOCK:
        for opaque_cls in _PENDING.get(cls, ()):
            kind = opaque_kind(opaque_cls)
            if kind == "value":
                raise OpaqueTypeError(
                    f"{subject(cls)}: {qualified_name(opaque_cls)} was registered as a value-type opaque "
                    "after the class was declared; its opaque_attrs need a reference opaque. Fix: register "
                    'it with kind="reference" (before any other registration), or declare the attribute '
                    "in meta_attrs."
                )
            options = _PENDING_OPTIONS.get(cls, {}).get(opaque_cls, {})
            if kind is None or options:
                register_opaque(opaque_cls, kind="reference", **options)
        _PENDING.pop(cls, None)
        _PENDING_OPTIONS.pop(cls, None)


def _valid_name(name: object) -> str:
    """An attribute name made from ``name`` for a fix: ``'2d'`` -> ``'_2d'``."""
    text = re.sub(r"\W", "_", str(name)) or "_attr"
    if not text.startswith("_"):
        text = "_" + text
    return text if text.isidentifier() and text not in _TENSOR_NAMES else "_attr"


def _tuple_source(names: Sequence[object]) -> str:
    return f"({', '.join(map(repr, names))}{',' if len(names) == 1 else ''})"


def _check_names(cls: type, group: str, names: Sequence[str]) -> tuple[str, ...]:
    if isinstance(names, str):
        raise _declaration_error(
            cls, f"{group} must be a tuple of names, got the string {names!r}. Fix: `{group} = ({names!r},)`"
        )
    if not isinstance(names, (tuple, list)):
        try:  # the names of a set or dict, in a fixed order: the user's to check
            given = [n for n in names if isinstance(n, str)]
            fixed = _tuple_source(sorted(given) if isinstance(names, (set, frozenset)) else given)
        except Exception:
            fixed = '("_data",)'
        raise _declaration_error(
            cls,
            f"{group} must be a tuple of attribute names, got {describe_type(names)}, which has no fixed "
            f"order. Fix: a tuple in the order the flat slots should have, e.g. `{group} = {fixed}`",
        )
    for name in names:
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            fixed = _tuple_source([_valid_name(n) if n == name else n for n in names])
            raise _declaration_error(
                cls, f"{group} entry {name!r} is not a valid attribute name. Fix: `{group} = {fixed}`"
            )
        if name in _TENSOR_NAMES:
            raise _declaration_error(
                cls,
                f"{group} entry {name!r} would shadow torch.Tensor.{name}. Fix: rename it, e.g. '_{name}'.",
            )
    return tuple(names)


def _declared_subclasses() -> list[type]:
    """The user's declared subclasses of OpaqueSubclass (the library's own left
    out), in declaration order as far as ``__subclasses__`` keeps it."""
    found: list[type] = []
    stack = list(reversed(OpaqueSubclass.__subclasses__()))
    while stack:
        klass = stack.pop()
        if "_value_names" in klass.__dict__ and not klass.__module__.startswith("opaque_subclass"):
            found.append(klass)
        stack.extend(reversed(klass.__subclasses__()))
    return found


def _implements_on_base(ops: tuple[Any, ...]) -> str:
    """The message for ``OpaqueSubclass.implements(...)``, with a fix on the most
    recently declared subclass (a placeholder when there is none)."""
    try:
        declared = _declared_subclasses()
        name = declared[-1].__name__ if declared else "YourSubclass"
        shown = ", ".join(f"torch.ops.{op}" for op in ops) or "torch.ops.aten.mul.Tensor"
    except Exception:  # an error message must never crash
        name, shown = "YourSubclass", "torch.ops.aten.mul.Tensor"
    scope = f" (with {name} in scope)" if name != "YourSubclass" else " (YourSubclass: your OpaqueSubclass)"
    return (
        "OpaqueSubclass.implements() registers a rule for one subclass, not for the base class. "
        f"Fix: call it on your subclass, `import torch; {name}.implements({shown})`{scope}, as the "
        f"decorator @{name}.implements({shown})."
    )


class OpaqueSubclass(torch.Tensor):
    """Base class for wrapper tensor subclasses with opaque attributes.

    Class attributes to declare
    ---------------------------
    tensor_attrs
        Names of the inner tensors, at least one. The first one gives the
        default dtype, device, size and stride.
    opaque_attrs
        ``{name: class}`` of the opaque attributes; each class must be a
        registered *reference* opaque (:func:`opaque_subclass.register_opaque`),
        or, with the class keyword ``register_opaques=True``
        (``class T(OpaqueSubclass, register_opaques=True)``), a class nobody
        registered yet: it is then registered as a reference opaque when the
        first instance is built, not when the class statement runs (for a
        library that must not register anything on import). torch's own
        ``ProcessGroup`` and ``DeviceMesh``, which torch registers itself at a
        moment that differs by release, are registered when the class
        statement names them, on every release, as torch registers them.
    meta_attrs
        Names of plain metadata (hashable, compared with ``==``), kept in the
        flatten context: torch.compile specializes on it.

    Construction
    ------------
    ``Cls(*values, outer_size=None, outer_stride=None, requires_grad=False)``:
    ``values`` in declaration order (tensors, opaques, metadata), or by keyword.
    ``outer_size``/``outer_stride`` default to the first inner tensor's (a
    sharded tensor passes its global shape). ``requires_grad=True`` gives a
    leaf that requires grad. Inner tensors never require grad: when one given
    does (a parameter, an activation), the construction is differentiable with
    respect to it - gradients reaching the result flow back to it - and the
    stored inner tensor is detached (the same as :meth:`from_inner`).
    """

    tensor_attrs: ClassVar[tuple[str, ...]] = ()
    opaque_attrs: ClassVar[Mapping[str, type | OpaqueAttr]] = {}
    meta_attrs: ClassVar[tuple[str, ...]] = ()

    # Derived at class definition.
    _value_names: ClassVar[tuple[str, ...]] = ()
    _opaque_classes: ClassVar[Mapping[str, type]] = {}
    _op_table: ClassVar[dict[Any, Callable[..., Any]]] = {}

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]  # plain-tensor autograd semantics

    def __init_subclass__(cls, register_opaques: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._op_table = {}
        tensors = _check_names(cls, "tensor_attrs", cls.tensor_attrs)
        if not tensors:
            raise _declaration_error(
                cls,
                'declares no tensor_attrs; a wrapper subclass needs at least one inner tensor. Fix: tensor_attrs = ("_data",)',
            )
        if not isinstance(cls.opaque_attrs, Mapping):
            raise _declaration_error(
                cls,
                f"opaque_attrs must map names to opaque classes, got {describe_type(cls.opaque_attrs)}. "
                'Fix: opaque_attrs = {"_mesh": DeviceMesh}',
            )
        opaques = _check_names(cls, "opaque_attrs", tuple(cls.opaque_attrs))
        metas = _check_names(cls, "meta_attrs", cls.meta_attrs)
        seen: dict[str, str] = {}
        for group, names in (("tensor_attrs", tensors), ("opaque_attrs", opaques), ("meta_attrs", metas)):
            for name in names:
                if name in seen:
                    rest = _tuple_source([n for n in names if n != name])
                    raise _declaration_error(
                        cls,
                        f"{name!r} is declared in both {seen[name]} and {group}; each attribute belongs to one "
                        f"group. Fix: keep it in {seen[name]} only, `{group} = {rest}` (rename the other "
                        "attribute if both are meant)",
                    )
                seen[name] = group
        pending: list[type] = []
        pending_options: dict[type, dict[str, Any]] = {}
        declared: dict[str, type] = {}
        for name, opaque_cls in cls.opaque_attrs.items():
            options: dict[str, Any] | None = None
            if isinstance(opaque_cls, OpaqueAttr):
                options, opaque_cls = opaque_cls.options(), opaque_cls.cls
            declared[name] = opaque_cls
            if not isinstance(opaque_cls, type):
                shown = type(opaque_cls).__name__
                raise _declaration_error(
                    cls,
                    f"opaque_attrs[{name!r}] must be a class, got {describe_type(opaque_cls)} (an instance). "
                    f"Fix: name its class, `opaque_attrs = {{{name!r}: {shown}}}` (with {shown} in scope), and "
                    "pass the object to the constructor",
                )
            if issubclass(opaque_cls, torch.Tensor):
                raise _declaration_error(
                    cls,
                    f"opaque_attrs[{name!r}] is {qualified_name(opaque_cls)}, a tensor class. Fix: declare "
                    f"{name!r} in tensor_attrs",
                )
            if opaque_cls.__module__ == "builtins" or is_torch_handled_type(opaque_cls):
                raise _declaration_error(
                    cls,
                    f"opaque_attrs[{name!r}] is {qualified_name(opaque_cls)}, a plain value type that "
                    "cannot be registered as an opaque (torch.compile compares such values and "
                    f"specializes on them). Fix: declare {name!r} in meta_attrs (metadata, kept in the "
                    "flatten context), or wrap the value in a class registered with "
                    "opaque_subclass.register_opaque if its identity must travel as a graph input",
                )
            kind = opaque_kind(opaque_cls)
            if kind is None and is_torch_own_opaque_type(opaque_cls) and not register_opaques:
                # torch registers ProcessGroup and DeviceMesh itself, at a moment that
                # differs by release (torch 2.14+: ProcessGroup with torch; 2.12+: both
                # when torch.distributed.tensor is imported; 2.11: never): naming one
                # here registers it as torch's own registration would, on every release
                # (with register_opaques=True, when the first instance is built).
                _register_declared(cls, name, opaque_cls, options or {})
                kind = opaque_kind(opaque_cls)
            elif options is not None and (kind == "reference" or (kind is None and not register_opaques)):
                # Registered already: the same options or a named error. Not yet
                # registered: the declaration asks for it, with these options.
                _register_declared(cls, name, opaque_cls, options)
                kind = opaque_kind(opaque_cls)
            if kind == "value":
                raise _declaration_error(
                    cls,
                    f"opaque_attrs[{name!r}] is {qualified_name(opaque_cls)}, a value-type opaque. Value "
                    f"opaques are constants compiled into the graph. Fix: declare {name!r} in meta_attrs.",
                )
            if kind is None:
                if register_opaques:
                    pending.append(opaque_cls)
                    if options:
                        pending_options[opaque_cls] = options
                    continue
                raise _declaration_error(
                    cls,
                    f"opaque_attrs[{name!r}] is {qualified_name(opaque_cls)}, which is not a registered opaque "
                    "type. Fix: register it before defining the class: "
                    + import_fix(opaque_cls, 'opaque_subclass.register_opaque({cls}, kind="reference")')
                    + ", or declare the class with register_opaques=True to register it when the first "
                    "instance is built",
                )
        with _PENDING_LOCK:
            if pending:
                _PENDING[cls] = tuple(pending)
                _PENDING_OPTIONS[cls] = pending_options
            else:
                _PENDING.pop(cls, None)
                _PENDING_OPTIONS.pop(cls, None)
        cls.tensor_attrs, cls.meta_attrs = tensors, metas
        cls.opaque_attrs = cls._opaque_classes = declared  # OpaqueAttr entries read as their classes from here on
        cls._value_names = tensors + opaques + metas

    # ------------------------------------------------------------------ construction

    @staticmethod
    def __new__(
        cls,
        *values: Any,
        outer_size: Sequence[int] | None = None,
        outer_stride: Sequence[int] | None = None,
        requires_grad: bool = False,
        _trusted: bool = False,
        **named: Any,
    ) -> Any:
        if cls is OpaqueSubclass:
            raise OpaqueTypeError(
                "OpaqueSubclass is a base class and declares no attributes, so it cannot be built. Fix: "
                'declare a subclass, `class Scaled(OpaqueSubclass): tensor_attrs = ("_data",)`, and build '
                "that: Scaled(data) (add opaque_attrs and meta_attrs as needed)."
            )
        bound = cls._bind(values, named)
        # ``_trusted`` (private): a rebuild from flattened parts (unflatten, wrap_like,
        # a replayed exported constructor) stores the inner tensors as given.
        if not _trusted and torch.is_grad_enabled():
            differentiable = [n for n in cls.tensor_attrs if bound[n].requires_grad]
            if differentiable:
                if requires_grad:
                    raise OpaqueValueError(
                        f"{subject(cls)}: requires_grad=True asks for a leaf, but the inner tensor "
                        f"{differentiable[0]!r} requires grad, so the result would be computed from it. "
                        f"Fix: pass {differentiable[0]}=t.detach() for a leaf, or drop requires_grad=True "
                        "to stay differentiable with respect to t."
                    )
                others = {n: bound[n] for n in cls._value_names if n not in cls.tensor_attrs}
                tensors = [bound[n] for n in cls.tensor_attrs]
                return _FromInner.apply(cls, others, outer_size, outer_stride, *tensors)
        first = bound[cls.tensor_attrs[0]]
        size = tuple(first.shape) if outer_size is None else tuple(outer_size)
        if outer_stride is None:
            outer_stride = first.stride() if outer_size is None else _contiguous_strides(size)
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            size,
            strides=tuple(outer_stride),
            dtype=first.dtype,
            device=first.device,
            layout=first.layout,
            requires_grad=requires_grad,
        )
        for name, value in bound.items():
            object.__setattr__(r, name, value)
        return r

    def __init__(self, *values: Any, **kwargs: Any) -> None:
        # Everything happened in __new__. torch.export records this call (see
        # _make_init_exportable below) so that a subclass built inside an exported
        # program (for example by a parametrization) appears in the graph.
        pass

    @classmethod
    def _bind(cls, values: tuple[Any, ...], named: dict[str, Any]) -> dict[str, Any]:
        if _PENDING and cls in _PENDING:
            _register_pending(cls)
        names = cls._value_names
        if "_none" in named:  # metadata that is None, named apart in a recorded export call (see _recorded)
            named = {n: v for n, v in named.items() if n != "_none"} | dict.fromkeys(named["_none"])
        if len(values) > len(names):
            raise OpaqueTypeError(
                f"{subject(cls)}() takes {len(names)} values ({', '.join(names)}), got {len(values)}. Fix: "
                f"drop the last {len(values) - len(names)} value(s): pass one value per declared attribute, in "
                f"the order {', '.join(names)}"
            )
        bound = dict(zip(names, values, strict=False))
        for name, value in named.items():
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1) or difflib.get_close_matches(f"_{name}", names, n=1)
                fix = f"write {close[0]}= instead of {name}=" if close else "use one of the declared names"
                raise OpaqueTypeError(
                    f"{subject(cls)}() got an unexpected argument {name!r}; declared attributes are "
                    f"{', '.join(names)}. Fix: {fix}"
                )
            if name in bound:
                position = names.index(name) + 1
                raise OpaqueTypeError(
                    f"{subject(cls)}() got {name!r} both by position and by keyword. Fix: give it once: drop "
                    f"{name}= or pass only {position - 1} positional value(s)"
                )
            bound[name] = value
        missing = [n for n in names if n not in bound]
        if missing:
            raise OpaqueTypeError(
                f"{subject(cls)}() is missing {', '.join(map(repr, missing))}. Fix: pass "
                + ", ".join(f"{n}=..." for n in missing)
                + f" too (declared attributes, in order: {', '.join(names)})"
            )
        for name in cls.tensor_attrs:
            value = bound[name]
            if not isinstance(value, torch.Tensor):
                raise OpaqueTypeError(
                    f"{subject(cls)}.{name} must be a tensor (declared in tensor_attrs), got {describe_type(value)}. "
                    f"Fix: pass a tensor for {name}, e.g. {name}=torch.as_tensor(value) for a list or number"
                )
        for name, expected in cls._opaque_classes.items():
            value = bound[name]
            if not issubclass(opaque_type_of(value), expected):
                raise OpaqueTypeError(
                    f"{subject(cls)}.{name} must be a {qualified_name(expected)} (declared in "
                    f"opaque_attrs), got {describe_type(value)}. Fix: pass the {expected.__qualname__} "
                    "object itself."
                )
        return bound

    @classmethod
    def from_inner(
        cls,
        *values: Any,
        outer_size: Sequence[int] | None = None,
        outer_stride: Sequence[int] | None = None,
        **named: Any,
    ) -> Any:
        """Build an instance that is differentiable with respect to its inner tensors.

        Gradients flowing into the result flow back to the inner tensors given
        (as the matching inner tensors of the incoming gradient).
        """
        bound = cls._bind(values, named)
        tensors = [bound[n] for n in cls.tensor_attrs]
        others = {n: bound[n] for n in cls._value_names if n not in cls.tensor_attrs}
        return _FromInner.apply(cls, others, outer_size, outer_stride, *tensors)

    # ------------------------------------------------------------------ flatten protocol

    def __tensor_flatten__(self) -> tuple[list[str], tuple[Any, ...]]:
        cls = type(self)
        return [*cls.tensor_attrs, *cls.opaque_attrs], tuple(getattr(self, n) for n in cls.meta_attrs)

    @classmethod
    def __tensor_unflatten__(
        cls, inner: dict[str, Any], ctx: tuple[Any, ...], outer_size: Any, outer_stride: Any
    ) -> Any:
        named = {n: inner[n] for n in (*cls.tensor_attrs, *cls.opaque_attrs)}
        named.update(zip(cls.meta_attrs, ctx, strict=True))
        if torch.compiler.is_exporting() or torch.compiler.is_dynamo_compiling():
            # The full constructor call: torch.export records it (see __init__), and
            # Dynamo, tracing a rebuild in user code (a parametrization's), builds a
            # wrapper subclass only through the class call, never inside __new__.
            return cls._recorded(named, outer_size=outer_size, outer_stride=outer_stride)
        # Run time and AOT tracing: __new__ alone; __init__ only records for export.
        return cls.__new__(cls, outer_size=outer_size, outer_stride=outer_stride, _trusted=True, **named)

    def wrap_like(self, **tensors: torch.Tensor) -> Any:
        """A new instance with the given inner tensors and this instance's opaques
        and metadata; the default dispatch rule rewraps results with it.

        ``tensors`` must name every attribute of ``tensor_attrs``, each a tensor,
        and nothing else: opaques and metadata always come from ``self`` (an op
        rule that leaves an inner tensor unchanged passes the instance's own,
        ``_scale=x._scale``). Anything else raises
        :class:`~opaque_subclass.OpaqueSubclassError` naming the missing, extra
        or non-tensor entries, not ``TypeError``: inside a Python operator
        (``x * 2``) torch turns a ``TypeError`` into ``NotImplemented``, and the
        mistake would surface only as ``unsupported operand type(s)``.

        The default outer size and stride are the first inner tensor's; a
        subclass whose outer shape differs from its inner tensors' (a sharded
        tensor) overrides this to compute its own.
        """
        cls = type(self)
        if len(tensors) != len(cls.tensor_attrs) or not all(
            isinstance(tensors.get(name), torch.Tensor) for name in cls.tensor_attrs
        ):
            raise _wrap_like_error(cls, tensors)
        named: dict[str, Any] = dict(tensors)
        for name in (*cls.opaque_attrs, *cls.meta_attrs):
            named[name] = getattr(self, name)
        if torch.compiler.is_exporting():
            return cls._recorded(named)
        return cls.__new__(cls, _trusted=True, **named)

    @classmethod
    def _recorded(cls, named: dict[str, Any], **sizes: Any) -> Any:
        """``cls(..., _trusted=True)`` as torch.export records it (a ``flat_apply``
        of the constructor). The recorded arguments must be FX-graphable, which
        ``None`` is not: metadata that is ``None`` (a replicated
        ``ShardedTensor``'s ``_shard_dim``) travels as its name in ``_none``,
        which :meth:`_bind` turns back into ``None`` (so a subclass's own
        ``__new__`` that calls ``_bind`` needs nothing more)."""
        none = tuple(n for n in cls.meta_attrs if n in named and named[n] is None)
        if none:
            named = {n: v for n, v in named.items() if n not in none}
            return cls(_trusted=True, _none=none, **sizes, **named)
        return cls(_trusted=True, **sizes, **named)

    # Never reads tensor data: safe under fake tensors and tracing.
    def __repr__(self) -> str:  # type: ignore[override]  # Tensor's takes tensor_contents=, the data this never shows
        cls = type(self)
        parts = [f"shape={tuple(self.shape)}", f"dtype={self.dtype}"]
        for name in cls.opaque_attrs:
            parts.append(f"{name}={opaque_type_of(getattr(self, name, None)).__qualname__}")
        for name in cls.meta_attrs:
            parts.append(f"{name}={getattr(self, name, None)!r}")
        if self.requires_grad:
            parts.append("requires_grad=True")
        return f"{cls.__qualname__}({', '.join(parts)})"

    # ------------------------------------------------------------------ compile caches

    def _stable_hash_for_caching(self) -> str:
        """This input's part of the key of AOTAutograd's on-disk cache (torch >= 2.12).

        torch asks a subclass input for this hash when it builds the cache key
        of a compiled program (``AOTAutogradCachePickler`` in
        ``torch/_functorch/_aot_autograd/autograd_cache.py``). Without it torch
        warns ``<Class> does not implement _stable_hash_for_caching`` and hashes
        the flatten output itself (outer shape, ``requires_grad``, the context,
        each inner tensor's metadata, each opaque's class name). Measured on
        2.12 - 2.15: a program with static shapes is reused all the same, but
        one with symbolic sizes is never cached, because that hash pickles the
        sizes with plain ``pickle``, which fails on a ``SymInt`` (torch logs
        ``Bypassing autograd cache due to: Failed to pickle cache key``).
        torch 2.11 never asks (its key pickles each input whole, opaques by
        value); the library's 2.11 key asks for it instead
        (``opaque_subclass.fixes.autograd_cache.stable_subclass_inputs``).

        Hashed, for this instance and every subclass nested in it (in walk
        order, by attribute path): the qualified class name and the flatten
        context (the metadata torch.compile specializes on) of each subclass;
        the size, stride, dtype, device, layout, ``requires_grad`` and
        conj/neg/inference flags of each subclass and inner tensor (symbolic
        sizes as their symbols); the qualified class name of each opaque; and
        the library's version (its dispatch and rewrap code is traced into the
        program). Never an opaque's identity or value: an opaque is a graph
        input and one program serves every object of its class; which inputs
        share one opaque is keyed separately
        (:mod:`opaque_subclass.fixes.autograd_cache`). Nothing hashed
        depends on ``id()`` or ``hash()``, so every process computes the same
        key: a set or frozenset anywhere in a context is written with its
        elements sorted (its own order follows ``hash()``, which for strings
        differs per process). A context that cannot be pickled raises
        ``pickle.PicklingError``, ``TypeError`` or ``AttributeError``, on which
        torch bypasses its cache for the program.
        """
        return stable_subclass_hash(self)

    # ------------------------------------------------------------------ dispatch

    @classmethod
    def implements(cls, *ops: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register ``fn(func, args, kwargs)`` as this class's implementation of ``ops``.

        ``ops`` are ``OpOverload`` or ``OpOverloadPacket`` objects (a packet covers
        all its overloads). Subclasses inherit their bases' tables and may
        override entries.
        """
        if cls is OpaqueSubclass:
            raise OpaqueTypeError(_implements_on_base(ops))

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            for op in ops:
                cls._op_table[op] = fn
            return fn

        return register

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]  # Tensor declares its disabled default as a plain function
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:

        return dispatch(cls, func, args, kwargs or {})


def _make_init_exportable() -> None:
    """Mark ``OpaqueSubclass.__init__`` as a constructor torch.export may record
    (pre-dispatch export needs this for subclasses created while tracing) and
    keep Dynamo out of it, as torch documents for such constructors."""
    try:
        from torch._export.wrappers import mark_subclass_constructor_exportable_experimental
    except ImportError:  # pragma: no cover - every supported torch has it
        return
    from torch._compile import _disable_dynamo

    init = mark_subclass_constructor_exportable_experimental(OpaqueSubclass.__init__)
    OpaqueSubclass.__init__ = _disable_dynamo(init)  # type: ignore[method-assign]  # decorated once at import


_make_init_exportable()


def _wrap_like_error(cls: Any, tensors: Mapping[str, Any]) -> OpaqueSubclassError:
    """The error for ``wrap_like(**tensors)`` on ``cls`` with names other than
    exactly ``tensor_attrs``, or a value that is not a tensor."""
    missing = [n for n in cls.tensor_attrs if n not in tensors]
    problems = [f"missing {', '.join(map(repr, missing))}"] if missing else []
    for name, value in tensors.items():
        if name in cls.tensor_attrs:
            if not isinstance(value, torch.Tensor):
                problems.append(f"{name!r} is {describe_type(value)}, not a tensor")
        elif name in cls.opaque_attrs:
            problems.append(f"{name!r} is an opaque attribute (the result keeps the instance's)")
        elif name in cls.meta_attrs:
            problems.append(f"{name!r} is metadata (the result keeps the instance's)")
        else:
            problems.append(f"{name!r} is not an attribute of {cls.__qualname__}")
    given = ", ".join(f"{n}={describe_type(v)}" for n, v in tensors.items()) or "no arguments"
    fix = f"x.wrap_like({', '.join(f'{n}=x.{n}' for n in cls.tensor_attrs)})"
    return OpaqueSubclassError(
        f"{subject(cls)}.wrap_like() takes exactly the inner tensors of tensor_attrs "
        f"({', '.join(map(repr, cls.tensor_attrs))}), each a tensor; opaques and metadata come from "
        f"the instance. It got {given}: {'; '.join(problems)}. Fix: pass every inner tensor, the "
        f"instance's own where the op leaves it unchanged, e.g. `{fix}` with x the "
        f"{cls.__qualname__} (and the op's results in place of the tensors it computes). To change an "
        f"opaque or metadata, build a new {cls.__qualname__}(...) instead."
    )


def _contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    strides: list[int] = []
    running = 1
    for s in reversed(size):
        strides.append(running)
        running *= max(int(s), 1)
    return tuple(reversed(strides))


class _FromInner(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, cls: Any, others: dict[str, Any], outer_size: Any, outer_stride: Any, *tensors: torch.Tensor
    ) -> Any:
        named = dict(zip(cls.tensor_attrs, (t.detach() for t in tensors), strict=True))
        named.update(others)
        ctx.tensor_attrs = cls.tensor_attrs
        return cls(outer_size=outer_size, outer_stride=outer_stride, **named)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        grads = (
            tuple(getattr(grad, n) for n in ctx.tensor_attrs)
            if isinstance(grad, OpaqueSubclass)
            else (grad,) * len(ctx.tensor_attrs)
        )
        return (None, None, None, None, *grads)
