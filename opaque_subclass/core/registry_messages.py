"""The errors of :func:`opaque_subclass.register_opaque`, each with a fix that runs as written."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from opaque_subclass.core.errors import OpaqueTypeError, OpaqueValueError, describe_type, import_fix, qualified_name

__all__ = [
    "builtin_or_tensor",
    "guard_not_callable",
    "guard_on_value",
    "handled_by_torch",
    "hoist_not_a_bool",
    "hoist_on_reference",
    "member_name_not_an_attribute",
    "member_use_unknown",
    "members_not_a_mapping",
    "name_taken",
    "no_opaque_registry",
    "not_a_class",
    "pytree_node",
    "reconstruct_not_callable",
    "reconstruct_unsupported",
    "registered_as_other_kind",
    "registered_with_other_options",
    "unknown_kind",
    "value_type_lacks",
]

_E = TypeVar("_E", bound=Exception)

#: What a value opaque needs, by method name, as :func:`value_type_lacks` says it.
_VALUE_PROTOCOL = {
    "__eq__": "__eq__ (compiled graphs are guarded on equality)",
    "__hash__": "__hash__ consistent with __eq__ (used for fake-tensor caching)",
    "__fx_repr__": "__fx_repr__ returning (source, {name: type}) that rebuilds the value in generated code",
}


def no_opaque_registry(torch_version: str, differences: Iterable[object]) -> RuntimeError:
    return RuntimeError(
        f"opaque types are not supported on torch {torch_version}: "
        f"{'; '.join(map(str, differences)) or 'no opaque registry'}. "
        "Fix: python -m pip install 'torch>=2.11'"
    )


def not_a_class(obj: object) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"register_opaque expects a class, got an instance of {describe_type(obj)}. "
        "Fix: pass the class itself, e.g. register_opaque(type(obj))."
    )


def _option_error(error: type[_E], cls: type, given: str, problem: str, fix: str) -> _E:
    """``register_opaque(Cls<given>): <problem> Fix: register_opaque(Cls<fix>.``"""
    name = cls.__qualname__
    return error(f"register_opaque({name}{given}): {problem} Fix: register_opaque({name}{fix}.")


def unknown_kind(cls: type, kind: object) -> OpaqueValueError:
    problem = 'kind must be "reference" or "value" (torch 2.14\'s names "symbolic" and "constant" are accepted too).'
    return _option_error(OpaqueValueError, cls, f", kind={kind!r}", problem, ', kind="reference")')


def builtin_or_tensor(cls: type) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"cannot register {qualified_name(cls)} as an opaque type: builtins and tensors "
        "are handled by torch directly. Fix: wrap the value in a class of your own "
        "and register that class."
    )


def handled_by_torch(cls: type) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"cannot register {qualified_name(cls)} as an opaque type: torch.compile handles "
        f"{cls.__qualname__} values itself (as constants it specializes on), and an "
        "opaque registration would change that for every compiled program in the process, "
        "irreversibly. Fix: keep such a value in the flatten context (the second value "
        "__tensor_flatten__ returns), or as a plain Python attribute read outside the "
        "compiled region."
    )


def pytree_node(cls: type) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"cannot register {qualified_name(cls)} as an opaque type: it is a pytree node, "
        "so torch would flatten it instead of passing it as one object. Fix: "
        "unregister it from pytree or wrap it in a class that is not a pytree node."
    )


_SIZE_MEMBER = ', members={"size": opaque_subclass.Member.USE_REAL})'


def members_not_a_mapping(cls: type, members: object) -> OpaqueTypeError:
    problem = f"members must map member names to opaque_subclass.Member values, got {describe_type(members)}."
    return _option_error(OpaqueTypeError, cls, ", members=...", problem, _SIZE_MEMBER)


def member_name_not_an_attribute(cls: type, member: object) -> OpaqueTypeError:
    problem = f"member names must be attribute names, got {member!r} ({describe_type(member)})."
    return _option_error(OpaqueTypeError, cls, ", members=...", problem, _SIZE_MEMBER)


def member_use_unknown(cls: type, member: str, how: object) -> OpaqueTypeError:
    problem = (
        f"members[{member!r}] is {how!r} ({describe_type(how)}); it must say how compiled code uses the member: "
        "opaque_subclass.Member.USE_REAL (read on the real object while tracing, compiled in as a constant and "
        "guarded) or opaque_subclass.Member.INLINED (traced)."
    )
    return _option_error(
        OpaqueTypeError, cls, ", members=...", problem, f", members={{{member!r}: opaque_subclass.Member.USE_REAL}})"
    )


def guard_not_callable(cls: type, guard: object) -> OpaqueTypeError:
    problem = (
        "guard must be a function of the object that returns the values to compare on every call, got "
        f"{describe_type(guard)}."
    )
    return _option_error(OpaqueTypeError, cls, ", guard=...", problem, ", guard=lambda obj: [obj.size()])")


def guard_on_value(cls: type) -> OpaqueValueError:
    problem = "a value opaque is guarded by its __eq__ already; guard is for reference opaques."
    return _option_error(OpaqueValueError, cls, ', kind="value", guard=...', problem, ', kind="value") (drop guard=)')


def hoist_not_a_bool(cls: type, hoist: object) -> OpaqueTypeError:
    problem = f"hoist is a bool, got {describe_type(hoist)}."
    return _option_error(OpaqueTypeError, cls, ", hoist=...", problem, ', kind="value", hoist=True)')


def hoist_on_reference(cls: type) -> OpaqueValueError:
    problem = (
        "hoist lifts a *value* opaque to a graph input instead of compiling it in; a reference opaque is always a "
        "graph input."
    )
    return _option_error(OpaqueValueError, cls, ", hoist=True", problem, ', kind="reference") (drop hoist=)')


def reconstruct_not_callable(cls: type, reconstruct: object) -> OpaqueTypeError:
    problem = (
        f"reconstruct must be a function (obj, get_proxy, tracer) -> proxy or None, got {describe_type(reconstruct)}."
    )
    return _option_error(
        OpaqueTypeError, cls, ", reconstruct=...", problem, ", reconstruct=lambda obj, get_proxy, tracer: None)"
    )


def reconstruct_unsupported(cls: type, torch_version: str) -> OpaqueValueError:
    problem = (
        f"torch {torch_version} has no reconstruct hook for opaques (torch 2.12 added it to make_fx); the library "
        "does not emulate it, so a backward closure holding such an object is kept as a constant."
    )
    fix = ") without reconstruct=, or python -m pip install 'torch>=2.12'"
    return _option_error(OpaqueValueError, cls, ", reconstruct=...", problem, fix)


def registered_as_other_kind(cls: type, existing: str, kind: str, through_base: bool) -> OpaqueValueError:
    return OpaqueValueError(
        f"{qualified_name(cls)} is already registered as a {existing} opaque"
        + (" (through a base class)" if through_base else "")
        + f"; it cannot also be a {kind} opaque. Fix: keep one registration, "
        f'register_opaque({cls.__qualname__}, kind="{existing}").'
    )


def _describe_entry(kind: str, info: Any) -> str:
    """A torch registry entry's kind and options, as a message lists them."""
    parts = [f"kind {kind}"]
    if info.members:
        parts.append(f"members {sorted(info.members)}")
    if info.guard_fn is not None:
        parts.append("a guard")
    if getattr(info, "hoist", False):
        parts.append("hoist")
    if getattr(info, "reconstruct_fn", None) is not None:
        parts.append("a reconstruct function")
    return ", ".join(parts)


def registered_with_other_options(cls: type, kind: str, info: Any) -> OpaqueValueError:
    return OpaqueValueError(
        f"{qualified_name(cls)} is registered already ({_describe_entry(kind, info)}), and torch "
        "cannot change a registration. Fix: keep the registration it has, "
        + import_fix(cls, "opaque_subclass.register_opaque({cls})")
        + "; to change its options, pass them to the first registration (run before "
        "anything uses the class) in a fresh process."
    )


def value_type_lacks(cls: type, missing: Iterable[str]) -> OpaqueTypeError:
    """``missing``: names of :data:`_VALUE_PROTOCOL`'s methods, in its order."""
    return OpaqueTypeError(
        f"cannot register {qualified_name(cls)} as a value-type opaque: it lacks "
        + "; ".join(_VALUE_PROTOCOL[method] for method in missing)
        + ". A value opaque is a constant that torch.compile compares and bakes in. "
        "Fix: define the missing methods, or register it as a reference opaque if "
        "its identity matters: " + import_fix(cls, 'opaque_subclass.register_opaque({cls}, kind="reference")')
    )


def name_taken(cls: type, name: str) -> OpaqueValueError:
    return OpaqueValueError(
        f"cannot register {name}: another class of that name is registered already (torch "
        "keys opaque types by module and qualified name, for every process that loads a "
        "compiled program). Fix: give the class a name of its own, `class "
        f"{cls.__name__}2({', '.join(b.__name__ for b in cls.__bases__)}): ...`, and register "
        "that one."
    )
