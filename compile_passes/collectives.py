"""Lint OSC005: collectives whose process group is a constant of the graph.

torch's functional collectives (``torch.distributed._functional_collectives``,
and what ``dist.all_reduce`` and DTensor become under ``torch.compile``) are
recorded as ``torch.ops._c10d_functional.<op>(..., group_name)``: the group is
named by a string the graph holds, such as ``'1'``. Such a graph is the program
of one group. A call with another group recompiles (Dynamo guards the name),
and ranks in different groups compile different graphs, so their compile
caches (FX graph, AOTAutograd) never share an entry: at thousands of ranks,
every rank compiles for itself. A collective written as a custom op that takes
the group (or its mesh) as an opaque input has no such constant
(docs/distributed.md, "Recipe: your own collective, as a custom op that takes
the opaque").

Such a collective can also be issued below Dynamo, while AOTAutograd traces
the graph: DTensor's redistributions (``x.redistribute(...)``,
``x.full_tensor()``; since torch 2.12 Dynamo's graph holds only the DTensor
ops), or a subclass's ``__torch_dispatch__`` calling a functional collective.
:func:`collective_below`, called by the checking backend's watcher
(:class:`compile_passes.reads.ReadWatcher`) for each call of an op packet
(``torch.ops._c10d_functional.all_reduce(...)``, what the functional
collectives call) while the inner backend compiles, records those; the replay
of a collective Dynamo's graph already holds (from ``torch.fx``'s interpreter)
is not one of them.
"""

from __future__ import annotations

import ast
import os
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.fx.traceback as fx_traceback

from opaque_subclass.core.checks import require_module

from .baked import call_text, node_code, node_origin, trace_frame
from .findings import Finding, make

__all__ = ["BakedGroup", "baked_groups", "collective_below", "group_findings", "lint_collectives", "packet_call_code"]

#: The namespaces of torch's functional collectives (forward, and the autograd variants).
_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")

_RECIPE = "docs/distributed.md, 'Recipe: your own collective, as a custom op that takes the opaque'"


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
        The group's global ranks in this process, when the name resolves to a
        group here; ``None`` otherwise.
    origin
        The user code line the collective was traced from (or the node's name).
    reduce_op
        For an all-reduce, its reduction (``"sum"``, ``"max"``, ...); else ``None``.
    code
        The source line of ``origin`` (``""`` when the node has no stack trace).
    stage
        ``"dynamo"``: a node of Dynamo's graph; ``"below dynamo"``: issued
        while AOTAutograd traced it (``node`` is then the op's name).
    issuer
        For ``"below dynamo"``: the module whose code called the functional
        collective (``torch.distributed.tensor._redistribute`` for DTensor);
        else ``None``.
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


def _ranks(group_name: str) -> tuple[int, ...] | None:
    """The global ranks of the group named ``group_name`` here, if there is one."""
    try:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        if not dist.is_available() or not dist.is_initialized():
            return None
        resolve: Any = c10d._resolve_process_group  # type: ignore[attr-defined]  # torch's, not exported
        return tuple(dist.get_process_group_ranks(resolve(group_name)))
    except Exception:  # a name of another process, or a torch without the helper: words only
        return None


def _collective(target: object) -> tuple[str, int] | None:
    """``(op name, position of its group_name argument)`` of a functional
    collective (an op overload, or the overload packet Dynamo's graphs call),
    or ``None`` for any other call target."""
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


def baked_groups(gm: torch.fx.GraphModule) -> Iterator[BakedGroup]:
    """Every functional collective of ``gm`` whose group is a string constant."""
    require_module(gm, "compile_passes.baked_groups", graph=True)
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
            yield BakedGroup(
                node.name,
                op,
                value,
                _ranks(value),
                node_origin(node),
                reduce_op if isinstance(reduce_op, str) else None,
                node_code(node),
            )


#: The reductions of ``torch.distributed.ReduceOp`` a functional all-reduce names in lower case.
_REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")


def _all_reduce_fix(baked: BakedGroup) -> str | None:
    """For an all-reduce written ``funcol.all_reduce(x, "max", group)`` or
    ``dist.all_reduce(x, op=..., group=group)`` on the user's line: a custom op
    taking the group and the call that replaces the user's."""
    if baked.reduce_op not in _REDUCE_OPS:
        return None
    call = call_text(baked.code, "all_reduce")
    if call is None:
        return None
    node = ast.parse(call).body[0]
    if not isinstance(node, ast.Expr) or not isinstance(node.value, ast.Call):
        return None
    args = [ast.get_source_segment(call, a) for a in node.value.args]
    keywords = {k.arg: ast.get_source_segment(call, k.value) for k in node.value.keywords if k.arg is not None}
    # funcol.all_reduce(self, reduceOp: str, group) returns the result; dist.all_reduce(tensor, op=ReduceOp, group)
    # reduces in place
    second = node.value.args[1] if len(node.value.args) > 1 else None
    functional = "reduceOp" in keywords or (isinstance(second, ast.Constant) and isinstance(second.value, str))
    tensor = args[0] if args else keywords.get("self", keywords.get("tensor"))
    group = args[2] if len(args) > 2 else keywords.get("group")
    if tensor is None or group is None:
        return None
    op = f"all_reduce_{baked.reduce_op}"
    code = "\n".join(
        [
            "import torch",
            "import torch.distributed as dist",
            "from torch.distributed.distributed_c10d import ProcessGroup",
            "",
            "",
            f'@torch.library.custom_op("opaque_fix::{op}", mutates_args=())',
            f"def {op}(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:",
            "    out = x.clone()",
            f"    dist.all_reduce(out, op=dist.ReduceOp.{baked.reduce_op.upper()}, group=group)  # this call's group",
            "    return out",
            "",
            "",
            f"@{op}.register_fake",
            "def _(x, group):",
            "    return torch.empty_like(x)",
        ]
    )
    replacement = f"{op}({tensor}, {group})" if functional else f"{tensor}.copy_({op}({tensor}, {group}))"
    return (
        "issue the collective through a custom op that takes the group as an opaque input, so one graph serves "
        f"every group ({_RECIPE}):\n```\n{code}\n```\n"
        f"and at {baked.origin.split(': ', 1)[0]} replace `{call}` with `{replacement}` ({group} must be a "
        "ProcessGroup; for a DeviceMesh, take `mesh: DeviceMesh` in the op and call `mesh.get_group()` in its body)."
    )


def lint_collectives(gm: torch.fx.GraphModule, graph_name: str = "graph") -> list[Finding]:
    """OSC005 findings: one per collective of ``gm`` on a group named by a constant."""
    require_module(gm, "compile_passes.lint_collectives", graph=True)
    return group_findings(baked_groups(gm), graph_name)


def group_findings(groups: Iterable[BakedGroup], graph_name: str = "graph") -> list[Finding]:
    """OSC005 findings for already listed :class:`BakedGroup` s (of Dynamo's
    graph, or recorded below Dynamo by the watcher)."""
    findings = []
    for baked in groups:
        ranks = f", ranks {list(baked.ranks)} here" if baked.ranks is not None else ""
        if baked.stage == "dynamo":
            where = f"the graph runs {baked.op} on process group {baked.group_name!r}{ranks}, named by a constant of "
            where += f"the graph ({baked.origin})."
            fix = _all_reduce_fix(baked) or (
                "issue the collective through a custom op whose schema takes the group (or its DeviceMesh) as an "
                "opaque input, and pass the subclass's group attribute to it, so one graph serves every group: "
                f"see {_RECIPE}."
            )
        else:
            where = (
                f"the graph runs {baked.op} on process group {baked.group_name!r}{ranks}, issued below Dynamo by "
                f"{baked.issuer} while AOTAutograd traced {baked.origin}, and named by a constant of the graph it "
                "compiled."
            )
            fix = (
                "where the collective is the program's own, issue it through a custom op whose schema takes the group "
                f"(or its DeviceMesh) as an opaque input, so one graph serves every group (see {_RECIPE}); where it "
                f"is torch's ({baked.issuer}), a sharded tensor whose collectives are such custom ops (the library's "
                "opaque_subclass.sharded.ShardedTensor) has none of these constants."
            )
            if (baked.issuer or "").startswith("torch.distributed.tensor"):
                fix = (
                    "compile and make the first call inside `with opaque_subclass.dtensor.share_compiles():` "
                    "(torch 2.12 - 2.15; docs/large_jobs.md): DTensor's collectives then take their group from "
                    "the mesh graph input when they run, and one graph serves every group and rank."
                )
        findings.append(
            make(
                "OSC005",
                None,
                f"{graph_name}:{baked.node}",
                f"{where} The graph is that group's program: a call with another group compiles again (Dynamo "
                "guards the name), and ranks in other groups compile graphs of their own, so no compile cache entry "
                "is shared across them.",
                fix,
            )
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
    """For ``frame``, a running ``OpOverloadPacket.__call__``: the functional
    collective it issues on a group named by a string, when its caller is not
    ``torch.fx`` replaying Dynamo's graph (or re-dispatching an op), else ``None``."""
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
    meta = fx_traceback.get_current_meta() or {}
    user = trace_frame(str(meta.get("stack_trace") or ""))
    origin = f"{user['file']}:{user['line']} in {user['func']}: {user['code'].strip()}" if user else "the graph"
    reduce_op = args[1] if op.endswith(".all_reduce") and len(args) > 1 else None
    return BakedGroup(
        op,
        op,
        value,
        _ranks(value),
        origin,
        reduce_op if isinstance(reduce_op, str) else None,
        user["code"].strip() if user else "",
        "below dynamo",
        issuer,
    )
