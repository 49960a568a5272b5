"""Registering classes as opaque types, on every supported torch.

Note [Reference and value opaques]
----------------------------------
torch knows two kinds of opaque objects (``torch._library.opaque_object``; torch
2.14 renamed them "custom classes", reference to "symbolic" and value to
"constant": the library keeps its names and accepts torch's as aliases):

* a **reference** opaque is a stateful object whose *identity* matters (a
  ``DeviceMesh``, a process group, an RNG state). torch.compile never looks
  inside it: it is a graph input, and the graph is reused for any object of the
  same type. Only reference opaques may be among the attributes
  ``__tensor_flatten__`` lists, each in one flat argument slot, like a tensor.
* a **value** opaque is a constant (a quantization config, an enum) that
  torch.compile guards on by equality and bakes in: it belongs in the *context*
  (second return value) of ``__tensor_flatten__``.

torch accepts only reference types with torch's metaclass (:data:`OpaqueBase`'s),
which makes ``isinstance(fake, cls)`` true of the ``FakeScriptObject`` that
replaces an opaque while tracing. Classes we do not own (``DeviceMesh`` on torch
2.11) cannot change their metaclass, so :func:`register_opaque` enters them in
torch's registry directly; only ``isinstance(obj, TheClass)`` *inside* a compiled
region fails for them (it sees the fake wrapper): use ``type(...)`` or
:func:`opaque_subclass.is_opaque` outside the region (docs/backport.md).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, get_args

import torch

# How compiled code may use a member (attribute, property or method) of a
# registered opaque: torch's ``MemberType`` (the same enum on torch 2.11 - 2.15)
# under the library's name.
#
# * ``Member.USE_REAL``: read or called on the real object while tracing and
#   compiled in as a constant, which the library guards on every release
#   (torch guards none): the graph is reused while the member gives that value.
# * ``Member.INLINED``: traced into the graph (a method call on, or an attribute
#   read of, the opaque graph input).
#
# An undeclared member used in compiled code raises
# :class:`opaque_subclass.OpaqueMemberError`.
from torch._library.opaque_object import MemberType as Member

from opaque_subclass.core import registry_messages as messages
from opaque_subclass.core.errors import qualified_name
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
    "process_group_ranks",
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
# Positive answers only: torch cannot unregister, so they never go stale, and a
# class registered later needs only its own entry.
_KIND_BY_TYPE: dict[type, OpaqueKind] = {}
_LOCK = threading.Lock()


def _api() -> RegistryAPI:
    api = current().registry
    if api is None:
        raise messages.no_opaque_registry(torch.__version__, current().differences)
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
    """``obj``, or the real object behind torch's ``FakeScriptObject`` wrapper (what compiled
    code sees while tracing): the one place the library looks through that wrapper."""
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
    """Whether ``cls`` is a module or one of torch's value types (``torch.dtype``, ``torch.device``,
    ...), which torch.compile handles itself: never registered nor listed as opaque attributes."""
    return issubclass(cls, _TORCH_HANDLED)


def _check_value_type_protocol(cls: type) -> None:
    """A value opaque is compared, hashed and rebuilt in generated code (an enum is all three)."""
    if issubclass(cls, enum.Enum):
        return
    lacks = {
        "__eq__": cls.__eq__ is object.__eq__,
        "__hash__": cls.__hash__ is None or cls.__hash__ is object.__hash__,
        "__fx_repr__": not hasattr(cls, "__fx_repr__"),
    }
    if any(lacks.values()):
        raise messages.value_type_lacks(cls, [method for method, lacking in lacks.items() if lacking])


# torch registers some of its own classes lazily (DeviceMesh and ProcessGroup
# when torch.distributed.tensor is first imported, on torch >= 2.12) and fails
# if the class is registered already. Running torch's hook first makes our
# registration a no-op that keeps torch's own entry (guard_fn, reconstruct_fn).
_TORCH_REGISTRATION_HOOKS: tuple[tuple[str, str, str], ...] = (
    ("torch.distributed", "torch.distributed.device_mesh", "_register_distributed_opaque_types"),
)


def _run_torch_registration_hooks(cls: type) -> bool:
    """Run torch's own registration hook for ``cls``'s package; whether the running torch has one."""
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


def process_group_ranks(name: str) -> tuple[int, ...] | None:
    """The global ranks of the process group registered under ``name`` in this process, or
    ``None`` (no default group, or no group of that name here: another process's name)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    from torch.distributed import distributed_c10d as c10d

    try:
        group = c10d._resolve_process_group(name)  # type: ignore[attr-defined, arg-type]  # torch's, not exported
        return tuple(dist.get_process_group_ranks(group))
    except Exception:  # not a group of this process (RuntimeError / ValueError, by release)
        return None


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
    """What a compiled program may have read from a mesh (ranks, their layout, device type,
    dimension names, owning thread): what torch 2.13's ``DeviceMesh`` ``guard_fn`` compares."""
    return [mesh._flatten_rank_map, mesh._layout, mesh._device_type, mesh._mesh_dim_names, mesh._thread_id]


def _device_mesh_options() -> dict[str, Any]:
    members = dict.fromkeys(_MESH_USE_REAL, Member.USE_REAL) | dict.fromkeys(_MESH_INLINED, Member.INLINED)
    return {"members": members, "guard_fn": _device_mesh_identity}


#: torch 2.13's entries for its own classes (members; ``DeviceMesh``'s guard), by
#: qualified name, for a release that registers none (torch 2.11): compiled code
#: uses the same members, with the same recompilations, on every release.
_TORCH_OWN_OPTIONS: dict[str, Callable[[], dict[str, Any]]] = {
    "torch.distributed.distributed_c10d.ProcessGroup": _process_group_options,
    "torch.distributed.device_mesh.DeviceMesh": _device_mesh_options,
}


def is_torch_own_opaque_type(cls: type) -> bool:
    """Whether torch registers ``cls`` as an opaque itself (``ProcessGroup``, ``DeviceMesh``:
    torch >= 2.12, when ``torch.distributed.tensor`` is first imported); :func:`register_opaque`
    registers them alike on every release."""
    return qualified_name(cls) in _TORCH_OWN_OPTIONS


def _member_options(cls: type, members: object) -> dict[str, Member]:
    """``members`` checked and normalised to torch's enum (strings ``"use_real"``
    and ``"inlined"``, the enum's values, are accepted)."""
    if not isinstance(members, Mapping):
        raise messages.members_not_a_mapping(cls, members)
    checked: dict[str, Member] = {}
    for member, how in members.items():
        if not isinstance(member, str) or not member.isidentifier():
            raise messages.member_name_not_an_attribute(cls, member)
        try:
            checked[member] = Member(how)  # a Member is returned as it is
        except ValueError:
            raise messages.member_use_unknown(cls, member, how) from None
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
    options: dict[str, Any] = {}
    if members is not None:
        options["members"] = _member_options(cls, members)
    if guard is not None:
        if not callable(guard):
            raise messages.guard_not_callable(cls, guard)
        if kind == "value":
            raise messages.guard_on_value(cls)
        options["guard_fn"] = guard
    if hoist:
        if hoist is not True:
            raise messages.hoist_not_a_bool(cls, hoist)
        if kind == "reference":
            raise messages.hoist_on_reference(cls)
        options["hoist"] = True
    if reconstruct is not None:
        if not callable(reconstruct):
            raise messages.reconstruct_not_callable(cls, reconstruct)
        if "reconstruct_fn" not in _api().table_fields():
            raise messages.reconstruct_unsupported(cls, torch.__version__)
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


def _checked_kind(cls: type, kind: str) -> OpaqueKind:
    """``kind`` in the library's names, once ``cls`` is known to be a class."""
    if not isinstance(cls, type):
        raise messages.not_a_class(cls)
    if kind not in KIND_ALIASES:
        raise messages.unknown_kind(cls, kind)
    return KIND_ALIASES[kind]


def _refuse_what_torch_handles(cls: type) -> None:
    """Builtins, tensors, torch's value types, pytree nodes: torch passes or flattens them itself."""
    if cls.__module__ == "builtins" or issubclass(cls, torch.Tensor):
        raise messages.builtin_or_tensor(cls)
    if is_torch_handled_type(cls):
        raise messages.handled_by_torch(cls)
    from torch.utils import _pytree as pytree

    if cls in pytree.SUPPORTED_NODES or (issubclass(cls, tuple) and hasattr(cls, "_fields")):
        raise messages.pytree_node(cls)


def _registered_already(api: RegistryAPI, cls: type, kind: OpaqueKind, options: Mapping[str, Any]) -> bool:
    """Whether torch has an entry for ``cls`` itself, of ``kind``, that ``options``
    (if any) agree with. A class's kind is fixed by its first registration, and
    a subclass has its registered base's (torch looks up through the MRO)."""
    table = api.torch_module()._OPAQUE_TYPES
    existing = _torch_kind(cls) or _KIND_BY_TYPE.get(cls)
    if existing is not None and existing != kind:
        raise messages.registered_as_other_kind(cls, existing, kind, through_base=cls not in table)
    info = table.get(cls)
    if existing is None or info is None:
        return False
    if options and not _same_options(info, options):
        raise messages.registered_with_other_options(cls, KIND_ALIASES.get(info.opaque_typ, info.opaque_typ), info)
    return True


def _enter_in_torch(api: RegistryAPI, cls: type, kind: OpaqueKind, options: Mapping[str, Any]) -> None:
    """Register a class torch has no entry for: through torch's function where
    its metaclass allows, else in torch's tables directly (see the Note)."""
    if kind == "value":
        _check_value_type_protocol(cls)
    name = f"{cls.__module__}.{cls.__qualname__}"
    if name in api.torch_module()._OPAQUE_TYPES_BY_NAME:
        raise messages.name_taken(cls, name)
    if isinstance(cls, api.base_metaclass()):
        api.register_in_torch(cls, kind, options)
    else:
        log.debug("entering %s in torch's opaque registry directly", qualified_name(cls))
        api.enter_in_tables(cls, kind, options)


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
        The class, inheriting :data:`OpaqueBase` or not (``DeviceMesh`` on torch 2.11).
    kind
        ``"reference"`` (default): its identity matters, ``__tensor_flatten__`` may list it;
        ``"value"``: a constant, for the flatten context (Note [Reference and value opaques]).
        torch 2.14's names, ``"symbolic"`` and ``"constant"``, are aliases on every release.
    members
        ``{name: Member}`` (:data:`Member`): what compiled code may use, any other raising
        :class:`opaque_subclass.OpaqueMemberError`; ``USE_REAL`` values are guarded on every release.
    guard
        Reference opaques: torch's ``guard_fn``, ``guard(obj) -> list`` of values compared on
        every call of a compiled function (a change recompiles).
    hoist
        Value opaques: a graph input instead of compiled in (torch's ``hoist``).
    reconstruct
        torch's ``reconstruct_fn`` (torch >= 2.12; refused on 2.11): how ``make_fx`` derives an
        untracked object from the graph's inputs.

    Registering a class again with the same kind does nothing, also after torch registered it;
    other options or the other kind raise :class:`ValueError` (torch cannot change a registration).
    """
    kind = _checked_kind(cls, kind)
    api = _api()
    _refuse_what_torch_handles(cls)
    options = _torch_options(cls, kind, members, guard, hoist, reconstruct)
    if not _run_torch_registration_hooks(cls) and not options and kind == "reference":
        options = _TORCH_OWN_OPTIONS.get(qualified_name(cls), dict)()
    with _LOCK:
        if not _registered_already(api, cls, kind, options):
            _enter_in_torch(api, cls, kind, options)
        _KIND_BY_TYPE[cls] = kind


def stored_opaque_leaves(plist: Any) -> frozenset[int]:
    """Which ``original{i}`` of a ``torch.nn.utils.parametrize.ParametrizationList`` hold
    reference opaques: plain attributes (neither parameter nor buffer; torch 2.12+ and the 2.11
    backport), read from the list itself so that nothing of the library's is kept on torch's object."""
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
