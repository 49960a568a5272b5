"""Lint OSC005: collectives whose process group is a constant of the graph.

torch's functional collectives (``torch.distributed._functional_collectives``,
and what ``dist.all_reduce`` and DTensor become under ``torch.compile``) are
recorded as ``torch.ops._c10d_functional.<op>(..., group_name)``, the group
named by a string the graph holds (``'1'``): the graph is one group's program.
Another group recompiles (Dynamo guards the name), and ranks in different
groups compile different graphs whose compile caches (FX graph, AOTAutograd)
never share an entry: at thousands of ranks, every rank compiles for itself. A
collective written as a custom op taking the group (or its mesh) as an opaque
input has no such constant (docs/distributed.md, "Recipe: your own collective,
as a custom op that takes the opaque").

Such collectives are also issued below Dynamo, while AOTAutograd traces:
DTensor's redistributions (``x.redistribute(...)``, ``x.full_tensor()``; since
torch 2.12 Dynamo's graph holds only the DTensor ops), or a subclass's
``__torch_dispatch__`` calling a functional collective. The checking backend's
watcher (:class:`compile_passes.reads.ReadWatcher`) calls
:func:`collective_below` for each op packet call
(``torch.ops._c10d_functional.all_reduce(...)``) while the inner backend
compiles, which records them, leaving out ``torch.fx``'s replay of a
collective Dynamo's graph already holds.
"""

from __future__ import annotations

import ast
import dataclasses
import linecache
import os
import re
import types
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.fx.traceback as fx_traceback

from opaque_subclass.core.checks import require_module
from opaque_subclass.core.registry import process_group_ranks

from . import messages
from .baked import call_text, node_code, node_origin, origin_site, trace_frame
from .findings import Finding, Severity, make

__all__ = [
    "BakedGroup",
    "baked_groups",
    "collective_below",
    "dynamo_group_guards",
    "group_findings",
    "lint_collectives",
    "packet_call_code",
    "with_reads",
]

#: The namespaces of torch's functional collectives (forward, and the autograd variants).
_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")


@dataclass(frozen=True, slots=True)
class BakedGroup:
    """A functional collective of a graph whose process group is a string constant.

    Attributes
    ----------
    node
        The graph node of the collective.
    op
        The op, ``"_c10d_functional.all_reduce"``.
    group_name
        The group's name as the graph holds it.
    ranks
        The group's global ranks, when the name resolves to a group in this process; else ``None``.
    origin, code
        The user code line the collective was traced from (or the node's name), and its source
        (``""`` without a stack trace).
    reduce_op
        For an all-reduce, its reduction (``"sum"``, ``"max"``, ...); else ``None``.
    stage
        ``"dynamo"``: a node of Dynamo's graph; ``"below dynamo"``: issued while AOTAutograd
        traced it (``node`` is then the op's name).
    issuer
        For ``"below dynamo"``: the module that called the functional collective
        (``torch.distributed.tensor._redistribute`` for DTensor); else ``None``.
    source
        The input path of the opaque the group came from (``t._group``), when a guard on its name or
        a read of its name below Dynamo tells; else ``None``.
    guard
        What compares the group on every call (``t._group.group_name == '1'``), or ``None``.
    guarded
        ``True``: a guard compares the group's name on every call (another group compiles again);
        ``False``: nothing does (another group runs this graph on this group); ``None``: not known
        (linted outside a compilation).
    call_site, call_code
        Where the program's own code called the collective (``file:line in function``) and that
        line: in the compiled function, or below Dynamo the issuing code (a ``__torch_dispatch__``).
    """

    node: str
    op: str
    group_name: str
    ranks: tuple[int, ...] | None
    origin: str
    reduce_op: str | None = None
    code: str = ""
    stage: Literal["dynamo", "below dynamo"] = "dynamo"
    issuer: str | None = None
    source: str | None = None
    guard: str | None = None
    guarded: bool | None = None
    call_site: str = ""
    call_code: str = ""

    @property
    def site(self) -> str:
        """What one finding stands for: the op at the line calling it (compiled for several groups or graphs)."""
        return f"{self.op}@{self.call_site or self.origin}"


def _collective(target: object) -> tuple[str, int] | None:
    """``(op name, position of its group_name argument)`` of a functional collective (an overload,
    or the packet Dynamo's graphs call), or ``None`` for any other call target."""
    if isinstance(target, torch._ops.OpOverloadPacket):
        overloads = [getattr(target, name) for name in target.overloads()]  # type: ignore[no-untyped-call]
    elif isinstance(target, torch._ops.OpOverload):
        overloads = [target]
    else:
        return None
    for overload in overloads:
        if overload.namespace not in _NAMESPACES:
            return None
        for i, argument in enumerate(overload._schema.arguments):
            if argument.name == "group_name":
                return f"{overload.namespace}.{overload._schema.name.split('::')[-1]}", i
    return None


def _source_value(source: Any, tx: Any) -> Any:
    """The real object at a Dynamo ``source`` (locals, globals, their attributes and items) in the
    frame ``tx`` compiles; ``LookupError`` for another kind."""
    from torch._dynamo.source import GetItemSource, GlobalSource, LocalSource

    if isinstance(source, LocalSource):
        return tx.f_locals[source.local_name]
    if isinstance(source, GlobalSource):
        return tx.f_globals[source.global_name]
    if isinstance(source, GetItemSource) and not source.index_is_slice:
        return _source_value(source.base, tx)[source.index]
    member = getattr(source, "member", None)
    if isinstance(member, str) and getattr(source, "base", None) is not None:
        value = _source_value(source.base, tx)
        for part in member.split("."):
            value = getattr(value, part)
        return value
    raise LookupError(source)


def _source_name(source: Any) -> str:
    raw = source.name() if callable(source.name) else source.name
    return re.sub(r"\bL\['([^']+)'\]", r"\1", str(raw))


def dynamo_group_guards() -> dict[str, tuple[str, str]] | None:
    """During a compilation Dynamo runs: ``{group name: (input path, guard text)}`` for each process
    group whose name a guard compares, e.g. ``{'1': ('t._group', "t._group.group_name == '1'")}``;
    ``None`` outside a compilation."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tracing = torch._guards.TracingContext.try_get()
        tx = InstructionTranslator.current_tx()
    except Exception:  # not inside Dynamo's compilation (a graph linted on its own)
        return None
    if tracing is None or tx is None:
        return None
    root = tx.output.root_tx
    found: dict[str, tuple[str, str]] = {}
    for guard in tracing.guards_context.dynamo_guards:
        source: Any = guard.originating_source
        base = getattr(source, "base", None)
        if getattr(source, "member", None) != "group_name" or base is None:
            continue
        try:
            group = _source_value(base, root)
        except Exception:  # a source this walk does not know: the guard stays unexplained
            continue
        name = getattr(group, "group_name", None)
        if isinstance(name, str):
            path = _source_name(base)
            found.setdefault(name, (path, messages.attribute_guard(path, "group_name", name)))
    return found


def baked_groups(gm: torch.fx.GraphModule) -> Iterator[BakedGroup]:
    """Every functional collective of ``gm`` whose group is a string constant; called by a backend
    while Dynamo compiles, each names its group's input and guard (:func:`dynamo_group_guards`)."""
    require_module(gm, "compile_passes.baked_groups", graph=True)
    guards = dynamo_group_guards()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        found = _collective(node.target)
        if found is None:
            continue
        op, at = found
        value = node.args[at] if at < len(node.args) else node.kwargs.get("group_name")
        if isinstance(value, str):
            reduce_op = node.args[1] if op.endswith(".all_reduce") and len(node.args) > 1 else None
            source, guard = (guards or {}).get(value, (None, None))
            origin, code = node_origin(node), node_code(node)
            yield BakedGroup(
                node.name,
                op,
                value,
                process_group_ranks(value),
                origin,
                reduce_op if isinstance(reduce_op, str) else None,
                code,
                source=source,
                guard=guard,
                guarded=None if guards is None else guard is not None,
                call_site=origin_site(origin),
                call_code=code,  # in Dynamo's graph, the user's line is the call
            )


def with_reads(groups: Iterable[BakedGroup], reads: Iterable[Any]) -> tuple[list[BakedGroup], list[Any]]:
    """``groups`` issued below Dynamo, each with the read of ``group_name`` on an opaque input
    (:class:`~compile_passes.reads.BakedRead`) that gave its name; and the reads that explain none
    (a read naming a collective's group is reported with it, OSC005, not on its own)."""
    reads = list(reads)
    named: dict[str, Any] = {}
    for read in reads:
        if read.member == "group_name" and read.known and isinstance(read.value, str) and read.path is not None:
            named.setdefault(read.value, read)
    out, used = [], set()
    for group in groups:
        read = named.get(group.group_name)
        if read is None or group.source is not None:
            out.append(group)
            continue
        used.add(id(read))
        out.append(dataclasses.replace(group, source=read.path, guard=read.guard, guarded=bool(read.guarded)))
    return out, [r for r in reads if id(r) not in used]


#: The reductions of ``torch.distributed.ReduceOp`` a functional all-reduce names in lower case.
_REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")


def _parsed_call(code: str, name: str) -> tuple[str, list[str], dict[str, str], list[ast.expr]] | None:
    """``(call text, positional argument texts, keyword argument texts, positional nodes)``
    of the first call of ``name`` in the line ``code``."""
    call = call_text(code, name)
    if call is None:
        return None
    node = ast.parse(call).body[0]
    if not isinstance(node, ast.Expr) or not isinstance(node.value, ast.Call):
        return None
    args = [ast.get_source_segment(call, a) or "" for a in node.value.args]
    keywords = {k.arg: ast.get_source_segment(call, k.value) or "" for k in node.value.keywords if k.arg is not None}
    return call, args, keywords, list(node.value.args)


def _argument(args: list[str], keywords: dict[str, str], at: int, *names: str) -> str | None:
    if at < len(args):
        return args[at]
    return next((keywords[n] for n in names if n in keywords), None)


def _all_reduce_fix(baked: BakedGroup) -> tuple[list[str], str, str, str] | None:
    """``funcol.all_reduce(x, "max", group)`` or ``dist.all_reduce(x, op=..., group=group)``:
    ``(op code lines, the user's call, its replacement)``."""
    if baked.reduce_op not in _REDUCE_OPS:
        return None
    parsed = _parsed_call(baked.call_code, "all_reduce")
    if parsed is None:
        return None
    call, args, keywords, nodes = parsed
    # funcol.all_reduce(self, reduceOp: str, group) returns the result; dist.all_reduce(tensor, op=ReduceOp, group)
    # reduces in place
    second = nodes[1] if len(nodes) > 1 else None
    functional = "reduceOp" in keywords or (isinstance(second, ast.Constant) and isinstance(second.value, str))
    tensor = _argument(args, keywords, 0, "self", "tensor")
    group = _argument(args, keywords, 2, "group")
    if tensor is None or group is None:
        return None
    code, replacement = messages.all_reduce_op(baked.reduce_op, tensor, group, functional)
    return code, call, replacement, group


def _all_gather_fix(baked: BakedGroup) -> tuple[list[str], str, str, str] | None:
    """``funcol.all_gather_tensor(x, gather_dim, group)``: a custom op taking the group and its
    size (read in the compiled function, where it is guarded)."""
    parsed = _parsed_call(baked.call_code, "all_gather_tensor")
    if parsed is None:
        return None
    call, args, keywords, _ = parsed
    tensor = _argument(args, keywords, 0, "self")
    dim = _argument(args, keywords, 1, "gather_dim")
    group = _argument(args, keywords, 2, "group")
    if tensor is None or dim is None or group is None:
        return None
    code, replacement = messages.all_gather_op(tensor, dim, group)
    return code, call, replacement, group


def _reduce_scatter_fix(baked: BakedGroup) -> tuple[list[str], str, str, str] | None:
    """``funcol.reduce_scatter_tensor(x, "sum", scatter_dim, group)``: a custom op taking the group and its size."""
    parsed = _parsed_call(baked.call_code, "reduce_scatter_tensor")
    if parsed is None:
        return None
    call, args, keywords, nodes = parsed
    tensor = _argument(args, keywords, 0, "self")
    reduce = nodes[1] if len(nodes) > 1 else None
    reduce_op = reduce.value if isinstance(reduce, ast.Constant) and isinstance(reduce.value, str) else None
    dim = _argument(args, keywords, 2, "scatter_dim")
    group = _argument(args, keywords, 3, "group")
    if tensor is None or reduce_op not in _REDUCE_OPS or dim is None or group is None:
        return None
    code, replacement = messages.reduce_scatter_op(reduce_op, tensor, dim, group)
    return code, call, replacement, group


def _collective_fix(baked: BakedGroup) -> str | None:
    """For a collective called on a line of its own: the custom op taking the group and the call
    replacing the user's, in the user's names; ``None`` when it cannot be rewritten."""
    if not baked.call_code:
        return None
    for make_fix in (_all_reduce_fix, _all_gather_fix, _reduce_scatter_fix):
        made = make_fix(baked)
        if made is not None:
            break
    else:
        return None
    code, call, replacement, group = made
    return messages.collective_fix(baked.call_site, code, call, replacement, group)


def lint_collectives(gm: torch.fx.GraphModule, graph_name: str = "graph") -> list[Finding]:
    """OSC005 findings: one per collective call of ``gm`` on a group named by a constant."""
    require_module(gm, "compile_passes.lint_collectives", graph=True)
    return group_findings(baked_groups(gm), graph_name)


def _consequence(first: BakedGroup, groups: Sequence[BakedGroup]) -> str:
    """What a call with another group does, from what guards the group."""
    if first.guarded:
        return messages.group_guarded(first.source, first.guard, len(groups))
    if first.guarded is False and first.source:
        return messages.group_unguarded(first.source, first.group_name)
    return messages.GROUP_OF_UNKNOWN_SOURCE


def group_findings(groups: Iterable[BakedGroup], graph_name: str = "graph") -> list[Finding]:
    """OSC005 findings for listed :class:`BakedGroup` s (of Dynamo's graphs or from the watcher): one
    per collective call of the program (:attr:`BakedGroup.site`) naming every group it was compiled
    for; ``error`` when nothing guards a group from an input (another group silently runs on this one)."""
    by_site: dict[str, list[BakedGroup]] = {}
    for baked in groups:
        by_site.setdefault(baked.site, []).append(baked)
    findings = []
    for site, found in by_site.items():
        first = found[0]
        unique = list({g.group_name: g for g in found}.values())
        named = [(g.group_name, g.ranks) for g in unique]
        if first.stage == "dynamo":
            where = messages.collective_in_graph(first.op, named, first.origin)
            fix = _collective_fix(first) or messages.collective_op_fix(in_graph=True)
        else:
            where = messages.collective_below(first.op, named, first.issuer, first.call_site, first.origin)
            if (first.issuer or "").startswith("torch.distributed.tensor"):
                fix = messages.DTENSOR_SHARE_FIX
            elif (first.issuer or "").startswith("torch."):
                fix = messages.torch_collective_fix(first.issuer)
            else:
                fix = _collective_fix(first) or messages.collective_op_fix(in_graph=False)
                if first.source:  # a group input: share_compiles' rewrite takes it from there (torch 2.12+)
                    fix += messages.share_group_input_fix(first.source)
        severity: Severity | None = "error" if first.guarded is False and first.source else None
        path = first.source or f"{graph_name}:{first.node}"
        findings.append(
            make("OSC005", None, path, f"{where} {_consequence(first, unique)}", fix, severity=severity, site=site)
        )
    return findings


def packet_call_code() -> types.CodeType | None:
    """The code of ``OpOverloadPacket.__call__`` (what ``torch.ops.ns.op(...)`` runs), or ``None``."""
    code = getattr(torch._ops.OpOverloadPacket.__dict__.get("__call__"), "__code__", None)
    return code if isinstance(code, types.CodeType) else None


_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
#: Callers that replay or re-dispatch an op (torch.fx's interpreter running Dynamo's graph, proxy tracing).
_REPLAYS = (os.path.join(_TORCH_DIR, "fx") + os.sep, os.path.join(_TORCH_DIR, "_subclasses") + os.sep)
_FUNCOL = os.path.join(_TORCH_DIR, "distributed", "_functional_collectives")


def collective_below(frame: types.FrameType) -> BakedGroup | None:
    """For ``frame``, a running ``OpOverloadPacket.__call__``: the functional collective it issues on
    a group named by a string, unless ``torch.fx`` replays Dynamo's graph or re-dispatches; else ``None``."""
    packet = frame.f_locals.get("self")
    if not isinstance(packet, torch._ops.OpOverloadPacket) or packet._qualified_op_name.split("::")[0] not in (
        _NAMESPACES
    ):
        return None
    caller = frame.f_back
    if caller is None or os.path.abspath(caller.f_code.co_filename).startswith(_REPLAYS):
        return None
    found = _collective(packet)
    if found is None:
        return None
    op, at = found
    args, kwargs = frame.f_locals.get("args", ()), frame.f_locals.get("kwargs") or {}
    value = args[at] if at < len(args) else kwargs.get("group_name")
    if not isinstance(value, str):
        return None
    issuer_frame: types.FrameType | None = caller
    while issuer_frame is not None and os.path.abspath(issuer_frame.f_code.co_filename).startswith(_FUNCOL):
        issuer_frame = issuer_frame.f_back
    issuer = str(issuer_frame.f_globals.get("__name__", "?")) if issuer_frame is not None else "?"
    call_site = call_code = ""
    if issuer_frame is not None and not os.path.abspath(issuer_frame.f_code.co_filename).startswith(_TORCH_DIR):
        # the program's own code issued it (a subclass's __torch_dispatch__): its line is the one to rewrite
        file, line = issuer_frame.f_code.co_filename, issuer_frame.f_lineno
        call_site = messages.site(file, line, issuer_frame.f_code.co_name)
        call_code = linecache.getline(file, line).strip()
    meta = fx_traceback.get_current_meta() or {}
    user = trace_frame(str(meta.get("stack_trace") or ""))
    origin = "the graph"
    if user:
        origin = messages.origin(user["file"], int(user["line"]), user["func"], user["code"].strip())
    reduce_op = args[1] if op.endswith(".all_reduce") and len(args) > 1 else None
    return BakedGroup(
        op,
        op,
        value,
        process_group_ranks(value),
        origin,
        reduce_op if isinstance(reduce_op, str) else None,
        user["code"].strip() if user else "",
        "below dynamo",
        issuer,
        call_site=call_site,
        call_code=call_code,
    )
