"""AOTAutograd cache entries whose graphs name process groups (torch 2.11 - 2.15).

A collective issued while AOTAutograd traces (DTensor's or another subclass's
redistribution, a functional collective in a ``__torch_dispatch__``) is recorded
as ``_c10d_functional.all_reduce(x, 'sum', '9')``: the graph names the group by
the string it has on the compiling rank. AOTAutograd's cache key is computed
from Dynamo's graph, before that trace, so it never sees the name: in a job
sharing a cache directory, another rank with the same inputs gets the entry and
runs the collective on whatever ``'9'`` means there (the compiling rank's group
if every rank created every group, an error on torch's fake process group).

The two replacements here make each such name a guard of the entry. When an
entry is saved, the group names its forward and backward graphs hold are
recorded with the ranks each has on the saving rank, prefixed to the entry's
``guards_expr`` (torch's symbolic-shape guards, evaluated for every candidate
entry of a key). When a candidate is evaluated, the record must hold on this
rank first: every name resolves to a group of the same ranks that this rank
belongs to. A rank where it does not hold misses that entry (a guard miss: the
next candidate is tried, else it compiles and saves its own beside it), so one
entry serves every rank of a group and no rank runs another group's program.
Entries with no named group (the library's own collectives, or any program
under :func:`opaque_subclass.dtensor.share_compiles`, whose graph pass leaves
no name) keep torch's guards unchanged and serve every rank.
"""

from __future__ import annotations

import ast
import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from opaque_subclass.core.registry import process_group_ranks
from opaque_subclass.fixes.autograd_cache import sharing_across_ranks
from opaque_subclass.patching import composes

__all__ = [
    "GUARD_PREFIX",
    "group_names_in",
    "groups_hold_here",
    "make_cache_save",
    "make_evaluate_guards",
    "recorded_groups",
]

log = logging.getLogger(__name__)

#: How an entry's ``guards_expr`` starts when it records groups: this prefix, the record as
#: JSON (``{name: [ranks] or null}``), a newline, then torch's own expression (may be empty).
GUARD_PREFIX = "# opaque_subclass process groups: "

_OPS_PREFIX = "torch.ops."
_OP_CALL = re.compile(r"(torch\.ops\.\w+\.\w+\.\w+)\s*\(")


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _group_argument(dotted: str) -> int | None:
    """Position of the ``group_name`` argument of the op ``torch.ops.NS.OP.OVERLOAD``, if it has one."""
    parts = dotted[len(_OPS_PREFIX) :].split(".")
    if len(parts) != 3:
        return None
    try:
        overload = getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
    except (AttributeError, RuntimeError):
        return None
    schema = getattr(overload, "_schema", None)
    if schema is None:
        return None
    for i, argument in enumerate(schema.arguments):
        if argument.name == "group_name":
            return i
    return None


def _names_on_line(line: str) -> Iterator[str | None]:
    """The constant group names of the op calls on one line of a printed FX graph; ``None``
    for a call whose group argument cannot be read as a constant string."""
    try:
        tree = ast.parse(line.strip())
    except SyntaxError:
        # a line this reader cannot parse: unreadable only if it calls an op that takes a group
        if any(_group_argument(m) is not None for m in _OP_CALL.findall(line)):
            yield None
        return
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        dotted = _dotted(node.func)
        if dotted is None or not dotted.startswith(_OPS_PREFIX):
            continue
        at = _group_argument(dotted)
        if at is None:
            continue
        value: ast.expr | None = node.args[at] if at < len(node.args) else None
        if value is None:
            value = next((k.value for k in node.keywords if k.arg == "group_name"), None)
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            yield value.value
        elif value is None or isinstance(value, ast.Constant):
            yield None
        # a Name: the group is a graph input (an opaque ProcessGroup), not baked


def group_names_in(graph_texts: Iterable[str | None]) -> tuple[set[str], bool]:
    """The group names that torch's printed graphs (``GraphModule.print_readable``) pass to
    collectives as constants, and whether every collective call could be read."""
    names: set[str] = set()
    complete = True
    for text in graph_texts:
        if not text:
            continue
        for line in text.splitlines():
            if _OPS_PREFIX not in line:
                continue
            for name in _names_on_line(line):
                if name is None:
                    complete = False
                else:
                    names.add(name)
    return names, complete


def recorded_groups(entry: Any) -> dict[str, list[int] | None] | None:
    """What an entry about to be saved must record: ``{name: ranks here}`` for each group its
    forward and backward graphs name (ranks ``None`` where the name resolves to nothing here,
    or for ``"?"`` when a collective's group could not be read), or ``None`` if none."""
    names, complete = group_names_in(
        (getattr(entry, "aot_forward_graph_str", None), getattr(entry, "aot_backward_graph_str", None))
    )
    if not names and complete:
        return None
    record: dict[str, list[int] | None] = {}
    for name in sorted(names):
        ranks = process_group_ranks(name)
        record[name] = list(ranks) if ranks is not None else None
    if not complete:
        record["?"] = None
    return record


def groups_hold_here(record: dict[str, list[int] | None]) -> str | None:
    """``None`` when every recorded group means the same ranks here and this rank is in each;
    else why not (for the log)."""
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else None
    for name, ranks in record.items():
        if ranks is None:
            return f"the entry names a process group {name!r} that could not be identified when it was saved"
        here = process_group_ranks(name)
        if here is None:
            return f"process group {name!r} (ranks {ranks} where compiled) is not a group of rank {rank}"
        if list(here) != ranks:
            return f"process group {name!r} has ranks {list(here)} here, {ranks} where compiled"
        if rank not in here:
            return f"rank {rank} is not in process group {name!r} (ranks {ranks})"
    return None


def _split(guards_expr: str) -> tuple[dict[str, list[int] | None], str]:
    head, _, rest = guards_expr.partition("\n")
    return json.loads(head[len(GUARD_PREFIX) :]), rest


@composes
def make_cache_save(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._functorch._aot_autograd.autograd_cache.AOTAutogradCache.save``
    (torch 2.11, 2.12, 2.13, 2.14 and 2.15).

    Without it, an entry whose graph runs a collective on a group named by a
    constant (``'9'``, issued while AOTAutograd traced) is served to every rank
    with the same inputs: a rank whose ``'9'`` is another group, or none, runs it
    there (on torch's fake process group: "Could not resolve the process group").

    With it, such an entry records each group name of its graphs with the ranks
    it has here, ahead of torch's guard expression (:data:`GUARD_PREFIX`), which
    :func:`make_evaluate_guards` checks on the loading rank. Entries naming no
    group, and every entry compiled under
    :func:`opaque_subclass.dtensor.share_compiles` (whose graph pass leaves no
    group name, or stops the compilation), are saved exactly as torch saves them.
    Not an opaque bug: torch 2.12's opaque graph inputs (pytorch/pytorch#176457,
    backported to 2.11) make such entries shareable across ranks in the first
    place, by keeping the mesh and group out of the key.
    """

    def save(key: str, entry: Any, remote: bool) -> Any:
        guards = getattr(entry, "guards_expr", None)
        # under share_compiles every collective on a constant group was rewritten to take its
        # group from an input, or the compilation refused (an inference graph's text is printed
        # before that pass runs, so it may still show the names)
        if not sharing_across_ranks() and not (isinstance(guards, str) and guards.startswith(GUARD_PREFIX)):
            record = recorded_groups(entry)
            if record is not None:
                entry.guards_expr = f"{GUARD_PREFIX}{json.dumps(record, sort_keys=True)}\n{guards or ''}"
        return original(key, entry, remote)

    return save


@composes
def make_evaluate_guards(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._functorch._aot_autograd.autograd_cache.AOTAutogradCache.evaluate_guards``
    (torch 2.11, 2.12, 2.13, 2.14 and 2.15).

    Without it, the record :func:`make_cache_save` puts ahead of an entry's guard
    expression reaches torch's shape environment as code.

    With it, an expression that starts with :data:`GUARD_PREFIX` passes only where
    the recorded groups hold on this rank (:func:`groups_hold_here`), and then
    where torch's own expression after it passes; any other expression goes to
    torch's function as before. On torch 2.11, with the backport of
    pytorch/pytorch#176457, as on 2.12 and newer.
    """

    def evaluate_guards(guard_expr: str, hints: Any) -> bool:
        if not (isinstance(guard_expr, str) and guard_expr.startswith(GUARD_PREFIX)):
            return bool(original(guard_expr, hints))
        record, rest = _split(guard_expr)
        why = groups_hold_here(record)
        if why is not None:
            log.info("AOTAutograd cache entry not served on this rank: %s", why)
            return False
        return bool(original(rest, hints)) if rest.strip() else True

    return evaluate_guards
