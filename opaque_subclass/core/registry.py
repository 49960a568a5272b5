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
from typing import TYPE_CHECKING, get_args

import torch

from opaque_subclass._versions import OpaqueKind, RegistryAPI, current
from opaque_subclass.core.errors import describe_type, import_fix, qualified_name

__all__ = [
    "KIND_ALIASES",
    "OpaqueBase",
    "OpaqueKind",
    "is_opaque",
    "is_torch_handled_type",
    "opaque_kind",
    "opaque_type_of",
    "register_opaque",
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
            f"{'; '.join(current().differences) or 'no opaque registry'}. "
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
        raise TypeError(
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


def _run_torch_registration_hooks(cls: type) -> None:
    import importlib

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


def register_opaque(cls: type, kind: str = "reference") -> None:
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

    Registering a class again with the same kind does nothing, also when torch
    registered it first. Registering it again with the other kind raises
    :class:`ValueError`.
    """
    if not isinstance(cls, type):
        raise TypeError(
            f"register_opaque expects a class, got an instance of {describe_type(cls)}. "
            f"Fix: pass the class itself, e.g. register_opaque(type(obj))."
        )
    if kind not in KIND_ALIASES:
        raise ValueError(
            f"register_opaque({cls.__qualname__}, kind={kind!r}): kind must be "
            '"reference" or "value" (torch 2.14\'s names "symbolic" and "constant" are '
            f'accepted too). Fix: register_opaque({cls.__qualname__}, kind="reference").'
        )
    kind = KIND_ALIASES[kind]
    api = _api()
    if cls.__module__ == "builtins" or issubclass(cls, torch.Tensor):
        raise TypeError(
            f"cannot register {qualified_name(cls)} as an opaque type: builtins and tensors "
            "are handled by torch directly. Fix: wrap the value in a class of your own "
            "and register that class."
        )
    if is_torch_handled_type(cls):
        raise TypeError(
            f"cannot register {qualified_name(cls)} as an opaque type: torch.compile handles "
            f"{cls.__qualname__} values itself (as constants it specializes on), and an "
            "opaque registration would change that for every compiled program in the process, "
            "irreversibly. Fix: keep such a value in the flatten context (the second value "
            "__tensor_flatten__ returns), or as a plain Python attribute read outside the "
            "compiled region."
        )
    from torch.utils import _pytree as pytree

    if cls in pytree.SUPPORTED_NODES or (issubclass(cls, tuple) and hasattr(cls, "_fields")):
        raise TypeError(
            f"cannot register {qualified_name(cls)} as an opaque type: it is a pytree node, "
            "so torch would flatten it instead of passing it as one object. Fix: "
            "unregister it from pytree or wrap it in a class that is not a pytree node."
        )
    _run_torch_registration_hooks(cls)
    with _LOCK:
        # The kind of a class is fixed by its first registration, and a subclass
        # has the kind of its registered base: torch answers lookups through the MRO.
        existing = _torch_kind(cls) or _KIND_BY_TYPE.get(cls)
        if existing is not None and existing != kind:
            raise ValueError(
                f"{qualified_name(cls)} is already registered as a {existing} opaque"
                + ("" if cls in api.torch_module()._OPAQUE_TYPES else " (through a base class)")
                + f"; it cannot also be a {kind} opaque. Fix: keep one registration, "
                f'register_opaque({cls.__qualname__}, kind="{existing}").'
            )
        if existing is not None and cls in api.torch_module()._OPAQUE_TYPES:
            _KIND_BY_TYPE[cls] = kind
            return
        if kind == "value":
            _check_value_type_protocol(cls)
        if isinstance(cls, api.base_metaclass()):
            api.register_in_torch(cls, kind)
        else:
            log.debug("entering %s in torch's opaque registry directly", qualified_name(cls))
            api.enter_in_tables(cls, kind)
        # A class registered now may have subclasses looked up before; they are
        # never cached negatively, so only the class itself needs an entry.
        _KIND_BY_TYPE[cls] = kind
