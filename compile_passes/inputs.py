"""Diagnostics: describe the flat inputs a graph receives for a list of arguments.

Example::

    >>> report = explain_flat_inputs([w, x], names=["w", "x"])
    >>> print(report)
    slot  kind    path          type
       0  tensor  w._data       torch.Tensor
       1  opaque  w._mesh       torch.distributed.device_mesh.DeviceMesh  shared with 3
       2  tensor  x             torch.Tensor
       3  opaque  x._mesh ...

Built on unwrapping's slot walk (:func:`opaque_subclass.iter_slots`): slots are placeholder indices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from opaque_subclass import (
    OpaqueAliasPattern,
    OpaqueSlot,
    SymIntSlot,
    TensorSlot,
    describe_args,
    iter_slots,
    opaque_alias_pattern,
    unwrap_args,
)
from opaque_subclass.core.errors import qualified_name
from opaque_subclass.core.registry import opaque_type_of

from . import messages

__all__ = ["FlatInput", "InputReport", "explain_flat_inputs"]

InputKind = Literal["tensor", "opaque", "symint", "value"]


@dataclass(frozen=True, slots=True)
class FlatInput:
    """One flat input slot.

    Attributes
    ----------
    index
        Position in the flat input list (the graph placeholder index).
    kind
        ``"tensor"``, ``"opaque"``, ``"symint"`` or ``"value"`` (passed through).
    path
        Where the value came from, e.g. ``"w._inner._mesh"``.
    type_name
        Qualified name of the value's type.
    shares_with
        For an opaque, the other slots holding the very same object.
    value_type
        The value's type (seen through torch's fake wrapper of an opaque).
    """

    index: int
    kind: InputKind
    path: str
    type_name: str
    shares_with: tuple[int, ...] = ()
    value_type: type | None = None


@dataclass(frozen=True, slots=True)
class InputReport:
    """The flat inputs of a call and the identity pattern of its opaques."""

    inputs: tuple[FlatInput, ...]
    alias_pattern: OpaqueAliasPattern

    @property
    def opaques(self) -> tuple[FlatInput, ...]:
        return tuple(i for i in self.inputs if i.kind == "opaque")

    def __str__(self) -> str:
        rows = [("slot", "kind", "path", "type", "")]
        for i in self.inputs:
            note = f"shared with {', '.join(map(str, i.shares_with))}" if i.shares_with else ""
            rows.append((str(i.index), i.kind, i.path, i.type_name, note))
        widths = [max(len(r[c]) for r in rows) for c in range(4)]
        lines = [
            f"{r[0]:>{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]:<{widths[3]}}  {r[4]}".rstrip()
            for r in rows
        ]
        if self.alias_pattern.shared:
            groups = "; ".join("slots " + ", ".join(map(str, g)) for g in self.alias_pattern.shared)
            lines.append(f"identity guard: {groups} must keep holding one object each")
        return "\n".join(lines)


def _type_name(value: Any) -> str:
    cls = opaque_type_of(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else qualified_name(cls)


def explain_flat_inputs(args: Sequence[Any], names: Sequence[str] | None = None) -> InputReport:
    """Describe the flat inputs that ``args`` (a compiled call's arguments)
    unwrap into; ``names`` name them in paths (``args[i]`` by default)."""
    if names is None:
        names = [f"args[{i}]" for i in range(len(args))]
    elif len(names) != len(args):
        raise messages.names_count(len(names), len(args))
    metas = describe_args(args, count_symints=False)
    flat = unwrap_args(list(args), is_joint_structure=False, subclass_metas=metas)
    pattern = opaque_alias_pattern(flat)
    groups = {s: g for g in pattern.groups for s in g}
    rows: list[FlatInput] = []
    for meta, name in zip(metas, names, strict=True):
        for path, slot in iter_slots(meta, name):
            value = flat[slot.unwrapped_idx]
            kind: InputKind
            if isinstance(slot, OpaqueSlot):
                kind = "opaque"
            elif isinstance(slot, SymIntSlot):
                kind = "symint"
            elif isinstance(slot, TensorSlot) and isinstance(value, torch.Tensor):
                kind = "tensor"
            else:
                kind = "value"
            shares = tuple(s for s in groups.get(slot.unwrapped_idx, ()) if s != slot.unwrapped_idx)
            rows.append(FlatInput(slot.unwrapped_idx, kind, path, _type_name(value), shares, opaque_type_of(value)))
    return InputReport(tuple(rows), pattern)
