"""Lint OSC002: reference-like objects baked into a graph instead of being inputs.

Only placeholders change between calls; ``get_attr`` attributes and constant
arguments are fixed at compile time. A reference opaque, ``DeviceMesh``,
``ProcessGroup`` or identity-compared object there is the compiling call's,
reused by every later call that passes the guards. This lint finds the
registered reference opaques that did not reach the graph as inputs.
"""

from __future__ import annotations

import ast
import functools
import linecache
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from opaque_subclass.core.checks import require_module
from opaque_subclass.core.errors import qualified_name
from opaque_subclass.core.registry import opaque_kind, opaque_type_of

from . import messages
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
    variable
        For ``"closure"``: its closure variable's name, else ``None``.
    function
        For ``"closure"``: the called function; else ``None``.
    code
        The user's source line of the call, ``""`` when unknown.
    """

    node: str
    how: str
    type_name: str
    origin: str
    reason: str | None
    obj: Any
    variable: str | None = None
    function: Any = None
    code: str = ""


_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)\n\s*(?P<code>[^\n]*)')


def _user_frame(node: torch.fx.Node) -> re.Match[str] | None:
    return trace_frame(node.meta.get("stack_trace") or "")


def trace_frame(trace: str) -> re.Match[str] | None:
    """The innermost frame of an FX stack trace outside torch's files (else the
    innermost; ``None`` for none): groups ``file``, ``line``, ``func``, ``code``."""
    found = list(_LINE.finditer(trace))
    if not found:
        return None
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    outside = [m for m in found if not os.path.abspath(m["file"]).startswith(torch_dir)]
    return (outside or found)[-1]


def node_origin(node: torch.fx.Node) -> str:
    """The user code line ``node`` was traced from (see :func:`trace_frame`; a
    functional collective is named by the user's call of it), else its name."""
    frame = _user_frame(node)
    if frame is None:
        return f"node {node.name!r}"
    return messages.origin(frame["file"], int(frame["line"]), frame["func"], frame["code"].strip())


def origin_site(origin: str) -> str:
    """``file:line in function`` of an origin from :func:`node_origin` (without its code)."""
    return origin.split(": ", 1)[0]


def node_code(node: torch.fx.Node) -> str:
    """The source line of :func:`node_origin` (``""`` when the node has no stack trace)."""
    frame = _user_frame(node)
    return frame["code"].strip() if frame is not None else ""


def call_text(code: str, name: str) -> str | None:
    """The source of the first call ``name(...)``/``mod.name(...)`` in the line
    ``code``; ``None`` when the line alone does not parse."""
    try:
        tree = ast.parse(code.strip())
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if called == name:
            return ast.get_source_segment(code.strip(), node)
    return None


_HELD_ON_PURPOSE = (*PLAIN_TYPES, torch.Tensor, torch.nn.Module, pytree.TreeSpec)


def _interesting(obj: object) -> bool:
    """Whether a graph may hold ``obj`` by mistake (not a plain constant, tensor or module)."""
    if isinstance(obj, _HELD_ON_PURPOSE) or type(obj).__module__.startswith("torch._dynamo"):  # Dynamo's own state
        return False
    return True


def _type_name(obj: object) -> str:
    cls = opaque_type_of(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else qualified_name(cls)


def _captured(target: object) -> list[tuple[object, str | None]]:
    """The objects a call's target carries (a partial's arguments, closure cells),
    each with its closure variable (``None`` inside a container or partial).
    Dynamo builds such targets: torch 2.11's ``prim_from_local`` closes over the
    ``DeviceMesh``."""
    found: list[tuple[object, str | None]] = []
    if isinstance(target, functools.partial):
        found.extend((leaf, None) for leaf in pytree.tree_leaves((target.args, target.keywords)))
        target = target.func
    code = getattr(target, "__code__", None)
    names = code.co_freevars if code is not None else ()
    for i, cell in enumerate(getattr(target, "__closure__", None) or ()):
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        leaves = pytree.tree_leaves(contents)
        plain = len(leaves) == 1 and leaves[0] is contents and i < len(names)
        found.extend((leaf, names[i] if plain else None) for leaf in leaves)
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
            for obj, variable in _captured(node.target):
                if _interesting(obj):
                    yield BakedObject(
                        node.name,
                        "closure",
                        _type_name(obj),
                        node_origin(node),
                        reference_reason(obj),
                        obj,
                        variable,
                        node.target,
                        node_code(node),
                    )
            for leaf in pytree.tree_leaves((node.args, node.kwargs)):
                if isinstance(leaf, torch.fx.Node) or not _interesting(leaf):
                    continue
                yield BakedObject(
                    node.name,
                    "argument",
                    _type_name(leaf),
                    node_origin(node),
                    reference_reason(leaf),
                    leaf,
                    code=node_code(node),
                )


def lint_baked(gm: torch.fx.GraphModule, graph_name: str = "graph") -> list[Finding]:
    """OSC002 findings: the reference-like objects among :func:`baked_objects`."""
    require_module(gm, "compile_passes.lint_baked", graph=True)
    return baked_findings(baked_objects(gm), graph_name)


def _def_line(function: Any) -> tuple[str, int, str] | None:
    """``(file, line, text)`` of the ``def`` statement of ``function`` (after its decorators)."""
    code = getattr(function, "__code__", None)
    if code is None:
        return None
    pattern = re.compile(rf"^\s*(?:async\s+)?def\s+{re.escape(code.co_name)}\s*\(")
    for line in range(code.co_firstlineno, code.co_firstlineno + 20):
        text = linecache.getline(code.co_filename, line)
        if pattern.match(text):
            return code.co_filename, line, text.strip()
    return None


def _closure_fix(baked: BakedObject) -> str | None:
    """For a captured closure variable: the function's ``def`` and its call, each
    with the variable added as a parameter / an argument."""
    if baked.how != "closure" or baked.variable is None:
        return None
    found = _def_line(baked.function)
    name = getattr(baked.function, "__name__", None)
    if found is None or name is None:
        return None
    file, line, text = found
    match = re.match(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\((?P<params>.*)\)\s*(?:->.*)?:$", text)
    call = call_text(baked.code, name)
    if match is None or call is None:
        return None
    return messages.closure_as_argument(
        name, match["params"], baked.variable, f"{file}:{line}", origin_site(baked.origin), call
    )


def baked_findings(baked_list: Iterable[BakedObject], graph_name: str = "graph") -> list[Finding]:
    """OSC002 findings for already listed :class:`BakedObject` s."""
    findings = []
    for baked in baked_list:
        if baked.reason is None:
            continue
        unregistered = opaque_type_of(baked.obj) if opaque_kind(baked.obj) is None else None
        message = messages.baked_message(baked.how, baked.origin, baked.type_name, baked.reason)
        fix = messages.baked_fix(unregistered, _closure_fix(baked))
        findings.append(make("OSC002", None, f"{graph_name}:{baked.node}", message, fix))
    return findings
