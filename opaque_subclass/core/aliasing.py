"""Which flat slots hold the same opaque object.

A graph may rely on inputs sharing one opaque (reading it once), so guards
compare the call's :class:`OpaqueAliasPattern` with the compile-time one. It
compares identity, never equality, and holds no reference to the objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from opaque_subclass.core.registry import opaque_kind, real_object

__all__ = ["OpaqueAliasPattern", "opaque_alias_pattern"]

_NOT_OPAQUE = (torch.Tensor, int, float, bool, str, type(None), torch.SymInt, torch.SymFloat, torch.SymBool)


@dataclass(frozen=True, slots=True)
class OpaqueAliasPattern:
    """Identity pattern of the opaques in a flat argument list.

    Attributes
    ----------
    slots
        Flat indices holding a reference opaque, ascending.
    owners
        For each of ``slots``, the first flat index holding the same object.

    Hashable; equal exactly when the same slots hold and share opaques.
    """

    slots: tuple[int, ...]
    owners: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        by_owner: dict[int, list[int]] = {}
        for s, o in zip(self.slots, self.owners, strict=True):
            by_owner.setdefault(o, []).append(s)
        object.__setattr__(self, "groups", tuple(tuple(g) for g in by_owner.values()))

    @property
    def shared(self) -> tuple[tuple[int, ...], ...]:
        """Groups of two or more slots holding one object."""
        return tuple(g for g in self.groups if len(g) > 1)

    @property
    def has_sharing(self) -> bool:
        return len(self.groups) != len(self.slots)


def _identity(obj: object) -> int:
    return id(real_object(obj))


def opaque_alias_pattern(flat_args: Sequence[Any]) -> OpaqueAliasPattern:
    """The :class:`OpaqueAliasPattern` of ``flat_args`` (unwrapped leaves); torch's
    fake wrappers of one object share."""
    first: dict[int, int] = {}
    slots: list[int] = []
    owners: list[int] = []
    for i, a in enumerate(flat_args):
        if isinstance(a, _NOT_OPAQUE) or opaque_kind(a) != "reference":
            continue
        slots.append(i)
        owners.append(first.setdefault(_identity(a), i))
    return OpaqueAliasPattern(tuple(slots), tuple(owners))
