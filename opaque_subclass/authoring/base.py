"""``OpaqueSubclass``: declare inner tensors, opaque attributes and metadata;
get a correct, compile-ready wrapper subclass.

Example::

    class MeshTensor(OpaqueSubclass):
        tensor_attrs = ("_data",)
        opaque_attrs = {"_mesh": Mesh}
        meta_attrs = ("_tag",)

    x = MeshTensor(torch.randn(4), Mesh(), "t")

The class gets ``__tensor_flatten__`` (tensors then opaques, metadata in the
context), ``__tensor_unflatten__``, a ``__repr__`` that never reads tensor data,
a per-class op table (:meth:`OpaqueSubclass.implements`) and a default
``__torch_dispatch__`` (:mod:`opaque_subclass.authoring.dispatch`). Declarations
are checked when the class statement runs (only the registration of opaque
classes may wait for the first instance, with ``register_opaques=True``); their
error messages are built in :mod:`opaque_subclass.authoring.messages`.
"""

from __future__ import annotations

import dataclasses
import keyword
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch

from opaque_subclass.authoring import messages
from opaque_subclass.authoring.dispatch import dispatch
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


@dataclasses.dataclass(frozen=True)
class OpaqueAttr:
    """An ``opaque_attrs`` entry that also says how its class is registered:
    ``opaque_attrs = {"_gauge": OpaqueAttr(Gauge, members={"scale": Member.USE_REAL})}``.

    The options are :func:`opaque_subclass.register_opaque`'s, with its checks
    and errors. A class nobody registered yet is registered with them when the
    class statement runs (with ``register_opaques=True``: at the first instance);
    a class registered already must have been registered with the same options
    (otherwise the error says how to make them agree).
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
        raise messages.registration_failed(cls, name, e) from e


# Classes declared with ``register_opaques=True`` whose opaque classes are still
# to be registered (on the first instance), kept here rather than on the class,
# with the options of their ``OpaqueAttr`` declarations.
_PENDING: dict[type, tuple[type, ...]] = {}
_PENDING_OPTIONS: dict[type, dict[type, dict[str, Any]]] = {}
_PENDING_LOCK = threading.Lock()


def _register_pending(cls: type) -> None:
    if torch.compiler.is_compiling():
        raise messages.first_instance_compiling(cls, _PENDING.get(cls, ()))
    with _PENDING_LOCK:
        for opaque_cls in _PENDING.get(cls, ()):
            kind = opaque_kind(opaque_cls)
            if kind == "value":
                raise messages.registered_as_value_later(cls, opaque_cls)
            options = _PENDING_OPTIONS.get(cls, {}).get(opaque_cls, {})
            if kind is None or options:
                register_opaque(opaque_cls, kind="reference", **options)
        _PENDING.pop(cls, None)
        _PENDING_OPTIONS.pop(cls, None)


def _set_pending(cls: type, pending: list[type], options: dict[type, dict[str, Any]]) -> None:
    with _PENDING_LOCK:
        if pending:
            _PENDING[cls] = tuple(pending)
            _PENDING_OPTIONS[cls] = options
        else:
            _PENDING.pop(cls, None)
            _PENDING_OPTIONS.pop(cls, None)


def _check_names(cls: type, group: str, names: Sequence[str]) -> tuple[str, ...]:
    if isinstance(names, str):
        raise messages.names_as_string(cls, group, names)
    if not isinstance(names, (tuple, list)):
        raise messages.names_without_order(cls, group, names)
    for name in names:
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise messages.invalid_name(cls, group, name, names, _TENSOR_NAMES)
        if name in _TENSOR_NAMES:
            raise messages.shadows_tensor(cls, group, name)
    return tuple(names)


def _check_groups(cls: type[OpaqueSubclass]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The three groups of names, checked: valid, at least one tensor, none in two groups."""
    tensors = _check_names(cls, "tensor_attrs", cls.tensor_attrs)
    if not tensors:
        raise messages.no_tensor_attrs(cls)
    if not isinstance(cls.opaque_attrs, Mapping):
        raise messages.opaque_attrs_not_a_mapping(cls, cls.opaque_attrs)
    opaques = _check_names(cls, "opaque_attrs", tuple(cls.opaque_attrs))
    metas = _check_names(cls, "meta_attrs", cls.meta_attrs)
    seen: dict[str, str] = {}
    for group, names in (("tensor_attrs", tensors), ("opaque_attrs", opaques), ("meta_attrs", metas)):
        for name in names:
            if name in seen:
                raise messages.declared_twice(cls, name, seen[name], group, [n for n in names if n != name])
            seen[name] = group
    return tensors, opaques, metas


def _split(entry: type | OpaqueAttr) -> tuple[Any, dict[str, Any] | None]:
    """An ``opaque_attrs`` value as (its class, its registration options or ``None``)."""
    return (entry.cls, entry.options()) if isinstance(entry, OpaqueAttr) else (entry, None)


def _check_opaque(
    cls: type, name: str, opaque_cls: Any, options: dict[str, Any] | None, register_opaques: bool
) -> bool:
    """Check the class of ``opaque_attrs[name]``, registering it where the declaration
    asks; ``False`` when that waits for the first instance (``register_opaques=True``)."""
    if not isinstance(opaque_cls, type):
        raise messages.opaque_not_a_class(cls, name, opaque_cls)
    if issubclass(opaque_cls, torch.Tensor):
        raise messages.opaque_is_tensor_class(cls, name, opaque_cls)
    if opaque_cls.__module__ == "builtins" or is_torch_handled_type(opaque_cls):
        raise messages.opaque_is_plain_value(cls, name, opaque_cls)
    kind = opaque_kind(opaque_cls)
    if kind is None and is_torch_own_opaque_type(opaque_cls) and not register_opaques:
        # torch registers ProcessGroup and DeviceMesh itself, at a moment that differs by
        # release (2.14+: ProcessGroup on importing torch; 2.12+: both on importing
        # torch.distributed.tensor; 2.11: never). Naming one registers it as torch would,
        # on every release (with register_opaques=True: when the first instance is built).
        _register_declared(cls, name, opaque_cls, options or {})
        kind = opaque_kind(opaque_cls)
    elif options is not None and (kind == "reference" or (kind is None and not register_opaques)):
        # Registered already: the same options or a named error; not yet: registered with them.
        _register_declared(cls, name, opaque_cls, options)
        kind = opaque_kind(opaque_cls)
    if kind == "value":
        raise messages.opaque_is_value_opaque(cls, name, opaque_cls)
    if kind is None and not register_opaques:
        raise messages.opaque_not_registered(cls, name, opaque_cls)
    return kind is not None


class _FromInner(torch.autograd.Function):
    """A construction differentiable with respect to the inner tensors: the
    gradient's matching inner tensors flow back to them."""

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


class OpaqueSubclass(torch.Tensor):
    """Base class for wrapper tensor subclasses with opaque attributes.

    Class attributes to declare
    ---------------------------
    tensor_attrs
        Names of the inner tensors, at least one. The first one gives the
        default dtype, device, size and stride.
    opaque_attrs
        ``{name: class}`` of the opaque attributes, each a registered *reference*
        opaque (:func:`opaque_subclass.register_opaque`). With the class keyword
        ``register_opaques=True`` (``class T(OpaqueSubclass, register_opaques=True)``)
        a class nobody registered yet is registered as one when the first
        instance is built, not when the class statement runs (for a library that
        must not register anything on import). torch's ``ProcessGroup`` and
        ``DeviceMesh``, which torch registers itself at a moment that differs by
        release, are registered as torch does when the class statement names
        them, on every release.
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
    does (a parameter, an activation), the result is differentiable with respect
    to it and stores it detached (as :meth:`from_inner` does).
    """

    tensor_attrs: ClassVar[tuple[str, ...]] = ()
    opaque_attrs: ClassVar[Mapping[str, type | OpaqueAttr]] = {}
    meta_attrs: ClassVar[tuple[str, ...]] = ()

    # Derived at class definition.
    _value_names: ClassVar[tuple[str, ...]] = ()
    _opaque_classes: ClassVar[Mapping[str, type]] = {}
    _op_table: ClassVar[dict[Any, Callable[..., Any]]] = {}

    #: The autograd function of a construction from inner tensors that require grad,
    #: applied as ``(cls, others, outer_size, outer_stride, *tensors)``; a subclass
    #: whose gradient must first take the instance's form (a sharded tensor's
    #: placement) names its own.
    _from_inner_function: ClassVar[type[torch.autograd.Function]] = _FromInner
    #: ``(bound values, outer_stride) -> (outer size, outer stride)`` where the caller gives no
    #: outer size, for a subclass whose outer shape is not its first inner tensor's (a sharded
    #: tensor's global shape; an outer size ``None`` keeps that default); ``None``: none.
    _default_outer_shape: ClassVar[Callable[[dict[str, Any], Sequence[int] | None], tuple[Any, Any]] | None] = None

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]  # plain-tensor autograd semantics

    def __init_subclass__(cls, register_opaques: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._op_table = {}
        tensors, opaques, metas = _check_groups(cls)
        declared: dict[str, type] = {}
        pending: list[type] = []  # registered when the first instance is built
        pending_options: dict[type, dict[str, Any]] = {}
        for name, entry in cls.opaque_attrs.items():
            opaque_cls, options = _split(entry)
            declared[name] = opaque_cls
            if not _check_opaque(cls, name, opaque_cls, options, register_opaques):
                pending.append(opaque_cls)
                if options:
                    pending_options[opaque_cls] = options
        _set_pending(cls, pending, pending_options)
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
            raise messages.base_class_built()
        bound = cls._bind(values, named)
        # ``_trusted`` (private): a rebuild from flattened parts (unflatten, wrap_like,
        # a replayed exported constructor) stores the inner tensors as given.
        if not _trusted and torch.is_grad_enabled():
            differentiable = [n for n in cls.tensor_attrs if bound[n].requires_grad]
            if differentiable:
                if requires_grad:
                    raise messages.leaf_of_grad_tensor(cls, differentiable[0])
                others = {n: bound[n] for n in cls._value_names if n not in cls.tensor_attrs}
                tensors = [bound[n] for n in cls.tensor_attrs]
                return cls._from_inner_function.apply(cls, others, outer_size, outer_stride, *tensors)
        first = bound[cls.tensor_attrs[0]]
        if outer_size is None and cls._default_outer_shape is not None:
            outer_size, outer_stride = cls._default_outer_shape(bound, outer_stride)
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
            raise messages.too_many_values(cls, names, len(values))
        bound = dict(zip(names, values, strict=False))
        for name, value in named.items():
            if name not in names:
                raise messages.unexpected_argument(cls, name, names)
            if name in bound:
                raise messages.given_twice(cls, name, names)
            bound[name] = value
        missing = [n for n in names if n not in bound]
        if missing:
            raise messages.missing_values(cls, missing, names)
        for name in cls.tensor_attrs:
            if not isinstance(bound[name], torch.Tensor):
                raise messages.not_a_tensor(cls, name, bound[name])
        for name, expected in cls._opaque_classes.items():
            if not issubclass(opaque_type_of(bound[name]), expected):
                raise messages.wrong_opaque(cls, name, expected, bound[name])
        return bound

    @classmethod
    def from_inner(
        cls,
        *values: Any,
        outer_size: Sequence[int] | None = None,
        outer_stride: Sequence[int] | None = None,
        **named: Any,
    ) -> Any:
        """Build an instance differentiable with respect to its inner tensors: a
        gradient reaching the result flows back to the inner tensors given (as
        the matching inner tensors of the incoming gradient)."""
        bound = cls._bind(values, named)
        tensors = [bound[n] for n in cls.tensor_attrs]
        others = {n: bound[n] for n in cls._value_names if n not in cls.tensor_attrs}
        return cls._from_inner_function.apply(cls, others, outer_size, outer_stride, *tensors)

    # ------------------------------------------------------------------ flatten protocol

    def __tensor_flatten__(self) -> tuple[list[str], tuple[Any, ...]]:
        cls = type(self)
        return [*cls.tensor_attrs, *cls.opaque_attrs], tuple(getattr(self, n) for n in cls.meta_attrs)

    @classmethod
    def _opaque_constant_flatten(cls) -> tuple[list[str], tuple[()]] | None:
        """What :meth:`__tensor_flatten__` returns for every instance, when that is
        one value: the class keeps this base's method and has no ``meta_attrs``.
        ``None`` otherwise. Read by the guard fix
        :mod:`opaque_subclass.fixes.subclass_guards` (compiled code then checks
        the class once per call, not each input's flatten)."""
        if cls.meta_attrs or cls.__tensor_flatten__ is not OpaqueSubclass.__tensor_flatten__:
            return None
        return [*cls.tensor_attrs, *cls.opaque_attrs], ()

    @classmethod
    def __tensor_unflatten__(
        cls, inner: dict[str, Any], ctx: tuple[Any, ...], outer_size: Any, outer_stride: Any
    ) -> Any:
        named = {n: inner[n] for n in (*cls.tensor_attrs, *cls.opaque_attrs)}
        named.update(zip(cls.meta_attrs, ctx, strict=True))
        if cls._default_outer_shape is None and _concrete_over_symbolic(outer_size, named[cls.tensor_attrs[0]]):
            # torch fakeifies a subclass nested in another with its concrete size as
            # ``outer_size`` over symbolic inner tensors (``mark_dynamic`` on the outer one);
            # the outer shape of such a class is its first tensor's, so take that one, or
            # AOTAutograd's comparison of the two specializes the marked size.
            outer_size = outer_stride = None
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

        ``tensors`` names exactly the attributes of ``tensor_attrs``, each a
        tensor (an op rule that leaves one unchanged passes the instance's own,
        ``_scale=x._scale``). Anything else raises
        :class:`~opaque_subclass.OpaqueSubclassError` naming the missing, extra
        or non-tensor entries, not ``TypeError``, which torch turns into
        ``NotImplemented`` inside a Python operator (``x * 2``), leaving only
        ``unsupported operand type(s)``.

        The outer size and stride are the first inner tensor's; a subclass whose
        outer shape differs (a sharded tensor) overrides this.
        """
        cls = type(self)
        if len(tensors) != len(cls.tensor_attrs) or not all(
            isinstance(tensors.get(name), torch.Tensor) for name in cls.tensor_attrs
        ):
            raise messages.wrap_like_mismatch(cls, tensors)
        named: dict[str, Any] = dict(tensors)
        for name in (*cls.opaque_attrs, *cls.meta_attrs):
            named[name] = getattr(self, name)
        if torch.compiler.is_exporting():
            return cls._recorded(named)
        return cls.__new__(cls, _trusted=True, **named)

    @classmethod
    def _recorded(cls, named: dict[str, Any], **sizes: Any) -> Any:
        """``cls(..., _trusted=True)`` as torch.export records it (a ``flat_apply``
        of the constructor), whose arguments must be FX-graphable, which ``None``
        is not: metadata that is ``None`` (a replicated ``ShardedTensor``'s
        ``_shard_dim``) travels as its name in ``_none``, which :meth:`_bind`
        turns back into ``None`` (a subclass's ``__new__`` calling it needs nothing more)."""
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

        torch asks a subclass input for it when building a compiled program's key
        (``AOTAutogradCachePickler``, ``torch/_functorch/_aot_autograd/autograd_cache.py``).
        Without it torch warns ``<Class> does not implement _stable_hash_for_caching``
        and hashes the flatten output itself (outer shape, ``requires_grad``, the
        context, each inner tensor's metadata, each opaque's class name), pickling
        the sizes with plain ``pickle``, which fails on a ``SymInt``. Measured on
        2.12 - 2.15: a program with static shapes is reused all the same, one with
        symbolic sizes never cached (torch logs ``Bypassing autograd cache due to:
        Failed to pickle cache key``). torch 2.11 never asks (its key pickles each
        input whole, opaques by value); the library's 2.11 key does
        (``opaque_subclass.fixes.autograd_cache.stable_subclass_inputs``).

        Hashed, for this instance and every subclass nested in it (in walk order,
        by attribute path): each subclass's qualified class name and flatten
        context (the metadata torch.compile specializes on); the size, stride,
        dtype, device, layout, ``requires_grad`` and conj/neg/inference flags of
        each subclass and inner tensor (symbolic sizes as their symbols); each
        opaque's qualified class name; the library's version (its dispatch and
        rewrap code is traced into the program). Never an opaque's identity or
        value: an opaque is a graph input and one program serves every object of
        its class (which inputs share one opaque is keyed separately,
        :mod:`opaque_subclass.fixes.autograd_cache`). Nothing hashed depends on
        ``id()`` or ``hash()``, so every process computes the same key: a set or
        frozenset in a context is written sorted (its own order follows
        ``hash()``, which for strings differs per process). A context that cannot
        be pickled raises ``pickle.PicklingError``, ``TypeError`` or
        ``AttributeError``, and torch bypasses its cache for the program.
        """
        return stable_subclass_hash(self)

    # ------------------------------------------------------------------ dispatch

    @classmethod
    def implements(cls, *ops: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register ``fn(func, args, kwargs)`` as this class's implementation of ``ops``
        (``OpOverload`` or ``OpOverloadPacket`` objects; a packet covers all its
        overloads). Subclasses inherit their bases' tables and may override entries."""
        if cls is OpaqueSubclass:
            raise messages.implements_on_base(cls, ops)

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


def _concrete_over_symbolic(outer_size: Any, first: Any) -> bool:
    """Whether ``outer_size`` is plain integers equal to the hints of a fake ``first``
    tensor's shape, some of which is symbolic (the size torch gives a nested subclass
    while it fakeifies a dynamic input); ``False`` at run time (real tensors)."""
    # torch's fake tensor module, if loaded (a lookup, not an import: this runs for every
    # output rebuilt at run time; without that module there is no fake tensor)
    fake = sys.modules.get("torch._subclasses.fake_tensor")
    if outer_size is None or fake is None or not isinstance(first, fake.FakeTensor):
        return False
    shape = first.shape
    if len(outer_size) != len(shape) or not any(isinstance(d, torch.SymInt) for d in shape):
        return False
    for given, dim in zip(outer_size, shape, strict=True):
        if type(given) is not int:
            return False
        hint = dim.node.hint if isinstance(dim, torch.SymInt) else dim
        if hint != given:
            return False
    return True


def _contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    strides: list[int] = []
    running = 1
    for s in reversed(size):
        strides.append(running)
        running *= max(int(s), 1)
    return tuple(reversed(strides))
