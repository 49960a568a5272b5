"""Dynamo and shape guards for subclasses with opaque attributes (torch 2.11).

Dynamo builds a symbolic (shape) context for every tensor attribute of a
subclass input and later turns those contexts into shape guards. torch 2.11
does both for every name in ``__tensor_flatten__`` and fails on an opaque
(``'Mesh' object has no attribute 'is_nested'``). Opaques have no shape: these
patches skip them, as torch 2.12 does (pytorch/pytorch#176457).
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Callable
from typing import Any

from opaque_subclass.backport.hiding import hide_in_fake_args, split_attrs
from opaque_subclass.core.checks import source_name
from opaque_subclass.core.registry import opaque_kind
from opaque_subclass.core.walk import is_wrapper_subclass, read_level
from opaque_subclass.fixes import entry_checks

__all__ = [
    "make_automatic_dynamic",
    "make_is_device_mesh",
    "make_is_process_group",
    "make_produce_guards_verbose",
    "make_wrap_tensor",
]


def make_automatic_dynamic(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.variables.builder._automatic_dynamic`` (torch 2.11).

    Without it, compiling a function that takes a subclass listing an opaque
    attribute fails in Dynamo. With it, the subclass's symbolic context has an
    inner context for each tensor attribute and none for opaques (the outer
    context is torch's own). Unnecessary since torch 2.12 (pytorch/pytorch#176457).
    """
    from torch._dynamo.source import AttrSource
    from torch.fx.experimental.symbolic_shapes import SubclassSymbolicContext

    def _automatic_dynamic(e: Any, tx: Any, source: Any, static_shapes: bool, outer_only: bool = False) -> Any:
        tensors, opaques = ([], {}) if outer_only else split_attrs(e, source_name(source))
        if not opaques:
            return original(e, tx, source, static_shapes, outer_only)
        outer = original(e, tx, source, static_shapes, outer_only=True)
        inner = {
            name: _automatic_dynamic(value, tx, AttrSource(source, name), static_shapes) for name, value in tensors
        }
        fields = {f.name: getattr(outer, f.name) for f in dataclasses.fields(outer) if f.init}
        return SubclassSymbolicContext(**fields, inner_contexts=inner)

    return _automatic_dynamic


def make_produce_guards_verbose(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``ShapeEnv.produce_guards_verbose`` (torch 2.11).

    Without it, building shape guards for a subclass input listing an opaque
    fails (``KeyError`` on the opaque's missing inner context). With it, the
    walk over each subclass input sees only its tensor attributes: the inputs
    here are the compilation's own fake tensors, never the user's (see
    Note [No writes to user objects]). Unnecessary since torch 2.12
    (pytorch/pytorch#176457).
    """
    return hide_in_fake_args(original)


def make_wrap_tensor(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``VariableBuilder.wrap_tensor`` (torch 2.11), where Dynamo first
    meets a tensor input.

    Without it, an object in a subclass's attribute list that is neither a
    tensor nor a reference opaque surfaces as an internal error deep in fake
    conversion (``'int' object has no attribute 'is_nested'``), naming neither
    the argument nor the fix. With it, every level of the subclass is checked
    first and the error names the subclass, the attribute path from the
    compiled function's argument (``L['x']._mesh``), the type found and the
    fix. torch 2.12 (pytorch/pytorch#176457) raises its own, shorter error here.
    The replacement is the native releases' diagnostic fix (the same check,
    once per level per graph); this docstring is the 2.11 patch's own.
    """
    return entry_checks.make_wrap_tensor(original)


def _resolve(source: Any, root_locals: dict[str, Any]) -> list[tuple[Any, Any]]:
    """``[(source, value)]`` from the root frame's local to ``source``, read from
    the real objects; raises ``LookupError`` for a source kind it does not know."""
    from torch._dynamo.source import AttrSource, GetItemSource, LocalSource

    if isinstance(source, LocalSource):
        if source.is_derefed_cell_contents or source.local_name not in root_locals:
            raise LookupError(source)
        return [(source, root_locals[source.local_name])]
    if isinstance(source, AttrSource):
        chain = _resolve(source.base, root_locals)
        return [*chain, (source, getattr(chain[-1][1], source.member))]
    if isinstance(source, GetItemSource) and not source.index_is_slice:
        chain = _resolve(source.base, root_locals)
        return [*chain, (source, chain[-1][1][source.index])]
    raise LookupError(source)


def _reached_through_tensor_context(source: Any, tx: Any) -> bool:
    """Whether the object at ``source`` is reached from a tensor subclass through
    an attribute its ``__tensor_flatten__`` does not list (DTensor's
    ``x.device_mesh``, ``x._spec.mesh``): part of the subclass's flatten context,
    which torch.compile specializes on, not an opaque attribute. Any attribute
    of a DTensor counts: Dynamo 2.11's DTensor handlers need its mesh as a
    constant also where ``dtensor.py`` lists it for AOTAutograd."""
    from torch._dynamo.source import AttrSource
    from torch.distributed.tensor import DTensor

    try:
        chain = _resolve(source, tx.output.root_tx.f_locals)
    except (LookupError, AttributeError, KeyError, IndexError, TypeError):
        return False
    for (_, base), (hop, _) in itertools.pairwise(chain):
        if isinstance(hop, AttrSource) and is_wrapper_subclass(base):
            if isinstance(base, DTensor) or hop.member not in read_level(base).names:
                return True
    return False


def make_is_device_mesh(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``DeviceMeshVariable.is_device_mesh`` (torch 2.11).

    Dynamo 2.11 models a ``DeviceMesh`` as a ``DeviceMeshVariable``, a
    compile-time constant guarded by equality that cannot become a graph
    input. Without it, once ``DeviceMesh`` is registered as a
    reference opaque (``opaque_subclass.register_opaque(DeviceMesh)``), a mesh
    passed to a compiled function or re-created by compiled autograd fails
    ("Failed to convert args/kwargs to proxy ... DeviceMeshVariable"). With it,
    a registered ``DeviceMesh`` takes Dynamo's reference-opaque path (a graph
    input guarded by identity), as in torch 2.12+, where ``DeviceMeshVariable``
    no longer exists (pytorch/pytorch#176457 and its follow-ups), except a mesh
    reached from a tensor subclass through an attribute its
    ``__tensor_flatten__`` does not list (DTensor keeps its mesh in its flatten
    context: ``x.device_mesh``, ``x._spec.mesh``). Such a mesh stays Dynamo's
    compile-time ``DeviceMeshVariable``, as DTensor's own code needs: made an
    opaque, ``x.redistribute(x.device_mesh, ...)`` fails with
    "TorchScriptObjectVariable(FakeScriptObject) is self-referential". Which
    mesh is which is read from the caller, ``VariableBuilder._wrap`` (its
    ``source``), whose source the patch relies on (``depends_on``): nothing
    is passed between patches or kept. Unregistered, torch's behaviour is
    unchanged.
    """

    def is_device_mesh(value: object) -> bool:
        if not original(value):
            return False
        if opaque_kind(type(value)) != "reference":
            return True
        caller = sys._getframe(1)
        builder_module = sys.modules.get("torch._dynamo.variables.builder")
        wrap = getattr(getattr(builder_module, "VariableBuilder", None), "_wrap", None)
        if caller.f_code is not getattr(wrap, "__code__", None):
            return False
        builder: Any = caller.f_locals.get("self")
        source = getattr(builder, "source", None)
        return source is not None and _reached_through_tensor_context(source, builder.tx)

    return is_device_mesh


def make_is_process_group(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.variables.distributed.ProcessGroupVariable.is_process_group``
    (torch 2.11).

    Dynamo 2.11 models a ``ProcessGroup`` as a ``ProcessGroupVariable``: a
    compile-time constant guarded by identity. Without it, a registered
    ``ProcessGroup`` listed as an opaque attribute recompiles the program for
    every group (``___check_obj_id``) even when the program never reads it,
    where torch 2.12 - 2.15 (which register ``ProcessGroup`` as a reference
    opaque themselves, pytorch/pytorch#176457 and its follow-ups) compile once. With it, a registered ``ProcessGroup``
    takes Dynamo's reference-opaque path as on those releases: a graph input,
    its declared members (torch 2.13's: ``size``, ``rank``, ``group_name`` ...)
    evaluated on the real group and guarded by the member fix. Unregistered,
    torch's behaviour is unchanged.
    """

    def is_process_group(value: object) -> bool:
        return bool(original(value)) and opaque_kind(type(value)) != "reference"

    return is_process_group
