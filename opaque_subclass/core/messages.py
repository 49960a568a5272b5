"""The errors of the core's walk, spec, checks, flattening, generated code and run-time helpers,
one constructor per situation; the checks stay where they run."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, TypeVar

import torch

from opaque_subclass.core.errors import (
    OpaqueAttributeError,
    OpaqueSubclassError,
    OpaqueTypeError,
    OpaqueValueError,
    adopt_fix,
    describe_type,
    import_fix,
    qualified_name,
    subject,
)

__all__ = [
    "attribute_missing",
    "builtin_listed",
    "context_unequal_to_copy",
    "describe_args_not_a_list",
    "distributed_context",
    "flatten_not_a_pair",
    "flatten_not_a_tensor",
    "joint_not_a_pair",
    "joint_without_tangent_metas",
    "layout_not_a_tensor_class",
    "layout_read_only",
    "layout_slot_attr_differs",
    "layout_slot_misplaced",
    "layout_slot_wrong_type",
    "leaf_count",
    "leaf_not_a_tensor",
    "leaf_not_the_opaque",
    "leaf_unregistered",
    "list_as_attribute_fix",
    "names_not_a_sequence",
    "names_not_strings",
    "names_repeated",
    "no_tensor_attribute",
    "not_a_module",
    "not_a_spec",
    "rebuilt_differs",
    "tangent_coerced_wrong",
    "tangent_metadata_differs",
    "tangent_names_differ",
    "tangent_of_opaque",
    "tangent_slot_kind_differs",
    "tangent_slot_not_a_tensor",
    "tangent_slot_not_an_opaque",
    "torch_value_listed",
    "unflatten_returned_wrong_type",
    "unregistered_listed",
    "unwrap_args_not_a_list",
    "unwrap_attribute_missing",
    "unwrap_count",
    "unwrap_metas_count",
    "unwrap_names_changed",
    "unwrap_nested_where_tensor",
    "unwrap_slot_not_a_tensor",
    "unwrap_slot_not_an_opaque",
    "unwrap_wrong_type",
    "value_opaque_listed",
    "wrap_slot_not_a_tensor",
    "wrap_slot_not_an_opaque",
    "wrap_width",
]

_E = TypeVar("_E", bound=Exception)

_REGISTER_REFERENCE = 'opaque_subclass.register_opaque({cls}, kind="reference")'


class _Listed(Protocol):
    """An attribute a level lists (:class:`~opaque_subclass.core.walk.Attr`), as messages read it."""

    @property
    def name(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def value(self) -> object: ...


# ---------------------------------------------------------------------- the walk: __tensor_flatten__'s result


def _flatten_at(cls: type, path: str, rest: str) -> OpaqueTypeError:
    return OpaqueTypeError(f"{subject(cls)}.__tensor_flatten__() at {path!r} {rest}")


_LIST_FIX = 'Fix: return a list such as ["_data", "_mesh"].'


def flatten_not_a_pair(cls: type, path: str, result: object) -> OpaqueTypeError:
    return _flatten_at(
        cls,
        path,
        f"returned {describe_type(result)}; it must return a pair (attribute_names, context). "
        'Fix: `return ["_data", "_mesh"], ctx` with ctx any hashable value.',
    )


def names_not_a_sequence(cls: type, path: str, names: object) -> OpaqueTypeError:
    return _flatten_at(
        cls,
        path,
        f"returned attribute names as {describe_type(names)}; they must be a list or tuple, whose order fixes the "
        "flat slots (a set has no order; a generator is used up by the first reader). " + _LIST_FIX,
    )


def names_not_strings(cls: type, path: str, names: object) -> OpaqueTypeError:
    rest = f"returned attribute names {names!r}; the first element must be a list of attribute-name strings. "
    return _flatten_at(cls, path, rest + _LIST_FIX)


def names_repeated(cls: type, path: str, names: Sequence[str]) -> OpaqueTypeError:
    repeated = sorted({n for n in names if names.count(n) > 1})
    return _flatten_at(
        cls,
        path,
        f"lists {repeated} more than once in {list(names)!r}; each attribute gets one flat slot. Fix: list each "
        f"attribute name once, e.g. {list(dict.fromkeys(names))!r}.",
    )


def attribute_missing(t: object, path: str, name: str) -> OpaqueAttributeError:
    inner_path = f"{path}.{name}"
    return OpaqueAttributeError(
        f"{subject(type(t))}.__tensor_flatten__() lists attribute {name!r} (path {inner_path!r}) but the tensor "
        f"has no such attribute (found: nothing; it was deleted, or never set). Fix: {_missing_fix(t, path, name)}"
    )


def _missing_fix(t: object, path: str, name: str) -> str:
    """The fix for attribute ``name`` listed by ``t`` (at ``path``) but missing:
    set it again (the statement uses ``path`` where it is a Python expression
    the caller has, else ``t``), or list only attributes every instance has."""
    owner = type(t).__qualname__
    plain = re.fullmatch(r"[A-Za-z_]\w*(\[\d+\])*(\.[A-Za-z_]\w*)*", path) and not path.startswith(("L[", "G["))
    var = path if plain else "t"
    where = "" if plain else f"t: the {owner} at {path!r}; "
    return (
        f"set it on the instance before using it, `{var}.{name} = value` ({where}value: the tensor or "
        f"registered reference opaque it should hold), or return only names of attributes that "
        f"__init__/__new__ sets on every instance from {owner}.__tensor_flatten__."
    )


def no_tensor_attribute(t: object, path: str, names: tuple[str, ...], ctx: object) -> OpaqueTypeError:
    return _flatten_at(
        type(t),
        path,
        f"lists no tensor attribute (names {list(names)!r}); a traceable wrapper subclass needs at least one inner "
        "tensor, from which torch builds its fake and functional copies while tracing. Fix: "
        + _no_tensor_fix(t, names, ctx),
    )


def _literal(value: object) -> str | None:
    """``repr(value)`` when it is a short literal that evaluates back to ``value``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        text = repr(value)
    elif isinstance(value, tuple) and all(v is None or isinstance(v, (bool, int, float, str)) for v in value):
        text = repr(value)
    else:
        return None
    return text if len(text) <= 40 else None


def _no_tensor_fix(t: object, names: tuple[str, ...], ctx: object) -> str:
    """The fix for a level that lists no tensor: list the instance's own tensor
    attribute when it has one (read from its ``__dict__``, nothing called),
    else say which kind of attribute to add; the names are never assumed."""
    try:
        held = [n for n, v in vars(t).items() if isinstance(v, torch.Tensor) and n not in names]
        context = _literal(ctx)
    except Exception:  # an error message must never crash
        held, context = [], None
    if held:
        shown = context if context is not None else "ctx"
        where = "" if context is not None else " (ctx: the context it returns now)"
        return f"list its tensor attribute {held[0]!r} first, `return {[held[0], *names]!r}, {shown}`{where}."
    return (
        "keep the data in a tensor attribute set in __new__ (the instance has none) and return its "
        f"name first: ['<tensor attribute>', *{list(names)!r}], with <tensor attribute> that name."
    )


# ---------------------------------------------------------------------- the walk: what an attribute holds


def _listed(owner_cls: type, name: str, path: str, value: object, value_cls: type) -> str:
    # torch's own sentence for this case (torch 2.12 - 2.15, a RuntimeError), kept first so that code
    # matching torch's text still matches; ours follows it with the path, the type and the fix
    torch_sentence = (
        f"{value_cls.__name__!r} found in tensor attrs of {owner_cls.__name__}.__tensor_flatten__(). "
        "Only tensors and reference-type opaques are allowed in tensor attrs. "
    )
    return (
        f"{torch_sentence}{subject(owner_cls)}.__tensor_flatten__() lists attribute {name!r} "
        f"(path {path!r}), which holds {describe_type(value)}"
    )


_INTO_CONTEXT = (
    "into the flatten context (second return value of __tensor_flatten__) and read it back in __tensor_unflatten__."
)


def value_opaque_listed(error: type[_E], owner_cls: type, name: str, path: str, value: object, value_cls: type) -> _E:
    return error(
        f"{_listed(owner_cls, name, path, value, value_cls)}, a value-type opaque. Value opaques are constants that "
        "torch.compile compares and bakes into the graph, so they belong in the flatten context, not "
        "in the attribute list. Fix: remove it from the names and return it in the "
        f"context (`return names, (..., self.{name})`), or, if its identity matters, "
        "re-register the class as a reference opaque in a fresh process."
    )


def torch_value_listed(owner_cls: type, name: str, path: str, value: object, value_cls: type) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"{_listed(owner_cls, name, path, value, value_cls)}, one of torch's own value types, which torch.compile "
        f"handles itself and which cannot be an opaque. Fix: move {name!r} {_INTO_CONTEXT}"
    )


def builtin_listed(owner_cls: type, name: str, path: str, value: object, value_cls: type) -> OpaqueTypeError:
    return OpaqueTypeError(f"{_listed(owner_cls, name, path, value, value_cls)}. Fix: move {name!r} {_INTO_CONTEXT}")


def unregistered_listed(owner_cls: type, name: str, path: str, value: object, value_cls: type) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"{_listed(owner_cls, name, path, value, value_cls)}, which is neither a tensor nor a registered reference "
        "opaque. Fix: "
        + import_fix(value_cls, _REGISTER_REFERENCE)
        + f", or move {name!r} into the flatten context if it is a constant."
    )


# ---------------------------------------------------------------------- the spec and rebuilding


def layout_read_only() -> OpaqueTypeError:
    return OpaqueTypeError(
        "SubclassLayout.attrs is read-only (metas are shared by compiled code). Fix: build a "
        "new meta with the attributes you want, `import dataclasses; "
        "meta = dataclasses.replace(meta, attrs={**meta.attrs, name: slot_meta})` (name, slot_meta: "
        "the entry to add, numbered after the others), or make one from an instance with "
        "opaque_subclass.describe_args([x])[0]"
    )


def layout_not_a_tensor_class(given: object) -> OpaqueTypeError:
    shown = qualified_name(given) if isinstance(given, type) else describe_type(given)
    return OpaqueTypeError(
        f"SubclassLayout.subclass_type must be a torch.Tensor subclass, got {shown}"
        f"{' (a class that is not a tensor)' if isinstance(given, type) else ''}. Fix: pass the "
        "wrapper subclass the meta describes (subclass_type=MeshTensor for a MeshTensor), not the class "
        "of one of its attributes, or make the meta from an instance: `import opaque_subclass; "
        "meta = opaque_subclass.describe_args([x])[0]` (x: an instance)"
    )


def _meta_entry(error: type[_E], cls: type, name: str, problem: str, fix: str) -> _E:
    """``<Cls> meta: attrs[<name>] <problem> Fix: <fix>``"""
    return error(f"{subject(cls)} meta: attrs[{name!r}] {problem} Fix: {fix}")


def layout_slot_wrong_type(cls: type, name: str, sub: object, expected: int) -> OpaqueTypeError:
    problem = f"must be a TensorSlot, OpaqueSlot or SubclassLayout, got {describe_type(sub)}."
    fix = (
        f"describe a tensor attribute with `TensorSlot({expected}, {name!r})`, an opaque with "
        f"OpaqueSlot({expected}, {name!r}, <its class>), a nested subclass with its own SubclassLayout"
    )
    return _meta_entry(OpaqueTypeError, cls, name, problem, fix)


def layout_slot_attr_differs(cls: type, name: str, attr: object) -> OpaqueValueError:
    problem = f"describes attribute {attr!r}; the key and the meta's attr must agree."
    fix = (
        f"build attrs[{name!r}] with attr={name!r}, `import dataclasses; "
        f"slot = dataclasses.replace(slot, attr={name!r})` (slot: that meta)"
    )
    return _meta_entry(OpaqueValueError, cls, name, problem, fix)


def layout_slot_misplaced(cls: type, name: str, start: int, expected: int, field_name: str) -> OpaqueValueError:
    return OpaqueValueError(
        f"{subject(cls)} meta: attribute {name!r} starts at flat "
        f"slot {start}, expected {expected} (slots must be contiguous, in order). Fix: give "
        f"attrs[{name!r}] {field_name}={expected}, and number the attributes after it on from there"
    )


def unflatten_returned_wrong_type(cls: type, result: object, path: str, *, found: str | None = None) -> OpaqueTypeError:
    """``cls.__tensor_unflatten__`` returned ``result``, not a ``cls`` (``found``: how to name it,
    when not by ``result``'s type)."""
    return OpaqueTypeError(
        f"{subject(cls)}.__tensor_unflatten__ (rebuilding {path!r}) returned "
        f"{found or describe_type(result)}, expected an instance of {cls.__qualname__}. Fix: "
        f"make {cls.__qualname__}.__tensor_unflatten__ return "
        f"{cls.__qualname__}(...) built from inner_tensors, the context and outer_size/"
        "outer_stride."
    )


def _unflatten_slot(owner: str, idx: int, path: str, rest: str) -> OpaqueTypeError:
    return OpaqueTypeError(f"unflatten of {owner}: slot {idx} ({path!r}) {rest}")


_LEAF_ORDER_FIX = "Fix: pass leaves in the order flatten_subclass returned them."


def leaf_unregistered(owner: str, idx: int, path: str, leaf: object) -> OpaqueTypeError:
    return _unflatten_slot(
        owner,
        idx,
        path,
        f"holds a {qualified_name(type(leaf))}, which is not registered as a reference opaque in this "
        "process. Fix: " + import_fix(type(leaf), _REGISTER_REFERENCE) + " before rebuilding.",
    )


def leaf_not_the_opaque(owner: str, idx: int, path: str, expected: type, leaf: object) -> OpaqueTypeError:
    rest = f"expects a reference opaque of type {qualified_name(expected)}, got {describe_type(leaf)}. "
    return _unflatten_slot(owner, idx, path, rest + _LEAF_ORDER_FIX)


def leaf_not_a_tensor(owner: str, idx: int, path: str, leaf: object) -> OpaqueTypeError:
    return _unflatten_slot(owner, idx, path, f"expects a tensor, got {describe_type(leaf)}. {_LEAF_ORDER_FIX}")


def not_a_spec(spec: object) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"unflatten_subclass expects a spec from flatten_subclass, got {describe_type(spec)}. "
        "Fix: pass the second value returned by flatten_subclass (or a meta from "
        "describe_args)."
    )


def leaf_count(
    owner: str, width: int, start: int, given: int, counts: tuple[int, int] | None = None
) -> OpaqueValueError:
    """``counts``: the spec's tensors and opaques, for a subclass's spec."""
    detail = "" if counts is None else f" ({counts[0]} tensors, {counts[1]} opaques)"
    return OpaqueValueError(
        f"unflatten of {owner}: the spec describes {width} leaves{detail} starting at slot {start}, but {given} leaves "
        "were given. Fix: pass exactly the leaves flatten_subclass returned for this spec "
        "(same subclass structure)."
    )


# ---------------------------------------------------------------------- the input checks


def rebuilt_differs(cls: type, path: str, what: str, got: object, want: object) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"{subject(cls)}.__tensor_unflatten__ (rebuilding {path!r}) returned a {cls.__qualname__} with {what} {got}, "
        f"but the instance it was flattened from has {what} {want}. Fix: build the result with outer_size/"
        "outer_stride and the dtype of the instance (torch.Tensor._make_wrapper_subclass(cls, outer_size, "
        "strides=outer_stride, dtype=...))."
    )


def list_as_attribute_fix(
    owner_cls: type, names: Sequence[str], attr: str | None, name: str, path: str, obj_type: type
) -> str:
    """The fix moving an object of ``obj_type`` (at ``path`` of the context) to the attributes, as
    ``attr`` (the attribute holding it, if any) or ``name``: by the class's owner, or by adopting the class."""
    listed = f"`return {[*names, attr]!r}, <the context without it>`" if attr else "its attribute name"
    return (
        f"list it among the attributes: return {listed} from {owner_cls.__qualname__}.__tensor_flatten__ and "
        "read it from inner_tensors in __tensor_unflatten__ (a graph input, passed by identity); "
        + adopt_fix(owner_cls, name, path, obj_type)
    )


def _context_holds(cls: type, level_path: str, where: str, culprit: object) -> str:
    return (
        f"{subject(cls)}.__tensor_flatten__() at {level_path!r} returns a flatten context whose "
        f"<context>{where} holds {describe_type(culprit)}"
    )


def context_unequal_to_copy(
    cls: type, level_path: str, where: str, culprit: object, culprit_cls: type, registered: bool, as_input: str
) -> OpaqueTypeError:
    """``as_input``: :func:`list_as_attribute_fix`'s fix; ``registered``: whether ``culprit_cls`` is a
    registered reference opaque."""
    if registered:
        fix = as_input
    else:
        fix = (
            "register its class, "
            + import_fix(culprit_cls, _REGISTER_REFERENCE)
            + f", and {as_input}; or, if it is a constant, give {culprit_cls.__name__} value equality: define "
            "`def __eq__(self, other): return type(other) is type(self) and vars(other) == vars(self)` and "
            "`def __hash__(self): return hash(type(self))` in its class (or define __metadata_guard__ on "
            f"{cls.__qualname__})"
        )
    eq: object = type(culprit).__eq__
    why = "it compares by identity" if eq is object.__eq__ else "its __eq__ says so"
    return OpaqueTypeError(
        f"{_context_holds(cls, level_path, where, culprit)}, which is not equal to a copy of itself ({why}). "
        "torch.compile guards the context by comparing it with a deep copy, so "
        "that guard could never pass (torch: 'Guard failed on the same frame it was created'). "
        f"Fix: {fix}."
    )


def distributed_context(cls: type, level_path: str, where: str, culprit: object, as_input: str) -> OpaqueTypeError:
    """A ``ProcessGroup`` or ``DeviceMesh`` in a flatten context; ``as_input``: :func:`list_as_attribute_fix`'s fix."""
    culprit_cls = type(culprit)
    if not any(klass.__name__ == "DeviceMesh" for klass in culprit_cls.__mro__):
        why = (
            "torch.compile guards the context by comparing it with a deep copy, and a process group "
            "cannot be copied (torch: 'cannot pickle ... ProcessGroup' while building guards)"
        )
    else:
        why = (
            "torch.compile guards the context by ==, and a mesh's == compares its ranks and layout, not "
            "its process groups: a later call with another, equal mesh would run with the first call's mesh"
        )
    # The registration is a no-op where torch (or the user) registered the class already.
    fix = (
        "make it an opaque attribute: register its class (as torch 2.12+ registers it), "
        + import_fix(culprit_cls, "opaque_subclass.register_opaque({cls})")
        + f", and {as_input}"
    )
    return OpaqueTypeError(
        f"{_context_holds(cls, level_path, where, culprit)}, a communicator of this job, not a constant: {why}. "
        f"Fix: {fix}."
    )


def not_a_module(value: object, function: str, graph: bool) -> OpaqueTypeError:
    """``function`` (a public function taking a module; with ``graph``, a graph module) got ``value``."""
    package = function.rpartition(".")[0]
    if graph:
        fix = (
            "pass the graph module a torch.compile backend receives, or trace one, "
            f"`import torch, {package}; gm = torch.fx.symbolic_trace(model); {function}(gm)` "
            "(model: your torch.nn.Module)"
        )
    elif isinstance(value, type) and issubclass(value, torch.nn.Module):
        fix = f"pass an instance, not the class, `import {package}; {function}({value.__qualname__}(...))`"
    elif isinstance(value, torch.Tensor):
        fix = (
            f"hold the tensor in a module first, `import torch, {package}; module = torch.nn.Module(); "
            f"module.weight = torch.nn.Parameter(t, requires_grad=t.requires_grad); {function}(module)` "
            "(t: your tensor)"
        )
    elif isinstance(value, (list, tuple)) and value and all(isinstance(m, torch.nn.Module) for m in value):
        fix = (
            f"pass one module, `import torch, {package}; {function}(torch.nn.ModuleList(modules))` (modules: your list)"
        )
    else:
        fix = f"pass the module itself, `import {package}; {function}(model)` (model: your torch.nn.Module)"
    what = "a torch.fx.GraphModule" if graph else "a torch.nn.Module"
    return OpaqueTypeError(f"{function} expects {what}, got {describe_type(value)}. Fix: {fix}.")


def _tangent_fix(cls: type) -> str:
    return (
        "Fix: give backward a gradient with the output's attributes, `out.backward(torch.ones_like(out))` "
        "(out: the function's output; ones_like dispatches through the subclass and keeps them), or define "
        f"{cls.__qualname__}.__coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None) "
        "returning such a tangent."
    )


def tangent_names_differ(cls: type, path: str, attrs: Sequence[_Listed], want_names: list[str]) -> OpaqueTypeError:
    """A tangent (at ``path``, listing ``attrs``) lists other names than its forward output's ``want_names``."""
    names = [a.name for a in attrs]
    gone = [n for n in want_names if n not in names]
    held = ", ".join(f"{a.path!r} holding {describe_type(a.value)}" for a in attrs if a.name not in want_names)
    return OpaqueTypeError(
        f"tangent {path!r} is a {subject(cls)} whose __tensor_flatten__() lists {names!r}, but the "
        f"forward output it is the gradient of listed {want_names!r} (with an equal flatten context): "
        "backward reads a tangent's leaves by the output's attribute names, so it would "
        + (
            f"read {', '.join(repr(f'{path}.{n}') for n in gone)} instead of what the tangent lists"
            if gone
            else "misplace them"
        )
        + (f" and drop {held}" if held else "")
        + f". {_tangent_fix(cls)}"
    )


def tangent_slot_kind_differs(cls: type, path: str, name: str, value: object, opaque: bool) -> OpaqueTypeError:
    """The tangent's attribute ``name`` (at ``path``) holds ``value`` where the output held an opaque
    (``opaque``) or a tensor."""
    expectation = "a reference opaque" if opaque else "a tensor"
    return OpaqueTypeError(
        f"tangent {path!r} ({subject(cls)}.__tensor_flatten__() lists {name!r}) holds "
        f"{describe_type(value)}, but the forward output held {expectation} there: backward "
        f"would pass it to the graph in {expectation}'s slot. {_tangent_fix(cls)}"
    )


# ---------------------------------------------------------------------- flattening


def flatten_not_a_tensor(t: object) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"flatten_subclass expects a tensor, got {describe_type(t)}. Fix: pass the "
        "subclass instance; for a list of arguments use describe_args."
    )


def describe_args_not_a_list(args: object) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"describe_args expects a list or tuple of arguments, got {describe_type(args)}. "
        "Fix: wrap a single argument in a list, describe_args([x])."
    )


# ---------------------------------------------------------------------- the generated unwrap and wrap

_REMAKE_METAS = (
    "re-create the metadata from the arguments as they are now, `import opaque_subclass; "
    "metas = opaque_subclass.describe_args(args)` (args: the list passed)"
)


def unwrap_wrong_type(cls: type, name: str, x: object) -> OpaqueTypeError:
    found = describe_type(x)
    return OpaqueTypeError(
        f"run-time unwrap expected a {qualified_name(cls)} at {name} (the type the metadata was made from), got "
        f"{found}. Fix: re-create the metadata for the new argument types (torch.compile recompiles on a type change)."
    )


def unwrap_slot_not_a_tensor(cls: type, path: str, value: object) -> OpaqueTypeError:
    fix = f"give {path} a tensor, or re-create the metadata (describe_args) from arguments of the new structure."
    return OpaqueTypeError(
        f"run-time unwrap of {qualified_name(cls)}: {path} is a tensor slot (the metadata was made from a tensor "
        f"there), got {describe_type(value)}. Fix: {fix}"
    )


def _opaque_slot(
    what: str, path: str, expected: type, value: object, found: type, unregistered: bool, fix: str
) -> OpaqueTypeError:
    """``value`` (of class ``found``; ``unregistered``: not a tensor, its class not registered) in the
    opaque slot at ``path``."""
    if unregistered and found.__module__ != "builtins":
        fix = (
            "register its class as a reference opaque before the call, "
            + import_fix(found, _REGISTER_REFERENCE)
            + f"; or {fix[0].lower()}{fix[1:]}"
        )
    return OpaqueTypeError(
        f"{what}: {path} is an opaque slot (the metadata was made from a {qualified_name(expected)} there), "
        f"got {describe_type(value)}, which is not a registered reference opaque. Fix: {fix}"
    )


def unwrap_slot_not_an_opaque(
    cls: type, path: str, value: object, expected: type, found: type, unregistered: bool
) -> OpaqueTypeError:
    fix = (
        f"give it back its opaque before the call, `{path} = obj` (obj: a {qualified_name(expected)}), "
        "or re-create the metadata (describe_args) from arguments of the new structure."
    )
    return _opaque_slot(f"run-time unwrap of {qualified_name(cls)}", path, expected, value, found, unregistered, fix)


_WRAP_ORDER_FIX = (
    "pass the flat values in the order the metadata describes (the order unwrap_args "
    "returns), or re-create the metadata (describe_args) for the new structure."
)


def wrap_slot_not_a_tensor(idx: int, owner: str, path: str, value: object) -> OpaqueTypeError:
    found = describe_type(value)
    return OpaqueTypeError(
        f"run-time wrap of {owner}: flat slot {idx} rebuilds the tensor attribute {path}, got {found}. Fix: "
        + _WRAP_ORDER_FIX
    )


def wrap_slot_not_an_opaque(
    idx: int, owner: str, path: str, value: object, expected: type, found: type, unregistered: bool
) -> OpaqueTypeError:
    where = f"flat slot {idx} (rebuilding {path})"
    return _opaque_slot(f"run-time wrap of {owner}", where, expected, value, found, unregistered, _WRAP_ORDER_FIX)


def unwrap_count(expected: int, got: int) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"run-time unwrap expected {expected} arguments (the metadata describes {expected}), "
        f"got {got}. Fix: re-create the metadata for these arguments."
    )


def unwrap_names_changed(cls: type, path: str, attrs: Sequence[_Listed], meta_names: list[str]) -> OpaqueTypeError:
    """The instance at ``path`` lists ``attrs``, the metadata was made when it listed ``meta_names``."""
    names = [a.name for a in attrs]
    stale = [f"{path}.{n}" for n in meta_names if n not in names]
    new = [a for a in attrs if a.name not in meta_names]
    return OpaqueTypeError(
        f"run-time unwrap of {subject(cls)} at {path}: its __tensor_flatten__() lists {names!r} now, but "
        f"the metadata was made when it listed {meta_names!r} (the flatten context is not compared); "
        "reading it by the metadata would "
        + (
            f"take {', '.join(map(repr, stale))}, which it no longer lists (a stale value)"
            if stale
            else "misplace its leaves"
        )
        + ("" if not new else ", and leave out " + ", ".join(f"{a.path!r} ({describe_type(a.value)})" for a in new))
        + f". Fix: {_REMAKE_METAS}, and pass subclass_metas=metas."
    )


def unwrap_nested_where_tensor(cls: type, path: str, value: object) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"run-time unwrap of {subject(cls)}: {path} holds a {describe_type(value)}, a subclass "
        f"with leaves of its own, but the metadata was made from a plain tensor there. Fix: {_REMAKE_METAS}."
    )


def unwrap_attribute_missing(
    cls: type, owner: type, path: str, name: str, held_type: type | None, opaque: bool
) -> OpaqueAttributeError:
    """``name``, listed by the ``owner`` instance at ``path`` and by the metadata (made from a
    ``held_type`` there: a reference opaque when ``opaque``, ``None`` for a tensor), is missing."""
    if held_type is None:
        held = "a tensor"
    else:
        held = f"a {qualified_name(held_type)}" + (" (a reference opaque)" if opaque else "")
    return OpaqueAttributeError(
        f"run-time unwrap of {subject(cls)}: {path}.{name} is missing: "
        f"{owner.__qualname__}.__tensor_flatten__() lists {name!r}, but the instance has no such attribute "
        f"(found: nothing; it was deleted, or never set), and the metadata was made from {held} there. "
        f"Fix: set it again before the call, `{path}.{name} = value` (value: {held}; {path}: the instance "
        f"at that position of the arguments), or stop listing {name!r} in "
        f"{owner.__qualname__}.__tensor_flatten__ for instances without it and re-create the metadata."
    )


# ---------------------------------------------------------------------- the run-time helpers


def unwrap_args_not_a_list(wrapped_args: object) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"unwrap_args expects a list or tuple of arguments, got "
        f"{describe_type(wrapped_args)}. Fix: pass [x] for a single argument, or "
        "is_joint_structure=True with a (primals, tangents) pair."
    )


def unwrap_metas_count(count: int, metas: int, what: str) -> OpaqueSubclassError:
    return OpaqueSubclassError(
        f"unwrap: {count} {what} but {metas} metas; the metas describe other arguments. Fix: make the metas from "
        f"exactly these arguments, `import opaque_subclass; metas = opaque_subclass.describe_args({what})` ({what}: "
        "the list passed), and pass subclass_metas=metas."
    )


def joint_not_a_pair(what: str, pair: object) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"{what}: a joint structure is a pair (primals, tangents) of lists or tuples, "
        f"got {describe_type(pair)}"
        + (f" of length {len(pair)}" if isinstance(pair, (tuple, list)) else "")
        + ". Fix: pass (list_of_primals, list_of_tangents), or is_joint_structure=False "
        "for a flat list."
    )


def wrap_width(width: int, saved: int | None, given: int) -> OpaqueSubclassError:
    """The metas describe ``width`` slots (plus ``saved`` activations), ``given`` values came."""
    extra = f" plus {saved} saved activations" if saved is not None else ""
    return OpaqueSubclassError(
        f"wrap_args: the metas describe {width} flat slots{extra} "
        f"({width + (saved or 0)} values) but {given} values were given. The flat list "
        "must come from the same subclass structure the metas were made from. Fix: wrap the list "
        "that unwrapping the values gives, `import opaque_subclass; flat = "
        "opaque_subclass.unwrap_args(args, is_joint_structure=False, subclass_metas=metas)` "
        "(args: the values the metas were made from), or, if __tensor_flatten__ changed, re-create "
        "the metas with opaque_subclass.describe_args(args)."
    )


def joint_without_tangent_metas() -> OpaqueValueError:
    return OpaqueValueError(
        "wrap_args_maybe_joint: a joint structure needs tangent_metas. Fix: pass tangent_metas=describe_args(tangents)."
    )


def tangent_of_opaque(name: str, opaque_type: type) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"tangent {name!r}: the forward output in this slot was a "
        f"{qualified_name(opaque_type)} opaque, which has no tangent, but a tensor "
        "was given. Fix: pass None for outputs that are opaques."
    )


def tangent_metadata_differs(
    name: str, runtime_type: type, runtime_ctx: object, expected_type: type, expected_ctx: object
) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"tangent {name!r} is a {qualified_name(runtime_type)} with flatten context "
        f"{runtime_ctx!r}, but the forward output was a {qualified_name(expected_type)} "
        f"with context {expected_ctx!r}. Fix: define "
        f"{runtime_type.__qualname__}.__coerce_same_metadata_as_tangent__(self, "
        "expected_metadata, expected_type=None) returning a tangent of the expected "
        "type and context, or make backward produce one."
    )


def tangent_coerced_wrong(name: str, runtime_type: type, coerced: object, expected_type: type) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"tangent {name!r}: {subject(runtime_type)}.__coerce_same_metadata_as_tangent__ "
        f"returned {describe_type(coerced)}, expected a {qualified_name(expected_type)}. "
        "Fix: make it return a tensor of the expected type and flatten context."
    )


def tangent_slot_not_a_tensor(name: str, attr: str, value: object) -> OpaqueTypeError:
    rest = ", `out.backward(torch.ones_like(out))` (out: the output) makes one."
    return _tangent_slot(name, attr, "a tensor in this slot (the forward output held one)", value, rest)


def tangent_slot_not_an_opaque(name: str, attr: str, value: object) -> OpaqueTypeError:
    return _tangent_slot(name, attr, "a reference opaque in this slot", value, ".")


def _tangent_slot(name: str, attr: str, expected: str, value: object, rest: str) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"tangent '{name}.{attr}': expected {expected}, got {describe_type(value)}. Fix: the tangent subclass "
        f"must hold the same attributes as the forward output{rest}"
    )
