"""Lint OSC002: reference-like objects baked into a graph instead of being inputs.

A graph's placeholders are what changes between calls; anything else it uses
is fixed when it is compiled: ``get_attr`` attributes of the graph module and
constant arguments of its calls. A reference opaque, ``DeviceMesh``,
``ProcessGroup`` or identity-compared object there is the object of the call
that compiled the graph, used again by every later call that passes the guards.
Registered reference opaques reach a graph as inputs; this lint finds the ones
that did not.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from opaque_subclass.core.checks import require_module
from opaque_subclass.core.errors import import_fix, qualified_name
from opaque_subclass.core.registry import opaque_kind, opaque_type_of

from .context import PLAIN_TYPES, reference_reason
from .findings import Finding, make

__all__ = ["BakedObject", "baked_findings", "baked_objects", "lint_baked", "node_origin"]


@dataclass(frozen=True, slots=True)
class BakedObject:
    """A non-tensor object a graph holds as an attribute or a constant argument.

    Attributes
    ----------
    node
        The graph node (``get_attr`` node, or the call that takes the constant).
    how
        ``"attribute"``, ``"argument"`` or ``"closure"`` (captured by the called function).
    type_name
        Qualified name of the object's type.
    origin
        Where it came from: the attribute name, or the user code line of the call.
    reason
        Why it is reference-like, or ``None`` for a value (a value opaque, a spec).
    obj
        The object itself.
    """

    node: str
    how: str
    type_name: str
    origin: str
    reason: str | None
    obj: Any


_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)\n\s*(?P<code>[^\n]*)')


def node_origin(node: torch.fx.Node) -> str:
    """The user code line ``node`` was traced from: the innermost frame of its
    stack trace outside torch's own files (a collective traced through
    ``torch.distributed._functional_collectives`` is named by the user's call of
    it), else the innermost frame, else the node's name."""
    trace = node.meta.get("stack_trace") or ""
    found = list(_LINE.finditer(trace))
    if not found:
        return f"node {node.name!r}"
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    outside = [m for m in found if not os.path.abspath(m["file"]).startswith(torch_dir)]
    last = (outside or found)[-1]
    return f"{last['file']}:{last['line']} in {last['func']}: {last['code'].strip()}"


_HELD_ON_PURPOSE = (*PLAIN_TYPES, torch.Tensor, torch.nn.Module, pytree.TreeSpec)


def _interesting(obj: object) -> bool:
    """Whether ``obj`` is an object a graph may hold by mistake (not a plain
    constant, a tensor, a module, a class or a function)."""
    if isinstance(obj, _HELD_ON_PURPOSE) or type(obj).__module__.startswith("torch._dynamo"):  # Dynamo's own state
        return False
    return True


def _type_name(obj: object) -> str:
    cls = opaque_type_of(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else qualified_name(cls)


def _captured(target: object) -> list[object]:
    """The objects a call's target carries with it: a ``functools.partial``'s
    arguments, a function's closure cells (Dynamo builds such targets, e.g.
    torch 2.11's ``prim_from_local`` closes over the ``DeviceMesh``)."""
    found: list[object] = []
    if isinstance(target, functools.partial):
        found.extend(pytree.tree_leaves((target.args, target.keywords)))
        target = target.func
    for cell in getattr(target, "__closure__", None) or ():
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        found.extend(pytree.tree_leaves(contents))
    return found


def baked_objects(gm: torch.fx.GraphModule) -> Iterator[BakedObject]:
    """Every non-tensor, non-module object ``gm`` uses without taking it as an input."""
    require_module(gm, "compile_passes.baked_objects", graph=True)
    return _baked_objects(gm)


def _baked_objects(gm: torch.fx.GraphModule) -> Iterator[BakedObject]:
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            obj: object = gm
            for part in str(node.target).split("."):
                obj = getattr(obj, part, None)
            if _interesting(obj):
                yield BakedObject(
                    node.name, "attribute", _type_name(obj), f"attribute {node.target!r}", reference_reason(obj), obj
                )
        elif node.op in ("call_function", "call_method", "call_module"):
            for obj in _captured(node.target):
                if _interesting(obj):
                    yield BakedObject(
                        node.name, "closure", _type_name(obj), node_origin(node), reference_reason(obj), obj
                    )
            for leaf in pytree.tree_leaves((node.args, node.kwargs)):
                if isinstance(leaf, torch.fx.Node) or not _interesting(leaf):
                    continue
                yield BakedObject(
                    node.name, "argument", _type_name(leaf), node_origin(node), reference_reason(leaf), leaf
                )


def lint_baked(gm: torch.fx.GraphModule, graph_name: str = "graph") -> list[Finding]:
    """OSC002 findings: the reference-like objects among :func:`baked_objects`."""
    require_module(gm, "compile_passes.lint_baked", graph=True)
    return baked_findings(baked_objects(gm), graph_name)


def baked_findings(baked_list: Iterable[BakedObject], graph_name: str = "graph") -> list[Finding]:
    """OSC002 findings for already listed :class:`BakedObject` s."""
    findings = []
    for baked in baked_list:
        if baked.reason is None:
            continue
        cls = opaque_type_of(baked.obj)
        if opaque_kind(baked.obj) is None:
            fix = (
                "make it a graph input: register its class as a reference opaque, "
                + import_fix(cls, "opaque_subclass.register_opaque({cls})")
                + ", and pass it as an argument (or an opaque attribute of a subclass argument) rather than "
                "reading it from a closure or global"
            )
        else:
            fix = (
                "pass it as an argument of the compiled function, or as an opaque attribute of a subclass argument, "
                "rather than from a closure, a global or a flatten context"
            )
        what = {
            "attribute": "holds it as an attribute",
            "argument": "passes it as a constant argument",
            "closure": "calls a function that captured it",
        }[baked.how]
        findings.append(
            make(
                "OSC002",
                None,
                f"{graph_name}:{baked.node}",
                f"the graph {what} ({baked.origin}): a {baked.type_name}, {baked.reason}. It was fixed when the graph "
                "was compiled, so every later call that passes the guards uses this object, not the caller's.",
                fix,
            )
        )
    return findings
