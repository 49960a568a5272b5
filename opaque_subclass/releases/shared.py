"""Texts of the release table that several releases share."""

from __future__ import annotations

__all__ = ["ATTRIBUTE_GUARD_TEXT", "FOREIGN_ISINSTANCE"]

#: A limit of every supported release.
FOREIGN_ISINSTANCE = (
    "isinstance(obj, C) inside a compiled region is False for a registered class C "
    "that does not inherit opaque_subclass.OpaqueBase (it sees torch's fake wrapper)"
)

#: A difference of torch 2.11 and 2.12 from the newest release.
ATTRIBUTE_GUARD_TEXT = (
    "a recompile reason on an opaque's attribute reads object.__getattribute__(t._gauge, 'offset') == 2 "
    "(Dynamo 2.11 and 2.12 trace the read through the fake wrapper's __getattribute__ and name the "
    "attribute source after that call, as stock torch does; 2.13 and newer write t._gauge.offset == 2); "
    "the guard itself is the same"
)
