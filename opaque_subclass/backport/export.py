"""``torch.export`` with opaque attributes (torch 2.11).

* Non-strict export builds a shape context for every input tensor and flattened
  attribute; torch 2.11 treats an opaque as a tensor there (``'Mesh' object has
  no attribute 'shape'``).
* After :func:`opaque_subclass.unwrap_subclass_parameters`, an opaque is a module
  attribute; export lifts it as a custom-object input and the unlifted module
  puts it back. torch 2.11 lifts only tensors and script objects.
* Strict export's Dynamo makes such an attribute a graph input with an attribute
  source, which torch 2.11's capture refuses; the patched capture reads it from a
  graph attribute instead, lifted as above.

torch 2.12 (pytorch/pytorch#176457 and follow-ups) handles both natively.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from opaque_subclass.backport import messages
from opaque_subclass.backport.aot_autograd import fake_opaque_always
from opaque_subclass.core.checks import source_name, validate_input
from opaque_subclass.core.flatten import is_wrapper_subclass
from opaque_subclass.core.registry import opaque_kind

__all__ = ["make_assign_attr", "make_fullgraph_capture", "make_lift_constants_pass", "make_symbolic_context"]


def make_symbolic_context(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._export.non_strict_utils._create_symbolic_context_for_tensor``
    (torch 2.11).

    Without it, ``torch.export.export(module, (subclass_with_opaque,), strict=False)``
    fails building the input's shape context. With it, an opaque attribute gets
    no context, tensors theirs as before; any other attribute raises the
    library's error with its path (not ``'int' object has no attribute 'shape'``).
    Unnecessary since torch 2.12 (pytorch/pytorch#176457).
    """

    def _create_symbolic_context_for_tensor(t: Any, source: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(t, torch.Tensor) and opaque_kind(t) == "reference":
            return None
        if is_wrapper_subclass(t):
            validate_input(t, source_name(source), rebuild=False)  # the rebuild: fakify's check
        return original(t, source, *args, **kwargs)

    return _create_symbolic_context_for_tensor


def _is_reference_opaque(value: object) -> bool:
    from torch._library.fake_class_registry import FakeScriptObject

    return not isinstance(value, (torch.Tensor, FakeScriptObject)) and opaque_kind(value) == "reference"


def make_lift_constants_pass(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._export.passes.lift_constants_pass.lift_constants_pass``
    (torch 2.11).

    Without it, exporting a graph reading a reference opaque from a module
    attribute (after ``unwrap_subclass_parameters``) fails with ``AssertionError:
    expected int, Tensor, or FakeScriptObject key``. With it, each is lifted as
    a custom-object input (the pass sees a fake of it), the constants holding
    the real object. Unnecessary since torch 2.12 (pytorch/pytorch#176457 and follow-ups).
    """

    def lift_constants_pass(gm: Any, graph_signature: Any, constant_attrs: Any) -> Any:
        swapped: dict[int, tuple[Any, Any, Any, str]] = {}
        for node in gm.graph.nodes:
            if node.op != "get_attr":
                continue
            *path, name = node.target.split(".")
            owner = gm
            for part in path:
                owner = getattr(owner, part)
            value = getattr(owner, name, None)
            if value is None or not _is_reference_opaque(value):
                continue
            fake = fake_opaque_always(value)
            setattr(owner, name, fake)
            swapped[id(fake)] = (fake, value, owner, name)
        try:
            lifted = original(gm, graph_signature, constant_attrs)
        finally:
            for fake, value, owner, name in swapped.values():
                if getattr(owner, name, None) is fake:
                    setattr(owner, name, value)
        if not swapped:
            return lifted
        return {k: swapped[id(v)][1] if id(v) in swapped and swapped[id(v)][0] is v else v for k, v in lifted.items()}

    return lift_constants_pass


def make_assign_attr(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch.export.unflatten._assign_attr`` (torch 2.11, and torch
    2.12 as a fix), which puts lifted constants back on the module returned by
    ``ExportedProgram.module()``.

    Without it, a reference opaque constant fails ("expected torch.Tensor or
    torch.ScriptObject for CONSTANT attr_kind"). With it, it is set as a plain
    attribute, as torch 2.13 does (pytorch/pytorch#176457 and follow-ups in 2.12 and 2.13).
    """

    def _assign_attr(
        from_obj: Any, to_module: torch.nn.Module, target: str, attr_kind: Any, *args: Any, **kwargs: Any
    ) -> Any:
        if not _is_reference_opaque(from_obj) or getattr(attr_kind, "name", None) != "CONSTANT":
            return original(from_obj, to_module, target, attr_kind, *args, **kwargs)
        result = original(torch.empty(0), to_module, target, attr_kind, *args, **kwargs)
        *path, field = target.split(".")
        owner: Any = to_module
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, field, from_obj)
        return result

    return _assign_attr


def _is_user_argument(source: Any) -> bool:
    from torch._dynamo.source import GetItemSource

    return isinstance(source, GetItemSource)


def _attach_captured_opaques(out: Any) -> None:
    """In a Dynamo capture for export, turn each reference-opaque graph input not
    from the arguments (a module attribute, a closure) into a ``get_attr`` of
    that very object, dropped from the inputs and input sources."""
    backend = out.backend_input
    if backend is None:
        return
    sources = out.graph_capture_output.output_graph.export_metadata.graph_input_idx_to_local_source
    captured = {
        index
        for index, value in enumerate(backend.example_inputs)
        if _is_reference_opaque(value) and not _is_user_argument(sources.get(index))
    }
    if not captured:
        return
    gm = backend.graph_module
    placeholders = gm.graph.find_nodes(op="placeholder")
    if len(placeholders) != len(backend.example_inputs) or set(sources) != set(range(len(placeholders))):
        raise messages.capture_out_of_line(len(placeholders), len(backend.example_inputs), sources)
    kept_sources: dict[int, Any] = {}
    kept_inputs: list[Any] = []
    for index, (node, value) in enumerate(zip(placeholders, backend.example_inputs, strict=True)):
        if index not in captured:
            kept_sources[len(kept_inputs)] = sources[index]
            kept_inputs.append(value)
            continue
        name = f"_captured_opaque_{index}"
        setattr(gm, name, value)
        with gm.graph.inserting_before(node):
            # create_node: Graph.get_attr warns about non-tensor, non-module attributes
            attr = gm.graph.create_node("get_attr", name)
        attr.meta.update(node.meta)
        attr.meta["val"] = value
        node.replace_all_uses_with(attr)
        gm.graph.erase_node(node)
    sources.clear()
    sources.update(kept_sources)
    backend.example_inputs[:] = kept_inputs
    gm.recompile()


def make_fullgraph_capture(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.convert_frame.fullgraph_capture`` (torch 2.11), for
    the capture that strict ``torch.export`` runs (the one call passing
    ``_is_export_deprecated_do_not_use=True``); every other call is passed through.

    Without it, strict export of a forward reading a reference opaque from a
    module attribute (after ``unwrap_subclass_parameters``, or handed to a custom
    op) fails with ``AssertionError: AttrSource(...)`` in
    ``_dynamo_graph_capture_for_export``. With it, each is read from a graph
    attribute and lifted as a custom-object input: the same program as torch
    2.12 gives (pytorch/pytorch#176457 and follow-ups).
    """

    def fullgraph_capture(*args: Any, _is_export_deprecated_do_not_use: bool = False, **kwargs: Any) -> Any:
        out = original(*args, _is_export_deprecated_do_not_use=_is_export_deprecated_do_not_use, **kwargs)
        if _is_export_deprecated_do_not_use:
            _attach_captured_opaques(out)
        return out

    return fullgraph_capture
