"""Subclass constructions inside a saved graph (programs after ``unwrap_subclass_parameters``).

Note [Constructions are stored as a library op]
-----------------------------------------------
A program exported after :func:`opaque_subclass.unwrap_subclass_parameters`
rebuilds each subclass parameter inside its graph::

    flat_apply(func_spec, in_spec, 3, 1, True, p_w_original0, obj_w_lifted_custom_0)

``func_spec`` and ``in_spec`` are pytree specs held as graph-module attributes
(the first wraps the subclass); torch's serializer refuses both ("Unsupported
getattr attribute"), so ``torch.export.save`` fails on every release.
:func:`encode` rewrites each such node, in a graph copy, into
``opaque_subclass::stored_construction(key, tensors)``, a custom op torch
serializes; ``key`` names the manifest's :class:`ConstructionRecord` with the
class (qualified name), the argument spec (``treespec_dumps``) and each flat
argument's origin (the op's tensors, a lifted opaque input, a constant).
:func:`decode` restores the ``flat_apply`` calls. Lifted opaques stay program
inputs stored by name, so the loader's objects flow into the rebuilt subclasses.

Constants are stored by value: JSON scalars as themselves, dtypes, layouts and
memory formats by name, devices as strings, anything else (a value opaque such
as a quantization config) by its own pickling.
"""

from __future__ import annotations

import base64
import copy
import pickle
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils import _pytree as pytree

from opaque_subclass.core.errors import qualified_name
from opaque_subclass.core.registry import opaque_kind
from opaque_subclass.export import messages
from opaque_subclass.export.manifest import ConstructionRecord, import_qualified

__all__ = ["decode", "default_names", "encode"]

_OP_NAME = "opaque_subclass::stored_construction"


@torch.library.custom_op(_OP_NAME, mutates_args=())
def _stored_construction(key: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    raise messages.construction_not_restored(key)


def _stored_op() -> Any:
    return torch.ops.opaque_subclass.stored_construction.default


def _flat_apply() -> Any:
    return torch.ops.higher_order.flat_apply


def _flat_apply_nodes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    flat_apply = _flat_apply()
    return [n for n in graph.nodes if n.op == "call_function" and n.target is flat_apply]


def _attr(gm: torch.fx.GraphModule, node: Any) -> Any:
    if isinstance(node, torch.fx.Node) and node.op == "get_attr":
        return getattr(gm, node.target)  # type: ignore[arg-type]  # a get_attr target is a string
    return node


def _keys(in_spec: Any, count: int) -> list[str]:
    """The top-level argument name (keyword, or position) of each flat argument."""
    tree = pytree.tree_unflatten(list(range(count)), in_spec)
    keys = [str(i) for i in range(count)]
    if not (isinstance(tree, tuple) and len(tree) == 2 and isinstance(tree[1], dict)):
        return keys  # not torch's (args, kwargs): positions only
    args, kwargs = tree
    for name, sub in [*((str(p), a) for p, a in enumerate(args)), *((str(k), v) for k, v in kwargs.items())]:
        for leaf in pytree.tree_leaves(sub):
            keys[leaf] = name
    return keys


def _custom_obj_targets(ep: Any) -> dict[str, str]:
    """Placeholder name -> constant FQN, for the program's lifted custom objects."""
    from torch.export.graph_signature import InputKind

    return {
        spec.arg.name: spec.target
        for spec in ep.graph_signature.input_specs
        if spec.kind == InputKind.CUSTOM_OBJ and spec.target is not None
    }


_PARAMETRIZED = re.compile(r"^(?:(?P<prefix>.*)\.)?parametrizations\.(?P<name>[^.]+)\.\d+\.")


def default_names(ep: Any) -> dict[str, str]:
    """Constant FQN -> the path of the opaque in the subclass it rebuilds.

    ``parametrizations.w.0.lifted_custom_0`` passed as ``_mesh`` to the
    construction of ``w`` is ``w._mesh``; the inner construction of a nested
    one, passed as ``_data`` to the outer, gives ``w._data._mesh``: the names
    :func:`~opaque_subclass.export.save` gives the same opaques when the
    parameter is exported whole.
    """
    nodes = _flat_apply_nodes(ep.graph)
    if not nodes:
        return {}
    targets = _custom_obj_targets(ep)
    gm = ep.graph_module
    keys = {n: _keys(_attr(gm, n.args[1]), len(n.args) - 2) for n in nodes}
    used_as: dict[torch.fx.Node, str] = {}  # inner construction -> ".<key>" in its outer one
    for n in nodes:
        for i, a in enumerate(n.args[2:]):
            if isinstance(a, torch.fx.Node) and a in keys:
                used_as.setdefault(a, "." + keys[n][i])

    def suffix(n: torch.fx.Node) -> str:
        parts = []
        while n in used_as:
            parts.append(used_as[n])
            n = next(u for u in n.users if u in keys and n in u.args[2:])
        return "".join(reversed(parts))

    names: dict[str, str] = {}
    for n in nodes:
        for i, a in enumerate(n.args[2:]):
            fqn = targets.get(a.name) if isinstance(a, torch.fx.Node) and a.op == "placeholder" else None
            match = _PARAMETRIZED.match(fqn) if fqn else None
            if fqn is None or match is None or fqn in names:
                continue
            owner = f"{match['prefix']}.{match['name']}" if match["prefix"] else match["name"]
            names[fqn] = f"{owner}{suffix(n)}.{keys[n][i]}"
    return names


def _encode_arg(
    value: Any,
    tensors: list[torch.fx.Node],
    targets: dict[str, str],
    name_of: Callable[[object, str, str], str],
    where: str,
    default: str,
) -> tuple[str, Any]:
    if isinstance(value, torch.fx.Node):
        if value.op == "placeholder" and value.name in targets:
            return ("input", targets[value.name])
        if isinstance(value.meta.get("val"), torch.Tensor):
            tensors.append(value)
            return ("tensor", len(tensors) - 1)
        raise messages.graph_value_in_construction(where, value.name, value.meta.get("val"))
    if value is None or isinstance(value, (bool, int, float, str)):
        return ("const", value)
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return ("torch", str(value).removeprefix("torch."))
    if isinstance(value, torch.device):
        return ("device", str(value))
    if opaque_kind(value) == "reference":
        return ("name", name_of(value, where, default))
    try:
        return ("pickle", base64.b64encode(pickle.dumps(value)).decode("ascii"))
    except Exception as error:
        raise messages.constant_not_picklable(where, value, error) from error


def encode(
    ep: Any, name_of: Callable[[object, str, str], str]
) -> tuple[torch.fx.GraphModule, list[ConstructionRecord]]:
    """A copy of ``ep.graph_module`` with every subclass construction stored as
    the library op, and its records; ``ep.graph_module`` itself when it has none.

    ``name_of(obj, site, default)`` names a reference opaque baked into a
    construction (rather than lifted as an input).
    """
    if not _flat_apply_nodes(ep.graph):
        return ep.graph_module, []
    gm = torch.fx.GraphModule(ep.graph_module, _copy_graph(ep.graph))
    gm.meta.update(ep.graph_module.meta)
    targets = _custom_obj_targets(ep)
    records = []
    for node in _flat_apply_nodes(gm.graph):
        func_spec, in_spec = _attr(gm, node.args[0]), _attr(gm, node.args[1])
        func = getattr(pytree.tree_unflatten([], func_spec), "func", None)
        where = f"the construction {node.name!r} of {_describe_func(func)}"
        func_name = _importable_name(func, where)
        try:
            spec_text = pytree.treespec_dumps(in_spec)
        except Exception as error:
            raise messages.spec_not_serializable(where, error) from error
        tensors: list[torch.fx.Node] = []
        keys = _keys(in_spec, len(node.args) - 2)
        args = tuple(
            _encode_arg(a, tensors, targets, name_of, where, f"{node.name}.{k}")
            for a, k in zip(node.args[2:], keys, strict=True)
        )
        records.append(ConstructionRecord(node.name, func_name, spec_text, args))
        spec_nodes = [a for a in node.args[:2] if isinstance(a, torch.fx.Node)]
        node.target = _stored_op()
        node.args = (node.name, tensors)
        for spec_node in spec_nodes:
            if not spec_node.users:
                gm.graph.erase_node(spec_node)
    gm.recompile()
    return gm, records


def _copy_graph(graph: torch.fx.Graph) -> torch.fx.Graph:
    """A copy of ``graph`` keeping node names, which the signature refers to (a copy
    renames the placeholder ``input``, a builtin, to ``input_1``)."""
    new = copy.deepcopy(graph)  # node for node, in order
    for node, twin in zip(graph.nodes, new.nodes, strict=True):
        if twin.op != node.op:
            raise messages.graph_copy_out_of_step(node.name)
        twin.name = node.name
    return new


def _describe_func(func: Any) -> str:
    return qualified_name(func) if isinstance(func, type) else repr(func)


def _importable_name(func: Any, where: str) -> str:
    name = qualified_name(func) if callable(func) else None
    if name is None or "<locals>" in name or import_qualified(name) is not func:
        raise messages.construction_not_importable(where, func)
    return name


def decode(ep: Any, records: tuple[ConstructionRecord, ...], objects: Mapping[str, object], source: str) -> None:
    """Turn the stored-construction nodes of the freshly loaded ``ep`` back into
    ``flat_apply`` calls (``ep`` is the library's own object); ``objects`` binds
    the reference opaques baked into constructions."""
    from torch._higher_order_ops.flat_apply import func_to_graphable

    gm = ep.graph_module
    by_key = {r.key: r for r in records}
    inputs = {fqn: name for name, fqn in _custom_obj_targets(ep).items()}
    placeholders = {n.name: n for n in gm.graph.nodes if n.op == "placeholder"}
    stored = _stored_op()
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is stored]
    for index, node in enumerate(nodes):
        key, tensors = node.args
        record = by_key.get(key)
        func = import_qualified(record.func) if record is not None else None
        if record is None or func is None:
            raise messages.construction_unresolved(source, key, None if record is None else record.func)
        flat: list[Any] = []
        for kind, value in record.args:
            if kind == "tensor":
                flat.append(tensors[value])
            elif kind == "input":
                flat.append(placeholders[inputs[value]])
            elif kind == "const":
                flat.append(value)
            elif kind == "torch":
                flat.append(getattr(torch, value))
            elif kind == "device":
                flat.append(torch.device(value))
            elif kind == "pickle":
                flat.append(pickle.loads(base64.b64decode(value)))
            elif kind == "name":
                flat.append(objects[value])
            else:
                raise messages.argument_kind_unknown(source, kind)
        func_attr, spec_attr = f"_opaque_subclass_func_{index}", f"_opaque_subclass_in_spec_{index}"
        setattr(gm, func_attr, func_to_graphable(func)[1])
        setattr(gm, spec_attr, pytree.treespec_loads(record.in_spec))
        with gm.graph.inserting_before(node):
            # create_node, not get_attr: the attributes are specs, not modules or tensors
            func_node = gm.graph.create_node("get_attr", func_attr)
            spec_node = gm.graph.create_node("get_attr", spec_attr)
        node.target = _flat_apply()
        node.args = (func_node, spec_node, *flat)
    if nodes:
        gm.recompile()
