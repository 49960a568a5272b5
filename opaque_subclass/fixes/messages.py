"""The errors and notes of the fixes (undeclared members, opaques made while tracing, a
deleted parametrization leaf, the user code Dynamo traced), one constructor per situation;
the checks stay where they run."""

from __future__ import annotations

import functools
from typing import TypeVar

from opaque_subclass.core.errors import (
    OpaqueMemberError,
    OpaqueSubclassError,
    import_fix,
    qualified_name,
    subject,
    submodule_expression,
)
from opaque_subclass.core.registry import Member

__all__ = [
    "MISSING_LEAF_REASON",
    "TORCH_SENTENCE",
    "created_while_tracing",
    "deleted_leaf",
    "subclass_made_opaque",
    "undeclared_member",
    "undeclared_member_error",
    "user_code_note",
]

_E = TypeVar("_E", bound=Exception)

#: How torch's ``UnsafeScriptObjectError`` starts here (2.12 - 2.15); ours starts so too.
TORCH_SENTENCE = "Attempted to access unregistered member on an OpaqueObject"


@functools.cache
def undeclared_member_error() -> type[OpaqueMemberError]:
    """The error class for an undeclared member in compiled code, both
    ``OpaqueMemberError`` and torch's ``UnsafeScriptObjectError``; made on
    first use (Dynamo is imported late)."""
    from torch._dynamo.exc import UnsafeScriptObjectError

    class UndeclaredMemberError(OpaqueMemberError, UnsafeScriptObjectError):
        """An undeclared opaque member used in compiled code (printed as ``OpaqueMemberError``)."""

    UndeclaredMemberError.__module__ = OpaqueMemberError.__module__
    UndeclaredMemberError.__name__ = UndeclaredMemberError.__qualname__ = OpaqueMemberError.__name__
    return UndeclaredMemberError


# ---------------------------------------------------------------------- members (fixes/members.py)


def undeclared_member(cls: type, name: str, path: str | None, line: str, method: bool) -> OpaqueMemberError:
    """``name`` of ``cls`` (a method when ``method``), read at ``path`` (``None``: no source)."""
    if cls.__module__.split(".")[0] == "torch":
        fix = (
            f"torch registers {cls.__qualname__} itself and its registration cannot be changed: read "
            f"{name!r} outside the compiled function and pass the value in as an argument."
        )
    else:
        how = (
            " (USE_REAL calls it on the real object while tracing and guards the result compiled in; "
            "Member.INLINED traces the call instead)"
            if method
            else " (USE_REAL reads it while tracing and guards the value compiled in)"
        )
        call = f'opaque_subclass.register_opaque({{cls}}, members={{{{"{name}": opaque_subclass.Member.USE_REAL}}}})'
        fix = "declare it where the class is registered (the first registration), " + import_fix(cls, call) + how
    at = "an opaque made in the graph" if path is None else path
    return undeclared_member_error()(
        f"{TORCH_SENTENCE}: compiled code uses {name!r} of {qualified_name(cls)} (at {at}.{name}, {line}), a member "
        "its opaque registration does not declare, so torch.compile does not know whether to evaluate it "
        f"on the real object or trace it. Fix: {fix}"
    )


def subclass_made_opaque(cls: type, name: str, member: Member, attr: str, line: str) -> OpaqueMemberError:
    use = f"x.{attr}[...]" if name == "__getitem__" else f"x.{attr}.{name}"
    how = "read on the real object and guarded" if member == Member.USE_REAL else "traced"
    return OpaqueMemberError(
        f"compiled code uses {name!r} ({member.name}) of {qualified_name(cls)} read from attribute {attr!r} of a "
        f"tensor subclass computed inside the compiled function ({line}). torch 2.11 has no source "
        "for such an opaque: a USE_REAL member would be compiled in unguarded (the first call's value for every "
        "call) and an INLINED one cannot be traced. Fix: use the member of the input's attribute instead "
        f"({use}, {how}), or pass the value in as an argument."
    )


# ---------------------------------------------------------------------- opaques made while tracing (traced_opaques.py)


def created_while_tracing(error: type[_E], obj: object) -> _E:
    cls = type(obj)
    pass_in = import_fix(cls, 'opaque_subclass.register_opaque({cls}, kind="value")')
    return error(
        f"a reference opaque {subject(cls)} was created while torch traced the program (in a tensor "
        "subclass's __torch_dispatch__, a fake kernel, or a forward under non-strict torch.export) and "
        "used by the graph: torch would compile that one object into the graph as a constant, shared by every "
        "call, where eager creates a new one per call (pytorch/pytorch#176044: silently wrong results). Fix: "
        "create it outside the compiled function and pass it in (an argument, or an attribute the subclass "
        f"lists in __tensor_flatten__), or, if it never changes, register it as a value opaque: {pass_in}"
    )


# ---------------------------------------------------------------------- a deleted parametrization leaf (parametrize_originals.py)

#: Why torch.compile does not trace the check of a missing leaf (a graph break's reason).
MISSING_LEAF_REASON = (
    "a leaf of a parametrization is missing; the library names it in eager code "
    "(opaque_subclass.fixes.parametrize_originals): call without fullgraph=True to read it"
)


def deleted_leaf(
    leaf: str, full: str | None, name: str | None, path: str | None, cls: type | None, owner: type | None
) -> OpaqueSubclassError:
    """Leaf ``leaf`` of the parametrization of ``full`` (``"layer.w"`` from the root module, when
    the library's own) or of the tensor ``name``, the opaque at ``path`` of ``owner``, missing."""
    if full:
        holder, _, attr = full.rpartition(".")
        where = f"{submodule_expression(holder)}.parametrizations.{attr}"
        module = "the module unwrap_subclass_parameters was called on"
    else:
        where = f"module.parametrizations.{name}" if name else "module.parametrizations[name]"
        module = "the module holding the parametrized tensor" + ("" if name else ", name: its name")
    held = f"a {qualified_name(cls)} (a reference opaque)" if cls is not None else "the reference opaque stored there"
    about = f"the parametrization rebuilding {subject(owner)}" if owner is not None else "a parametrization"
    of = f", the opaque the subclass holds at {path}" if path is not None else ""
    return OpaqueSubclassError(
        f"{about}: {where}.{leaf}{of}, is missing (found: nothing; it was deleted), so the "
        "parametrized tensor cannot be rebuilt. (torch would report the parametrized attribute itself as "
        "missing, because the read fails inside its property.) "
        f"Fix: store the opaque again, `{where}.{leaf} = value` (value: {held}; module: {module})."
    )


# ---------------------------------------------------------------------- Dynamo's wrappers (dynamo_errors.py)


def user_code_note(frames: str) -> str:
    """The note keeping the ``from user code:`` frames of the wrapper Dynamo raised."""
    return "torch.compile raised it while tracing this user code:\n" + frames
