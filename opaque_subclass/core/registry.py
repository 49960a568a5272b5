"""Registering classes as opaque types, on every supported torch.

Note [Reference and value opaques]
----------------------------------
torch knows two kinds of opaque objects (``torch._library.opaque_object``;
torch 2.14 renamed them "custom classes", reference to "symbolic" and value to
"constant": the library keeps its names and accepts torch's as aliases):

* a **reference** opaque is a stateful object whose *identity* matters (a
  ``DeviceMesh``, a process group handle, an RNG state). torch.compile never
  looks inside it: it becomes a graph input, and the compiled graph is reused
  for any other object of the same type. Only reference opaques may be listed
  among the attributes returned by ``__tensor_flatten__``: they take one slot of
  the flat argument list, exactly like an inner tensor.
* a **value** opaque is a constant (a quantization config, an enum). torch.compile
  guards on its equality and bakes it into the graph, so it belongs in the
  *context* (second return value) of ``__tensor_flatten__``.

torch only accepts reference types whose metaclass is torch's (the metaclass of
:data:`OpaqueBase`): during tracing an opaque is replaced by a
``FakeScriptObject`` and that metaclass makes ``isinstance(fake, cls)`` true.
Classes we do not own (``DeviceMesh`` on torch 2.11) cannot change their metaclass, so :func:`register_opaque` enters them in
torch's registry directly. Everything works for them except ``isinstance(obj,
TheClass)`` *inside* a compiled region, which sees the fake wrapper; use
``type(...)`` or :func:`opaque_subclass.is_opaque` outside the region (see docs/backport.md).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, get_args

import torch

# How compiled code may use a member (attribute, property or method) of a
# registered opaque: torch's ``MemberType`` of the running release (the
# same enum on torch 2.11 - 2.15), under the library's name.
#
# * ``Member.USE_REAL``: read or called on the real object while tracing,
#   and the result compiled in as a constant. The library guards every such
#   value (the graph is reused only while the member gives the same value),
#   on every release; torch itself guards none.
# * ``Member.INLINED``: traced into the graph (a method call on the opaque
#   graph input; an attribute read on it).
#
# A member not declared is an error in compiled code
# (:class:`opaque_subclass.OpaqueMemberError`).
from torch._library.opaque_object import MemberType as Member

from opaque_subclass.core.errors import OpaqueTypeError, OpaqueValueError, describe_type, import_fix, qualified_name
from opaque_subclass.releases import OpaqueKind, RegistryAPI, current

__all__ = [
    "KIND_ALIASES",
    "Member",
    "OpaqueBase",
    "OpaqueKind",
    "is_opaque",
    "is_torch_handled_type",
    "is_torch_own_opaque_type",
    "opaque_kind",
    "opaque_type_of",
    "register_opaque",
    "stored_opaque_leaves",
]

log = logging.getLogger(__name__)

_KINDS: tuple[str, ...] = get_args(OpaqueKind)

#: Every name of a kind that :func:`register_opaque` accepts: the library's own
#: and torch 2.14's ("symbolic" for reference, "constant" for value).
KIND_ALIASES: dict[str, OpaqueKind] = {
    "reference": "reference",
    "value": "value",
    "symbolic": "reference",
    "constant": "value",
}

# type -> kind, for classes registered (by us or by torch) and their subclasses.
# Positive answers only: torch has no way to unregister, so they never go stale.
_KIND_BY_TYPE: dict[type, OpaqueKind] = {}
_LOCK = threading.Lock()


def _api() -> RegistryAPI:
    api = current().registry
    if api is None:
        raise RuntimeError(
            f"opaque types are not supported on torch {torch.__version__}: "
            f"{'; '.join(map(str, current().differences)) or 'no opaque registry'}. "
            "Fix: python -m pip install 'torch>=2.11'"
        )
    return api


def _resolve_base() -> type:
    """torch's base class for reference opaques on the running release."""
    api = current().registry
    if api is not None:
        return api.base_class()

    class OpaqueBase:
        """Stand-in on a torch without opaque objects: inheriting it works, but
        registering a class raises (see ``opaque_subclass.support()``)."""

    return OpaqueBase


if TYPE_CHECKING:
    # Type checkers see a plain class (the real one is picked at import), so
    # that ``class Mesh(OpaqueBase)`` type-checks as a subclass, not of Any.
    class OpaqueBase:
        pass

else:
    #: The base class for reference opaques you own: ``torch._opaque_base.OpaqueBase``
    #: on torch 2.11 - 2.13, ``torch._custom_class_base.CustomClassBase`` (its new
    #: name) on torch >= 2.14. Inheriting it makes ``isinstance(obj, YourClass)``
    #: hold inside compiled code too, where torch passes a fake wrapper.
    OpaqueBase: type = _resolve_base()


def _fake_script_object_type() -> type | None:
    try:
        from torch._library.fake_class_registry import FakeScriptObject
    except ImportError:  # pragma: no cover - every supported torch has it
        return None
    return FakeScriptObject


_FAKE_SCRIPT_OBJECT = _fake_script_object_type()


def real_object(obj: object) -> object:
    """``obj``, or the real object behind torch's fake wrapper of it
    (``FakeScriptObject``, what compiled code sees while tracing). The one
    place the library looks through that wrapper."""
    if type(obj) is _FAKE_SCRIPT_OBJECT:
        return object.__getattribute__(obj, "real_obj")
    return obj


def opaque_type_of(obj: object) -> type:
    """The type of ``obj``, seen through torch's fake wrapper used while tracing."""
    return type(real_object(obj))


def _torch_kind(cls: type) -> OpaqueKind | None:
    """The kind torch has registered ``cls`` (or a base class of it) under, in
    the library's names, whatever names the running release uses."""
    api = current().registry
    if api is None:
        return None
    table = api.torch_module()._OPAQUE_TYPES
    for klass in cls.__mro__:
        info = table.get(klass)
        if info is not None and torch._C._is_opaque_type_registered(info.class_name):
            return KIND_ALIASES.get(info.opaque_typ)
    return None


def opaque_kind(obj: object) -> OpaqueKind | None:
    """``"reference"`` or ``"value"`` for a registered opaque object, else ``None``.

    Accepts an instance (also torch's ``FakeScriptObject`` wrapper seen during
    tracing) or a class. Subclasses of a registered class count as registered.
    """
    cls = obj if isinstance(obj, type) else opaque_type_of(obj)
    kind = _KIND_BY_TYPE.get(cls)
    if kind is not None:
        return kind
    if issubclass(cls, torch.Tensor):
        return None
    kind = _torch_kind(cls)
    if kind is not None:
        with _LOCK:
            _KIND_BY_TYPE[cls] = kind
    return kind


def is_opaque(obj: object) -> bool:
    """Whether ``obj`` (an instance or a class) is a registered opaque of either kind."""
    return opaque_kind(obj) is not None


#: Types torch.compile treats itself (constants it specializes on, or objects
#: with their own Dynamo handling); never opaque.
_TORCH_HANDLED: tuple[type, ...] = tuple(
    t
    for t in (
        torch.dtype,
        torch.device,
        torch.layout,
        torch.memory_format,
        torch.Size,
        getattr(torch, "qscheme", None),
        torch.nn.Module,
        torch.nn.Parameter,
    )
    if isinstance(t, type)
)


def is_torch_handled_type(cls: type) -> bool:
    """Whether ``cls`` is one of torch's own value types (``torch.dtype``,
    ``torch.device``, ...) or a module: torch.compile handles those itself, so
    they can be neither registered nor listed as opaque attributes."""
    return issubclass(cls, _TORCH_HANDLED)


def _check_value_type_protocol(cls: type) -> None:
    if issubclass(cls, enum.Enum):
        return
    missing: list[str] = []
    if cls.__eq__ is object.__eq__:
        missing.append("__eq__ (compiled graphs are guarded on equality)")
    if cls.__hash__ is None or cls.__hash__ is object.__hash__:
        missing.append("__hash__ consistent with __eq__ (used for fake-tensor caching)")
    if not hasattr(cls, "__fx_repr__"):
        missing.append("__fx_repr__ returning (source, {name: type}) that rebuilds the value in generated code")
    if missing:
        raise OpaqueTypeError(
            f"cannot register {qualified_name(cls)} as a value-type opaque: it lacks "
            + "; ".join(missing)
            + ". A value opaque is a constant that torch.compile compares and bakes in. "
            "Fix: define the missing methods, or register it as a reference opaque if "
            "its identity matters: " + import_fix(cls, 'opaque_subclass.register_opaque({cls}, kind="reference")')
        )


# torch registers some of its own classes lazily (DeviceMesh and ProcessGroup
# when torch.distributed.tensor is first imported, on torch >= 2.12) and fails
# if the class is registered already. Running torch's hook first makes our
# registration a no-op that keeps torch's own entry (guard_fn, reconstruct_fn).
_TORCH_REGISTRATION_HOOKS: tuple[tuple[str, str, str], ...] = (
    ("torch.distributed", "torch.distributed.device_mesh", "_register_distributed_opaque_types"),
)


def _run_torch_registration_hooks(cls: type) -> bool:
    """Run torch's own registration of its classes for ``cls``'s package;
    whether the running torch has such a hook."""
    import importlib

    ran = False
    for prefix, module_name, hook_name in _TORCH_REGISTRATION_HOOKS:
        if not cls.__module__.startswith(prefix):
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        hook = getattr(module, hook_name, None)
        if callable(hook):
            hook()
            ran = True
    return ran


def _process_group_options() -> dict[str, Any]:
    names = ("size", "rank", "_get_backend_name", "group_name", "group_desc", "__eq__", "__ne__")
    return {"members": dict.fromkeys(names, Member.USE_REAL)}


# The members torch 2.13 declares for DeviceMesh: evaluated on the real mesh
# while tracing (and guarded), or traced. All but ``_hash``, which a torch 2.11
# mesh sets only once hashed (torch refuses a member its object lacks).
_MESH_USE_REAL = (
    "_flatten_rank_map", "_layout", "_device_type", "_mesh_dim_names", "_thread_id", "get_rank", "size",
    "get_coordinate", "get_local_rank", "__eq__", "__ne__", "ndim", "shape", "mesh_dim_names",
    "_create_flatten_mesh", "_coordinate_on_dim", "_dim_group_names", "_flatten_mapping", "_rank_map",
    "_root_mesh", "device_type", "mesh", "_unflatten", "_is_current_rank_part_of_mesh", "_sym_get_coordinate",
    "_get_mesh_dim_by_name",
)  # fmt: skip
_MESH_INLINED = (
    "get_group", "_pg_registry", "_flatten", "_get_root_mesh", "__getitem__", "_get_slice_mesh_layout",
    "_create_sub_mesh",
)  # fmt: skip


def _device_mesh_identity(mesh: Any) -> list[object]:
    """What a compiled program may have read from a mesh (its ranks, their
    layout, device type, dimension names and owning thread): the values torch
    2.13's ``guard_fn`` for ``DeviceMesh`` compares on every call."""
    return [mesh._flatten_rank_map, mesh._layout, mesh._device_type, mesh._mesh_dim_names, mesh._thread_id]


def _device_mesh_options() -> dict[str, Any]:
    members = dict.fromkeys(_MESH_USE_REAL, Member.USE_REAL) | dict.fromkeys(_MESH_INLINED, Member.INLINED)
    return {"members": members, "guard_fn": _device_mesh_identity}


#: torch's own registration of its classes, for a release that registers them
#: not at all (torch 2.11): the members (and, for ``DeviceMesh``, the guard)
#: of torch 2.13's entry, keyed by the class's qualified name, so that compiled
#: code may use the same members on every release, with the same
#: recompilations (and the library guards every value read from them).
_TORCH_OWN_OPTIONS: dict[str, Callable[[], dict[str, Any]]] = {
    "torch.distributed.distributed_c10d.ProcessGroup": _process_group_options,
    "torch.distributed.device_mesh.DeviceMesh": _device_mesh_options,
}


def is_torch_own_opaque_type(cls: type) -> bool:
    """Whether ``cls`` is one of the classes torch registers as opaques itself
    (``ProcessGroup``, ``DeviceMesh``; torch >= 2.12, when
    ``torch.distributed.tensor`` is first imported): :func:`register_opaque`
    registers them alike on every release."""
    return qualified_name(cls) in _TORCH_OWN_OPTIONS


def _member_options(cls: type, members: object) -> dict[str, Member]:
    """``members`` checked and normalised to torch's enum (strings ``"use_real"``
    and ``"inlined"``, the enum's values, are accepted)."""
    name = cls.__qualname__
    if not isinstance(members, Mapping):
        raise OpaqueTypeError(
            f"register_opaque({name}, members=...): members must map member names to "
            f"opaque_subclass.Member values, got {describe_type(members)}. Fix: "
            f'register_opaque({name}, members={{"size": opaque_subclass.Member.USE_REAL}}).'
        )
    checked: dict[str, Member] = {}
    for member, how in members.items():
        if not isinstance(member, str) or not member.isidentifier():
            raise OpaqueTypeError(
                f"register_opaque({name}, members=...): member names must be attribute names, got "
                f"{member!r} ({describe_type(member)}). Fix: "
                f'register_opaque({name}, members={{"size": opaque_subclass.Member.USE_REAL}}).'
            )
        if isinstance(how, Member):
            checked[member] = how
            continue
        try:
            checked[member] = Member(how)
        except ValueError:
            raise OpaqueTypeError(
                f"register_opaque({name}, members=...): members[{member!r}] is {how!r} "
                f"({describe_type(how)}); it must say how compiled code uses the member: "
                "opaque_subclass.Member.USE_REAL (read on the real object while tracing, compiled "
                "in as a constant and guarded) or opaque_subclass.Member.INLINED (traced). Fix: "
                f"register_opaque({name}, members={{{member!r}: opaque_subclass.Member.USE_REAL}})."
            ) from None
    return checked


def _torch_options(
    cls: type,
    kind: OpaqueKind,
    members: object,
    guard: object,
    hoist: object,
    reconstruct: object,
) -> dict[str, Any]:
    """The options of :func:`register_opaque`, checked, as torch's keyword
    arguments (only those given)."""
    name = cls.__qualname__
    options: dict[str, Any] = {}
    if members is not None:
        options["members"] = _member_options(cls, members)
    if guard is not None:
        if not callable(guard):
            raise OpaqueTypeError(
                f"register_opaque({name}, guard=...): guard must be a function of the object that "
                f"returns the values to compare on every call, got {describe_type(guard)}. Fix: "
                f"register_opaque({name}, guard=lambda obj: [obj.size()])."
            )
        if kind == "value":
            raise OpaqueValueError(
                f'register_opaque({name}, kind="value", guard=...): a value opaque is guarded by its '
                f"__eq__ already; guard is for reference opaques. Fix: "
                f'register_opaque({name}, kind="value") (drop guard=).'
            )
        options["guard_fn"] = guard
    if hoist:
        if hoist is not True:
            raise OpaqueTypeError(
                f"register_opaque({name}, hoist=...): hoist is a bool, got {describe_type(hoist)}. "
                f'Fix: register_opaque({name}, kind="value", hoist=True).'
            )
        if kind == "reference":
            raise OpaqueValueError(
                f"register_opaque({name}, hoist=True): hoist lifts a *value* opaque to a graph input "
                "instead of compiling it in; a reference opaque is always a graph input. Fix: "
                f'register_opaque({name}, kind="reference") (drop hoist=).'
            )
        options["hoist"] = True
    if reconstruct is not None:
        if not callable(reconstruct):
            raise OpaqueTypeError(
                f"register_opaque({name}, reconstruct=...): reconstruct must be a function "
                f"(obj, get_proxy, tracer) -> proxy or None, got {describe_type(reconstruct)}. Fix: "
                f"register_opaque({name}, reconstruct=lambda obj, get_proxy, tracer: None)."
            )
        if "reconstruct_fn" not in _api().table_fields():
            raise OpaqueValueError(
                f"register_opaque({name}, reconstruct=...): torch {torch.__version__} has no "
                "reconstruct hook for opaques (torch 2.12 added it to make_fx); the library does "
                "not emulate it, so a backward closure holding such an object is kept as a "
                f"constant. Fix: register_opaque({name}) without reconstruct=, or "
                "python -m pip install 'torch>=2.12'."
            )
        options["reconstruct_fn"] = reconstruct
    return options


def _same_options(info: Any, options: Mapping[str, Any]) -> bool:
    """Whether torch's registry entry already holds ``options``."""
    return (
        dict(info.members) == dict(options.get("members", {}))
        and bool(info.hoist) == bool(options.get("hoist", False))
        and info.guard_fn is options.get("guard_fn")
        and getattr(info, "reconstruct_fn", None) is options.get("reconstruct_fn")
    )


def _describe_entry(info: Any) -> str:
    parts = [f"kind {KIND_ALIASES.get(info.opaque_typ, info.opaque_typ)}"]
    if info.members:
        parts.append(f"members {sorted(info.members)}")
    if info.guard_fn is not None:
        parts.append("a guard")
    if getattr(info, "hoist", False):
        parts.append("hoist")
    if getattr(info, "reconstruct_fn", None) is not None:
        parts.append("a reconstruct function")
    return ", ".join(parts)


def register_opaque(
    cls: type,
    kind: str = "reference",
    *,
    members: Mapping[str, Member | str] | None = None,
    guard: Callable[[Any], Any] | None = None,
    hoist: bool = False,
    reconstruct: Callable[..., Any] | None = None,
) -> None:
    """Register ``cls`` as an opaque type on the running torch.

    Parameters
    ----------
    cls
        The class. It may, but need not, inherit :data:`OpaqueBase`;
        third-party classes such as ``torch.distributed.DeviceMesh`` on torch 2.11
        are accepted as they are.
    kind
        ``"reference"`` (the default) for objects whose identity matters and that
        may be listed by ``__tensor_flatten__``; ``"value"`` for constants that
        belong in the flatten context. See Note [Reference and value opaques].
        torch 2.14's names for the two kinds, ``"symbolic"`` and ``"constant"``,
        are accepted as aliases on every release.
    members
        ``{name: Member}``: the attributes, properties and methods compiled code
        may use (see :data:`Member`). Any other member used in compiled code is
        an :class:`opaque_subclass.OpaqueMemberError`. Every ``Member.USE_REAL``
        value read while tracing is guarded, on every release.
    guard
        Reference opaques: ``guard(obj) -> list`` of values compared on every
        call of a compiled function (a change recompiles), as torch's
        ``guard_fn``.
    hoist
        Value opaques: lift the value to a graph input instead of compiling it
        in (torch's ``hoist``).
    reconstruct
        torch's ``reconstruct_fn`` (torch 2.12 and newer; refused on 2.11):
        how ``make_fx`` derives an untracked object from the graph's inputs.

    Registering a class again with the same kind does nothing, also when torch
    registered it first; with other options it raises :class:`ValueError`
    (torch cannot change a registration). Registering it again with the other
    kind raises :class:`ValueError`.
    """
    if not isinstance(cls, type):
        raise OpaqueTypeError(
            f"register_opaque expects a class, got an instance of {describe_type(cls)}. "
            f"Fix: pass the class itself, e.g. register_opaque(type(obj))."
        )
    if kind not in KIND_ALIASES:
        raise OpaqueValueError(
            f"register_opaque({cls.__qualname__}, kind={kind!r}): kind must be "
            '"reference" or "value" (torch 2.14\'s names "symbolic" and "constant" are '
            f'accepted too). Fix: register_opaque({cls.__qualname__}, kind="reference").'
        )
    kind = KIND_ALIASES[kind]
    api = _api()
    if cls.__module__ == "builtins" or issubclass(cls, torch.Tensor):
        raise OpaqueTypeError(
            f"cannot register {qualified_name(cls)} as an opaque type: builtins and tensors "
            "are handled by torch directly. Fix: wrap the value in a class of your own "
            "and register that class."
        )
    if is_torch_handled_type(cls):
        raise OpaqueTypeError(
            f"cannot register {qualified_name(cls)} as an opaque type: torch.compile handles "
            f"{cls.__qualname__} values itself (as constants it specializes on), and an "
            "opaque registration would change that for every compiled program in the process, "
            "irreversibly. Fix: keep such a value in the flatten context (the second value "
            "__tensor_flatten__ returns), or as a plain Python attribute read outside the "
            "compiled region."
        )
    from torch.utils import _pytree as pytree

    if cls in pytree.SUPPORTED_NODES or (issubclass(cls, tuple) and hasattr(cls, "_fields")):
        raise OpaqueTypeError(
            f"cannot register {qualified_name(cls)} as an opaque type: it is a pytree node, "
            "so torch would flatten it instead of passing it as one object. Fix: "
            "unregister it from pytree or wrap it in a class that is not a pytree node."
        )
    options = _torch_options(cls, kind, members, guard, hoist, reconstruct)
    if not _run_torch_registration_hooks(cls) and not options and kind == "reference":
        own = _TORCH_OWN_OPTIONS.get(qualified_name(cls))
        options = own() if own is not None else options
    with _LOCK:
        # The kind of a class is fixed by its first registration, and a subclass
        # has the kind of its registered base: torch answers lookups through the MRO.
        existing = _torch_kind(cls) or _KIND_BY_TYPE.get(cls)
        if existing is not None and existing != kind:
            raise OpaqueValueError(
                f"{qualified_name(cls)} is already registered as a {existing} opaque"
                + ("" if cls in api.torch_module()._OPAQUE_TYPES else " (through a base class)")
                + f"; it cannot also be a {kind} opaque. Fix: keep one registration, "
                f'register_opaque({cls.__qualname__}, kind="{existing}").'
            )
        info = api.torch_module()._OPAQUE_TYPES.get(cls)
        if existing is not None and info is not None:
            if options and not _same_options(info, options):
                raise OpaqueValueError(
                    f"{qualified_name(cls)} is registered already ({_describe_entry(info)}), and torch "
                    "cannot change a registration. Fix: keep the registration it has, "
                    + import_fix(cls, "opaque_subclass.register_opaque({cls})")
                    + "; to change its options, pass them to the first registration (run before "
                    "anything uses the class) in a fresh process."
                )
            _KIND_BY_TYPE[cls] = kind
            return
        if kind == "value":
            _check_value_type_protocol(cls)
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name in api.torch_module()._OPAQUE_TYPES_BY_NAME:
            raise OpaqueValueError(
                f"cannot register {name}: another class of that name is registered already (torch "
                "keys opaque types by module and qualified name, for every process that loads a "
                f"compiled program). Fix: give the class a name of its own, `class "
                f"{cls.__name__}2({', '.join(b.__name__ for b in cls.__bases__)}): ...`, and register "
                "that one."
            )
        if isinstance(cls, api.base_metaclass()):
            api.register_in_torch(cls, kind, options)
        else:
            log.debug("entering %s in torch's opaque registry directly", qualified_name(cls))
            api.enter_in_tables(cls, kind, options)
        # A class registered now may have subclasses looked up before; they are
        # never cached negatively, so only the class itself needs an entry.
        _KIND_BY_TYPE[cls] = kind


def stored_opaque_leaves(plist: Any) -> frozenset[int]:
    """Which ``original{i}`` of a ``torch.nn.utils.parametrize.ParametrizationList``
    hold reference opaques: those stored as plain attributes (neither parameter
    nor buffer), as torch 2.12+ and the 2.11 backport store them, read from the
    list itself so that nothing of the library's is kept on torch's object."""
    count = getattr(plist, "ntensors", None)
    if getattr(plist, "is_tensor", True) or not isinstance(count, int):
        return frozenset()
    return frozenset(
        i
        for i in range(count)
        if f"original{i}" not in plist._parameters
        and f"original{i}" not in plist._buffers
        and opaque_kind(vars(plist).get(f"original{i}")) == "reference"
    )
