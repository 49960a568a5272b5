"""Inductor with opaque graph inputs (torch 2.11).

An opaque that reaches inductor's graph (a custom op taking a subclass's mesh
or process group) is a ``TorchBindObject`` buffer there. torch 2.12 counts its
bytes as zero; torch 2.11 asks it for torchbind's ``__obj_flatten__``, which
an opaque does not have. And a DTensor made inside the region on a mesh Dynamo 2.11
keeps as a constant (a ``DeviceMesh`` argument) returns that mesh from the forward
graph as a ``get_attr`` node without a traced value, which torch 2.11's lowering
reads unconditionally (torch 2.12 tolerates it).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

from opaque_subclass.core.registry import opaque_kind

__all__ = ["make_check_for_hop", "make_get_buf_bytes", "make_run_node"]


def make_get_buf_bytes(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._inductor.ir.TorchBindObject.get_buf_bytes`` (torch 2.11), the
    bytes inductor counts for a script-object buffer of its graph when its metrics log
    is on (``TORCH_LOGS=inductor_metrics``, or any handler at INFO on that log).

    Without it, an opaque graph input fails the compilation (``InductorError:
    AssertionError`` on ``hasattr(real_script_obj, "__obj_flatten__")``: torch 2.11
    tests the object, not its type, for an opaque). With it, a registered opaque counts
    zero bytes, as in torch 2.12 (pytorch/pytorch#176457's release); a torchbind object
    is torch's.
    """

    def get_buf_bytes(self: Any) -> int:
        if opaque_kind(self.get_real_obj()) is not None:
            return 0
        return int(original(self))

    return get_buf_bytes


def make_run_node(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._inductor.graph.GraphLowering.run_node`` (torch 2.11), the
    lowering of one node of the graph inductor compiles.

    Without it, a forward graph that returns a registered opaque kept as a constant
    (``get_attr``, no traced value) fails the compilation: ``InductorError: KeyError:
    'val'`` (torch 2.11 reads ``node.meta["val"]`` of every output node). This is
    reached by ``DTensor.from_local(t, mesh, ...)`` inside a compiled region with the mesh
    an argument: the backport lists a DTensor's mesh as an opaque attribute
    (pytorch/pytorch#176457, #178115, as torch 2.12), and Dynamo 2.11 keeps such a mesh
    as a constant of the graph; stock 2.11, which does not list the mesh, compiles it.
    With it, such a node's traced value is the object itself before torch lowers it, so
    the output is the constant ``TorchBindObject`` inductor already makes of it, as
    torch 2.12 lowers it (it reads the value with ``meta.get``). Every other node is
    torch's.
    """

    def run_node(self: Any, n: Any) -> Any:
        if n.op == "get_attr" and "val" not in n.meta:
            value = _opaque_constant(self.module, n.target)
            if value is not None:
                n.meta["val"] = value
        return original(self, n)

    return run_node


def make_check_for_hop(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._inductor.codecache.FxGraphCache._check_for_hop`` (torch 2.11), the
    FX graph cache's refusal of graphs it cannot restore (a higher-order op that is not
    cacheable, a torchbind constant).

    Without it, a graph holding a registered opaque as a constant (the mesh a DTensor made
    in the region returns, see :func:`make_run_node`) is saved, and a compilation served
    from the cache (another process, or after ``torch._dynamo.reset()``) has lost the
    constant: its backward fails in DTensor's ``from_local`` backward (``AttributeError:
    'NoneType' object has no attribute 'size'``). torch's own torchbind test never
    matches (it looks for ``node.op == "getattr"``, and for ``torch._C.ScriptObject``
    only). With it, such a graph bypasses the FX graph cache (compiled each time, right);
    graphs without an opaque constant are checked by torch alone. torch 2.12 and newer
    (pytorch/pytorch#176457, #178115) make the mesh a graph input, so no such constant
    exists there.
    """
    from torch._inductor.codecache import BypassFxGraphCache

    def _check_for_hop(gm: Any) -> None:
        original(gm)
        for module in gm.modules():
            if not isinstance(module, torch.fx.GraphModule):
                continue
            for node in module.graph.find_nodes(op="get_attr"):
                value = _opaque_constant(module, node.target)
                if value is not None:
                    raise BypassFxGraphCache(
                        f"Can't cache an opaque constant ({type(value).__name__} at {node.target}; opaque-subclass)"
                    )

    return _check_for_hop


def _opaque_constant(module: torch.nn.Module, target: str) -> object | None:
    """The registered opaque a ``get_attr`` node's dotted ``target`` names in ``module``;
    ``None`` for anything else, and for a target that does not resolve (torch's own
    lowering and compilation report that)."""
    try:
        value = operator.attrgetter(target)(module)
    except AttributeError:
        return None
    return value if opaque_kind(value) is not None else None
