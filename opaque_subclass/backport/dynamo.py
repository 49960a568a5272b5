"""Dynamo and shape guards for subclasses with opaque attributes (torch 2.11).

torch 2.11 builds a symbolic context and shape guards for every name in
``__tensor_flatten__`` and fails on an opaque (``'Mesh' object has no
attribute 'is_nested'``); these patches skip opaques, as torch 2.12 does
(pytorch/pytorch#176457).
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
    "make_apply_to_inner_tensors",
    "make_automatic_dynamic",
    "make_handle_traced_output",
    "make_is_device_mesh",
    "make_is_process_group",
    "make_produce_guards_verbose",
    "make_wrap_tensor",
]


def make_automatic_dynamic(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.variables.builder._automatic_dynamic`` (torch 2.11).

    Without it, compiling with a subclass listing an opaque fails in Dynamo.
    With it, only tensor attributes get inner contexts (the outer is torch's).
    Unnecessary since torch 2.12 (pytorch/pytorch#176457).
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


def make_apply_to_inner_tensors(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.decorators._apply_func_to_inner_tensors_of_same_dim``
    (torch 2.11), through which ``torch._dynamo.mark_dynamic`` (and its relatives) mark
    each inner tensor of a subclass that has the subclass's number of dimensions.

    Without it, ``mark_dynamic`` on a subclass listing an opaque (or holding one that
    does) asks the opaque for its dimensions (``'DeviceMesh' object has no attribute
    'dim'``). With it, opaque attributes are passed over and every tensor attribute is
    marked as torch does, as torch 2.12 does (pytorch/pytorch#176457's release);
    subclasses without opaques are torch's.
    """

    def _apply_func_to_inner_tensors_of_same_dim(func: Callable[..., Any], t: Any, *args: Any, **kwargs: Any) -> None:
        tensors, opaques = split_attrs(t)
        if not opaques:
            original(func, t, *args, **kwargs)
            return
        for _name, inner in tensors:
            if inner.dim() == t.dim():
                func(inner, *args, **kwargs)

    return _apply_func_to_inner_tensors_of_same_dim


def make_handle_traced_output(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.variables.builder.handle_traced_output`` (torch 2.11),
    which makes the variable for what a call in the graph returned.

    Under compiled autograd, the backward of a graph that saved an opaque (a
    subclass input's mesh) starts with a call returning the saved values, the
    opaque among them as torch's fake wrapper. Without it, torch 2.11's Dynamo
    refuses that value ("torch.* op returned non-Tensor") and splits the
    compiled-autograd graph in two. With it, a fake wrapper of a registered
    opaque is taken as the script object it is, as torch 2.12 does
    (pytorch/pytorch#176457's release); any other value is torch's.
    """
    from torch._library.fake_class_registry import FakeScriptObject

    def handle_traced_output(
        example_value: Any, tx: Any, proxy: Any, options: Any, subclass_type: Any, target_cls: Any
    ) -> Any:
        if isinstance(example_value, FakeScriptObject) and opaque_kind(example_value.real_obj) is not None:
            from torch._dynamo.variables.script_object import TorchScriptObjectVariable  # type: ignore[attr-defined]  # torch 2.11's name; the lint torch renamed it

            return TorchScriptObjectVariable.create(proxy, example_value)
        return original(example_value, tx, proxy, options, subclass_type, target_cls)

    return handle_traced_output


def make_produce_guards_verbose(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``ShapeEnv.produce_guards_verbose`` (torch 2.11).

    Without it, shape guards for a subclass input listing an opaque fail
    (``KeyError``: no inner context). With it, the walk sees only tensor
    attributes of the compilation's own fake inputs (see Note [No writes to
    user objects]). Unnecessary since torch 2.12 (pytorch/pytorch#176457).
    """
    return hide_in_fake_args(original)


def make_wrap_tensor(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``VariableBuilder.wrap_tensor`` (torch 2.11), where Dynamo first
    meets a tensor input.

    Without it, a listed attribute that is neither tensor nor reference opaque
    fails deep in fake conversion (``'int' object has no attribute
    'is_nested'``). With it, each level is checked first and the error names
    subclass, path (``L['x']._mesh``), type and fix. torch 2.12
    (pytorch/pytorch#176457) raises its own, shorter error. Same replacement as
    the native releases' fix; this docstring is the 2.11 patch's.
    """
    return entry_checks.make_wrap_tensor(original)


def _resolve(source: Any, root_locals: dict[str, Any]) -> list[tuple[Any, Any]]:
    """``[(source, value)]`` from the root frame's local to ``source`` (real
    objects); ``LookupError`` for an unknown source kind."""
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
    """Whether ``source`` is reached from a subclass through an unlisted
    attribute (flatten context, e.g. ``x._spec.mesh``), or any attribute of a
    DTensor (Dynamo 2.11's DTensor handlers need its mesh as a constant)."""
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

    Dynamo 2.11 makes a ``DeviceMesh`` an equality-guarded constant
    ``DeviceMeshVariable``. Without it, once ``DeviceMesh`` is registered
    (``opaque_subclass.register_opaque(DeviceMesh)``), a mesh passed in or
    re-created by compiled autograd fails ("Failed to convert args/kwargs to
    proxy ... DeviceMeshVariable"). With it, a registered mesh is an
    identity-guarded graph input, as in torch 2.12+ (no ``DeviceMeshVariable``;
    pytorch/pytorch#176457 and follow-ups), except one reached through an
    unlisted attribute (``x.device_mesh``): it stays a constant, else
    ``x.redistribute(x.device_mesh, ...)`` fails with
    "TorchScriptObjectVariable(FakeScriptObject) is self-referential". The
    caller ``VariableBuilder._wrap`` (a ``depends_on``) gives the source;
    nothing is kept. Unregistered, torch's behaviour is unchanged.
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

    Dynamo 2.11 makes a ``ProcessGroup`` an identity-guarded constant. Without
    it, a registered group listed as an opaque recompiles for every group
    (``___check_obj_id``), where torch 2.12 - 2.15 (registering it themselves,
    pytorch/pytorch#176457 and follow-ups) compile once. With it, it is a graph
    input as there, declared members (2.13's ``size``, ``rank``,
    ``group_name``...) guarded by the member fix. Unregistered, unchanged.
    """

    def is_process_group(value: object) -> bool:
        return bool(original(value)) and opaque_kind(type(value)) != "reference"

    return is_process_group
