"""Texts of the release table that several releases share."""

from __future__ import annotations

__all__ = ["ATTRIBUTE_SOURCE_ENTRIES", "ATTRIBUTE_SOURCE_TEXT", "FOREIGN_ISINSTANCE"]

#: A limit of every supported release.
FOREIGN_ISINSTANCE = (
    "isinstance(obj, C) inside a compiled region is False for a registered class C "
    "that does not inherit opaque_subclass.OpaqueBase (it sees torch's fake wrapper)"
)

#: A difference of torch 2.11 and 2.12 from the newest release, and its entries.
ATTRIBUTE_SOURCE_TEXT = (
    "Dynamo 2.11 and 2.12 trace an attribute read of an opaque (a USE_REAL member) through torch's fake "
    "wrapper's __getattribute__ and name its source after that call, as stock torch 2.12 does: a recompile "
    "reason reads object.__getattribute__(t._gauge, 'offset') == 2 and an opaque read so is a graph input "
    "named object_getattribute_l_b_shelved_ (2.13 and newer: t._gauge.offset == 2, l_b_shelved); the guard "
    "and the graph are otherwise the same"
)
ATTRIBUTE_SOURCE_ENTRIES = (
    "members/attribute-use-real",
    "collectives/functional-all-reduce",
    "torch-parity/graph-inputs-of-an-opaque-attribute",
    "torch-parity/graph-inputs-of-a-list-of-opaques-attribute",
)
