"""Tables keyed by an object's ``id`` whose entries leave with the object."""

from __future__ import annotations

import weakref
from collections.abc import MutableMapping
from typing import Any

__all__ = ["remember"]


def remember(table: MutableMapping[int, Any], key: int, referent: object, *values: Any) -> tuple[Any, ...]:
    """Store ``(weak reference to referent, *values)`` in ``table`` under ``key`` (the ``id`` of
    ``referent``, or of an object that holds it) and return the entry. The entry leaves ``table``
    when ``referent`` is collected, so ``key`` never names another object's entry there."""
    entry = (weakref.ref(referent, lambda _: table.pop(key, None)), *values)
    table[key] = entry
    return entry
