"""What rows of the release table share: texts, and the shape of a native release's row."""

from __future__ import annotations

from opaque_subclass.releases.fix_table import fix_rows
from opaque_subclass.releases.schema import Difference, RegistryAPI, ReleaseSupport
from opaque_subclass.releases.sources import recorded_sources

__all__ = ["ATTRIBUTE_SOURCE_ENTRIES", "ATTRIBUTE_SOURCE_TEXT", "FOREIGN_ISINSTANCE", "native_release"]

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


def native_release(
    release: tuple[int, int],
    registry: RegistryAPI,
    *,
    differences: tuple[Difference, ...] = (),
    limits: tuple[str, ...] = (),
) -> ReleaseSupport:
    """The row of a release with opaque attributes of its own (2.12 and newer): the fixes of
    the table that apply to it (``releases/fix_table.py``), the digests of the torch files
    their fingerprints are read from (``releases/sources.json``), and its own differences and
    limits after :data:`FOREIGN_ISINSTANCE`."""
    return ReleaseSupport(
        release,
        "native",
        registry,
        fixes=fix_rows(release),
        differences=differences,
        limits=(FOREIGN_ISINSTANCE, *limits),
        sources=recorded_sources(release),
    )
