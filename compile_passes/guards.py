"""Opaque sharing (lint OSC003) and guard failures in opaque terms.

A graph is specialized and guarded on inputs sharing one opaque (``x._mesh is
y._mesh``): a call where they differ recompiles. :func:`lint_sharing` reports
such groups; :func:`translate_guard` rewrites Dynamo's recompile reasons
(``x._mesh is y._mesh``, ``___check_obj_id``, ``___check_metadata_...``).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from typing import Any

from opaque_subclass.core.errors import qualified_name

from . import messages
from .findings import Finding, make
from .inputs import InputReport, explain_flat_inputs

__all__ = ["graph_input_name", "lint_sharing", "sharing_report", "translate_guard"]

_LOCAL = re.compile(r"\b[LG]\['([^']+)'\]")


def graph_input_name(source_name: str) -> str:
    """``L['x']._mesh`` -> ``x._mesh``; ``L['self'].w`` -> ``self.w``."""
    return _LOCAL.sub(r"\1", source_name)


def sharing_report(named: Sequence[tuple[str, Any]]) -> InputReport:
    """The flat inputs of ``(name, value)`` pairs, with their opaque sharing."""
    return explain_flat_inputs([v for _, v in named], names=[n for n, _ in named])


def _under(path: str, roots: frozenset[str]) -> bool:
    return any(path == r or path.startswith((f"{r}.", f"{r}[")) for r in roots)


def lint_sharing(report: InputReport, parameters: frozenset[str] = frozenset()) -> list[Finding]:
    """OSC003 findings: one per pair of distinct input paths holding one opaque.
    A path listed twice (an attribute also passed to an ``autograd.Function``)
    is one input. Pairs inside ``parameters`` (module parameter inputs) are
    skipped: a sharded model's parameters all hold its mesh, the same every call."""
    findings = []
    by_index = {i.index: i for i in report.inputs}
    for group in report.alias_pattern.shared:
        paths = list(dict.fromkeys(by_index[s].path for s in group if s in by_index))
        first = by_index.get(group[0])
        type_name = first.type_name if first is not None else "opaque"
        for a, b in itertools.combinations(paths, 2):
            if _under(a, parameters) and _under(b, parameters):
                continue
            own_object = _own_object_fix(b, first.value_type if first is not None else None)
            findings.append(make("OSC003", None, f"{a}, {b}", *messages.shared_opaque(a, b, type_name, own_object)))
    return findings


#: Paths a fix can assign to as written: ``y._mesh``, ``args[1]._data._mesh``.
_ASSIGNABLE = re.compile(r"[A-Za-z_]\w*(?:\[\d+\])*(?:\.[A-Za-z_]\w*)+")


def _own_object_fix(path: str, cls: type | None) -> str:
    """How to give ``path`` an object of its own, in code where the type allows:
    a new communicator over the same ranks, or a default ``copy.copy``."""
    if cls is None or not _ASSIGNABLE.fullmatch(path):
        return messages.own_object_unknown(path)
    if qualified_name(cls) == "torch.distributed.distributed_c10d.ProcessGroup":
        return messages.own_group(path)
    if _default_copy(cls):
        return messages.own_copy(path)
    return messages.own_object_build(path, cls)


def _default_copy(cls: type) -> bool:
    """Whether ``copy.copy`` of a ``cls`` is Python's default (no copy hooks, no C
    base): a new object with the same attributes."""
    if not hasattr(cls, "__dict__") or "__slots__" in vars(cls):
        return False
    hooks = ("__copy__", "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__getnewargs_ex__")
    for klass in cls.__mro__[:-1]:
        if any(h in vars(klass) for h in hooks):
            return False
        if klass.__flags__ & (1 << 9) == 0:  # not a heap type: a C class, copied its own way
            return False
    return True


_SHARE = re.compile(r"^(?P<a>[\w.\[\]']+) is (?P<not>not )?(?P<b>[\w.\[\]']+)$")
_PATH = r"[A-Za-z_][\w.]*(?:\[[^\]]+\][\w.]*)*"
#: A member's value read at compile time and guarded: ``t._g.size() == 4``, ``t._g.offset == 1``
#: (torch 2.11 and 2.12 write ``object.__getattribute__(t._g, 'offset') == 1``).
_MEMBER_CALL = re.compile(rf"^(?P<obj>{_PATH})\.(?P<member>\w+)\(\) == (?P<value>.+)$")
_MEMBER_GETATTRIBUTE = re.compile(
    rf"^object\.__getattribute__\((?P<obj>{_PATH}), '(?P<member>\w+)'\) == (?P<value>.+)$"
)
_MEMBER_ATTR = re.compile(rf"^(?P<obj>{_PATH})\.(?P<member>\w+) == (?P<value>.+)$")
#: Where a guard names an input: ``L['x']._mesh``, ``L['self'].w[0]``.
_INPUT = re.compile(r"\b[LG]\['[^']+'\](?:\.\w+|\[[^\]]+\])*")
_OBJ_ID = re.compile(r"___check_obj_id\((?P<a>[^,]+), \d+\)")
_METADATA = re.compile(r"___check_metadata_\w+")
_CONSTANT_FLATTEN = re.compile(r"___check_constant_flatten_\d+")


def translate_guard(reason: str) -> str:
    """A line of ``torch._dynamo.utils.guard_failures`` (``"0/0: x._mesh is
    y._mesh   # def f(x, y): ..."``) in opaque terms; unknown ones unchanged."""
    text = reason.split("\n", 1)[0]
    text = text.split("#", 1)[0].strip()
    text = re.sub(r"^\d+/\d+:\s*", "", text)
    text = graph_input_name(text)
    match = _SHARE.match(text)
    if match:
        return messages.sharing_changed(match["a"], match["b"], now_shared=bool(match["not"]))
    match = _OBJ_ID.search(text)
    if match:
        return messages.not_the_compiled_object(match["a"].strip())
    if _METADATA.search(text):
        return messages.CONTEXT_DIFFERS
    if _CONSTANT_FLATTEN.search(text):
        return messages.FLATTEN_REPLACED
    member = _MEMBER_CALL.match(text) or _MEMBER_GETATTRIBUTE.match(text) or _MEMBER_ATTR.match(text)
    if member:
        obj, name, value = member["obj"], member["member"], member["value"].strip()
        return messages.member_changed(obj, name, member.re is _MEMBER_CALL, value, group=name == "group_name")
    inputs = list(dict.fromkeys(graph_input_name(m) for m in _INPUT.findall(reason.split("\n", 1)[0])))
    if inputs:
        return messages.input_guard(text, inputs)
    return text
