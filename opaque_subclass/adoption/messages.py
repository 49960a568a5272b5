"""The errors of :func:`opaque_subclass.adopt`: each names the class, the
attribute and path, the type found, and a fix that runs as written."""

from __future__ import annotations

from typing import Any

from opaque_subclass.core.errors import (
    OpaqueAttributeError,
    OpaqueSubclassError,
    OpaqueTypeError,
    OpaqueValueError,
    describe_type,
    import_fix,
    qualified_name,
    subject,
)
from opaque_subclass.core.registry import is_torch_handled_type, opaque_kind, opaque_type_of

__all__ = [
    "REPLACED_AFTER_ADOPTION",
    "adopt_while_compiling",
    "adopted_elsewhere",
    "bad_declaration",
    "bad_path",
    "missing_opaque",
    "name_flattened",
    "name_not_identifier",
    "name_on_class",
    "name_shadows_tensor",
    "not_a_subclass",
    "path_not_found",
    "path_shared",
    "set_adopted",
    "unregistered_type",
    "wrong_example",
    "wrong_type_at_path",
    "wrong_type_in_slot",
]

#: The warning (a ``logging`` format: class, method) when a method adopt installed was replaced since.
REPLACED_AFTER_ADOPTION = "%s.%s was replaced by someone else after it was adopted; left as it is"


def _adopt_call(cls: type, name: str, path: str, opaque_cls: type | str) -> str:
    """``import ...; opaque_subclass.adopt(Cls, {...})`` as a runnable fix (the
    opaque's class imported too, unless it is a placeholder name)."""
    opaque = opaque_cls if isinstance(opaque_cls, str) else opaque_cls.__qualname__
    call = f"opaque_subclass.adopt({{cls}}, {{{{{name!r}: opaque_subclass.ContextOpaque({path!r}, {opaque})}}}})"
    if isinstance(opaque_cls, type) and _importable(opaque_cls) and opaque_cls.__module__ != cls.__module__:
        call = f"from {opaque_cls.__module__} import {opaque}; " + call
    return import_fix(cls, call)


def _importable(cls: type) -> bool:
    return "<locals>" not in cls.__qualname__ and cls.__module__ not in ("__main__", "builtins")


def not_a_subclass(cls: object) -> OpaqueTypeError:
    shown = qualified_name(cls) if isinstance(cls, type) else f"an instance of {describe_type(cls)}"
    return OpaqueTypeError(
        f"opaque_subclass.adopt takes a tensor subclass that defines __tensor_flatten__ and "
        f"__tensor_unflatten__, got {shown}. Fix: pass the class whose flatten context holds the object "
        "(type(x) for an instance x of it)."
    )


def bad_declaration(cls: type, name: object, value: object) -> OpaqueTypeError:
    path = value if isinstance(value, str) else "[0].mesh"
    return OpaqueTypeError(
        f"{subject(cls)}: adopt's opaques[{name!r}] must be an opaque_subclass.ContextOpaque(path, cls) "
        f"(where the object sits in the flatten context, and its registered class), got {describe_type(value)}. "
        f"Fix: opaques = {{{str(name)!r}: opaque_subclass.ContextOpaque({path!r}, C)}} with C the object's "
        "class (DeviceMesh for a mesh)."
    )


def _bad_name(cls: type, name: object, why: str) -> OpaqueValueError:
    fixed = "_adopted_" + "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in str(name)).strip("_")
    return OpaqueValueError(
        f"{subject(cls)}: adopt's attribute name {name!r} {why}; it becomes an attribute of "
        f"{cls.__qualname__} listed by __tensor_flatten__. Fix: name it e.g. {fixed!r}."
    )


def name_not_identifier(cls: type, name: object) -> OpaqueValueError:
    return _bad_name(cls, name, "is not an attribute name")


def name_shadows_tensor(cls: type, name: str) -> OpaqueValueError:
    return _bad_name(cls, name, f"would shadow torch.Tensor.{name}")


def name_on_class(cls: type, name: str) -> OpaqueValueError:
    return _bad_name(cls, name, f"is an attribute of {cls.__qualname__} already")


def name_flattened(cls: type, name: str) -> OpaqueValueError:
    return _bad_name(cls, name, "is listed by its __tensor_flatten__ already")


def path_shared(cls: type, name: str, path: str) -> OpaqueValueError:
    return _bad_name(cls, name, f"shares its path {path!r} with another declaration")


def bad_path(cls: type, name: str, path: object, opaque_cls: type) -> OpaqueValueError:
    return OpaqueValueError(
        f"{subject(cls)}: adopt's opaques[{name!r}] has path {path!r}, which is not a path into a "
        "flatten context: steps are .attribute, [index] or ['key'] (the notation of lint OSC001's "
        "'<context>' paths), e.g. '.mesh' or \"[0].mesh\". Fix: "
        + _adopt_call(cls, name, "[0].mesh" if isinstance(path, str) and path.startswith("[") else ".mesh", opaque_cls)
    )


def unregistered_type(cls: type, name: str, path: object, opaque_cls: object, kind: str | None) -> OpaqueTypeError:
    at = f"opaques[{name!r}] (at {path!r})"
    if not isinstance(opaque_cls, type):
        return OpaqueTypeError(
            f"{subject(cls)}: adopt's {at} names {describe_type(opaque_cls)} (an instance) as "
            "the opaque's class. Fix: name its class, `opaque_subclass.ContextOpaque(path, type(obj))`."
        )
    if kind == "value" or opaque_cls.__module__ == "builtins" or is_torch_handled_type(opaque_cls):
        shown = opaque_cls.__qualname__ if opaque_cls.__module__ == "builtins" else qualified_name(opaque_cls)
        return OpaqueTypeError(
            f"{subject(cls)}: adopt's {at} names {shown}, a value that torch.compile compares "
            "and compiles in: it stays in the flatten context, where the guard on equality is right for it. "
            "Only objects whose identity matters (a mesh, a process group) are adopted. Fix: drop "
            f"{name!r} from the declaration."
        )
    return OpaqueTypeError(
        f"{subject(cls)}: adopt's {at} names {qualified_name(opaque_cls)}, which is not a "
        "registered reference opaque: an adopted object becomes a graph input passed by identity, which "
        "torch allows only for registered reference opaques. Fix: register it first, "
        + import_fix(opaque_cls, "opaque_subclass.register_opaque({cls})")
    )


def adopted_elsewhere(cls: type, existing: Any) -> OpaqueValueError:
    return OpaqueValueError(
        f"{subject(cls)} is adopted already, with {existing.describe()}; a class is adopted once. Fix: "
        + import_fix(cls, "opaque_subclass.unadopt({cls})")
        + " first, then adopt it with the new declaration."
    )


def _fix_with_suggestion(cls: type, name: str, path: str, opaque_cls: type, suggestion: str | None) -> str:
    """``; a Mesh sits at '[0].mesh'. Fix: <adopt with that path>`` (or a fix on the declared path)."""
    if suggestion is not None:
        return f"; a {opaque_cls.__qualname__} sits at {suggestion!r}. Fix: " + _adopt_call(
            cls, name, suggestion, opaque_cls
        )
    return (
        f". Fix: declare the path of a {opaque_cls.__qualname__} in the context (lint OSC001 reports the "
        "paths of objects that stand for one), or leave the attribute out; there is none in this context"
    )


def path_not_found(cls: type, name: str, path: str, stopped_at: str, step: str, found: object,
                   opaque_cls: type, suggestion: str | None) -> OpaqueAttributeError:  # fmt: skip
    where = f"at {stopped_at!r}" if stopped_at else "as the context itself"
    return OpaqueAttributeError(
        f"{subject(cls)}: adopt's opaques[{name!r}] has path {path!r}, but the flatten context holds a "
        f"{describe_type(found)} {where}, which has no {step!r}"
        + _fix_with_suggestion(cls, name, path, opaque_cls, suggestion)
    )


def wrong_type_at_path(cls: type, name: str, path: str, found: object, opaque_cls: type,
                       suggestion: str | None) -> OpaqueTypeError:  # fmt: skip
    found_cls = opaque_type_of(found)
    if suggestion is None and opaque_kind(found_cls) == "reference":
        fix = f". Fix: declare its class, {_adopt_call(cls, name, path, found_cls)}"
    else:
        fix = _fix_with_suggestion(cls, name, path, opaque_cls, suggestion)
    return OpaqueTypeError(
        f"{subject(cls)}: adopt's opaques[{name!r}] expects a {qualified_name(opaque_cls)} at {path!r} of "
        f"the flatten context, found {describe_type(found)}" + fix
    )


def wrong_type_in_slot(cls: type, name: str, found: object, opaque_cls: type) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"{subject(cls)}.__tensor_unflatten__ got {describe_type(found)} for the adopted opaque {name!r}, "
        f"which must be a {qualified_name(opaque_cls)}. Fix: pass the {opaque_cls.__qualname__} itself, "
        f"inner[{name!r}] = x.{name} for an instance x of {cls.__qualname__}."
    )


def missing_opaque(cls: type, name: str, path: str) -> OpaqueSubclassError:
    return OpaqueSubclassError(
        f"{subject(cls)}.__tensor_unflatten__ was called without the adopted opaque {name!r}, and the "
        f"context's {path!r} is the placeholder an adopted __tensor_flatten__ leaves there, not the "
        f"object: there is nothing to rebuild the instance with. Fix: pass the object in inner[{name!r}] "
        f"(x.{name} for the instance x the context came from), or rebuild from a context that holds it "
        "(the class's own, read before adopting); code you do not own that does this is a limit of the "
        "adoption (docs/adopting.md)."
    )


def set_adopted(cls: type, name: str, path: str) -> OpaqueAttributeError:
    return OpaqueAttributeError(
        f"{subject(cls)}.{name} is adopted: it is read from the flatten context's {path!r}, never set. "
        f"Fix: build a new {cls.__qualname__} whose context holds the object."
    )


def wrong_example(cls: type, example: object) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"{subject(cls)}: adopt's example must be an instance of {cls.__qualname__}, got "
        f"{describe_type(example)}. Fix: pass example=x for an instance x of {cls.__qualname__}, or leave "
        "example out (the declaration is then checked on the first flatten)."
    )


def adopt_while_compiling(cls: object) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"opaque_subclass.adopt({getattr(cls, '__qualname__', cls)}, ...) was called inside torch.compile; "
        "an adoption changes a class for every program. Fix: adopt before compiling (when your script "
        "starts)."
    )
