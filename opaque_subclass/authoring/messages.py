"""The errors of :class:`~opaque_subclass.OpaqueSubclass` (its declarations, construction,
``wrap_like`` and dispatch), each naming the class and a fix that runs as written."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from opaque_subclass.core import errors
from opaque_subclass.core.errors import describe_type, import_fix, qualified_name, subject

__all__ = [
    "base_class_built",
    "declared_twice",
    "first_instance_compiling",
    "given_twice",
    "implements_on_base",
    "invalid_name",
    "leaf_of_grad_tensor",
    "metadata_differs",
    "missing_values",
    "names_as_string",
    "names_without_order",
    "no_tensor_attrs",
    "not_a_tensor",
    "opaque_attrs_not_a_mapping",
    "opaque_is_plain_value",
    "opaque_is_tensor_class",
    "opaque_is_value_opaque",
    "opaque_not_a_class",
    "opaque_not_registered",
    "opaques_differ",
    "registered_as_value_later",
    "registration_failed",
    "rule_raised_type_error",
    "shadows_tensor",
    "too_many_values",
    "unexpected_argument",
    "wrap_like_mismatch",
    "wrong_opaque",
]


def _declaration(cls: type, message: str) -> errors.OpaqueTypeError:
    return errors.OpaqueTypeError(f"{subject(cls)}: {message}")


def _register_fix(opaque_cls: type) -> str:
    return import_fix(opaque_cls, 'opaque_subclass.register_opaque({cls}, kind="reference")')


def _tuple_source(names: Sequence[object]) -> str:
    return f"({', '.join(map(repr, names))}{',' if len(names) == 1 else ''})"


def _valid_name(name: object, reserved: frozenset[str]) -> str:
    """An attribute name made from ``name`` for a fix: ``'2d'`` -> ``'_2d'``."""
    text = re.sub(r"\W", "_", str(name)) or "_attr"
    if not text.startswith("_"):
        text = "_" + text
    return text if text.isidentifier() and text not in reserved else "_attr"


# ---------------------------------------------------------------------- declarations


def names_as_string(cls: type, group: str, names: str) -> errors.OpaqueTypeError:
    return _declaration(
        cls, f"{group} must be a tuple of names, got the string {names!r}. Fix: `{group} = ({names!r},)`"
    )


def names_without_order(cls: type, group: str, names: Any) -> errors.OpaqueTypeError:
    try:  # the names of a set or dict, in a fixed order: the user's to check
        given = [n for n in names if isinstance(n, str)]
        fixed = _tuple_source(sorted(given) if isinstance(names, (set, frozenset)) else given)
    except Exception:
        fixed = '("_data",)'
    return _declaration(
        cls,
        f"{group} must be a tuple of attribute names, got {describe_type(names)}, which has no fixed order. "
        f"Fix: a tuple in the order the flat slots should have, e.g. `{group} = {fixed}`",
    )


def invalid_name(
    cls: type, group: str, name: object, names: Sequence[object], reserved: frozenset[str]
) -> errors.OpaqueTypeError:
    fixed = _tuple_source([_valid_name(n, reserved) if n == name else n for n in names])
    return _declaration(cls, f"{group} entry {name!r} is not a valid attribute name. Fix: `{group} = {fixed}`")


def shadows_tensor(cls: type, group: str, name: str) -> errors.OpaqueTypeError:
    return _declaration(
        cls, f"{group} entry {name!r} would shadow torch.Tensor.{name}. Fix: rename it, e.g. '_{name}'."
    )


def no_tensor_attrs(cls: type) -> errors.OpaqueTypeError:
    return _declaration(
        cls,
        'declares no tensor_attrs; a wrapper subclass needs at least one inner tensor. Fix: tensor_attrs = ("_data",)',
    )


def opaque_attrs_not_a_mapping(cls: type, declared: object) -> errors.OpaqueTypeError:
    return _declaration(
        cls,
        f"opaque_attrs must map names to opaque classes, got {describe_type(declared)}. "
        'Fix: opaque_attrs = {"_mesh": DeviceMesh}',
    )


def declared_twice(cls: type, name: str, first: str, second: str, rest: Sequence[str]) -> errors.OpaqueTypeError:
    return _declaration(
        cls,
        f"{name!r} is declared in both {first} and {second}; each attribute belongs to one group. Fix: keep it "
        f"in {first} only, `{second} = {_tuple_source(rest)}` (rename the other attribute if both are meant)",
    )


def opaque_not_a_class(cls: type, name: str, value: object) -> errors.OpaqueTypeError:
    shown = type(value).__name__
    return _declaration(
        cls,
        f"opaque_attrs[{name!r}] must be a class, got {describe_type(value)} (an instance). Fix: name its class, "
        f"`opaque_attrs = {{{name!r}: {shown}}}` (with {shown} in scope), and pass the object to the constructor",
    )


def _entry_is(cls: type, name: str, opaque_cls: type, what: str) -> errors.OpaqueTypeError:
    return _declaration(cls, f"opaque_attrs[{name!r}] is {qualified_name(opaque_cls)}, {what}")


def opaque_is_tensor_class(cls: type, name: str, opaque_cls: type) -> errors.OpaqueTypeError:
    return _entry_is(cls, name, opaque_cls, f"a tensor class. Fix: declare {name!r} in tensor_attrs")


def opaque_is_plain_value(cls: type, name: str, opaque_cls: type) -> errors.OpaqueTypeError:
    what = (
        "a plain value type that cannot be registered as an opaque (torch.compile compares such values and "
        f"specializes on them). Fix: declare {name!r} in meta_attrs (metadata, kept in the flatten context), or "
        "wrap the value in a class registered with opaque_subclass.register_opaque if its identity must travel "
        "as a graph input"
    )
    return _entry_is(cls, name, opaque_cls, what)


def opaque_is_value_opaque(cls: type, name: str, opaque_cls: type) -> errors.OpaqueTypeError:
    what = f"a value-type opaque. Value opaques are constants compiled into the graph. Fix: declare {name!r} in meta_attrs."
    return _entry_is(cls, name, opaque_cls, what)


def opaque_not_registered(cls: type, name: str, opaque_cls: type) -> errors.OpaqueTypeError:
    what = (
        "which is not a registered opaque type. Fix: register it before defining the class: "
        f"{_register_fix(opaque_cls)}, or declare the class with register_opaques=True to register it when the "
        "first instance is built"
    )
    return _entry_is(cls, name, opaque_cls, what)


def registration_failed(cls: type, name: str, error: TypeError | ValueError) -> TypeError | ValueError:
    """``register_opaque``'s error for an ``OpaqueAttr`` entry: same type, naming the entry."""
    return type(error)(f"{subject(cls)}: opaque_attrs[{name!r}]: {error}")


def first_instance_compiling(cls: type, pending: Sequence[type]) -> errors.OpaqueTypeError:
    return errors.OpaqueTypeError(
        f"{subject(cls)}: its first instance is built inside torch.compile, where its opaque classes "
        f"({', '.join(qualified_name(c) for c in pending)}) cannot be registered. Fix: build one "
        f"{cls.__qualname__} before compiling, or register them first: " + "; ".join(_register_fix(c) for c in pending)
    )


def registered_as_value_later(cls: type, opaque_cls: type) -> errors.OpaqueTypeError:
    return errors.OpaqueTypeError(
        f"{subject(cls)}: {qualified_name(opaque_cls)} was registered as a value-type opaque after the class "
        "was declared; its opaque_attrs need a reference opaque. Fix: register it with "
        'kind="reference" (before any other registration), or declare the attribute in meta_attrs.'
    )


def _declared_subclasses(base: type) -> list[type]:
    """User subclasses of ``base`` (not the library's), in declaration order as far as ``__subclasses__`` keeps it."""
    found: list[type] = []
    stack: list[type] = list(reversed(base.__subclasses__()))
    while stack:
        klass = stack.pop()
        if "_value_names" in klass.__dict__ and not klass.__module__.startswith("opaque_subclass"):
            found.append(klass)
        stack.extend(reversed(klass.__subclasses__()))
    return found


def implements_on_base(base: type, ops: tuple[Any, ...]) -> errors.OpaqueTypeError:
    """``OpaqueSubclass.implements(...)``: the fix names the latest declared subclass (or a placeholder)."""
    try:
        declared = _declared_subclasses(base)
        name = declared[-1].__name__ if declared else "YourSubclass"
        shown = ", ".join(f"torch.ops.{op}" for op in ops) or "torch.ops.aten.mul.Tensor"
    except Exception:  # an error message must never crash
        name, shown = "YourSubclass", "torch.ops.aten.mul.Tensor"
    scope = f" (with {name} in scope)" if name != "YourSubclass" else " (YourSubclass: your OpaqueSubclass)"
    return errors.OpaqueTypeError(
        "OpaqueSubclass.implements() registers a rule for one subclass, not for the base class. Fix: call it "
        f"on your subclass, `import torch; {name}.implements({shown})`{scope}, as the decorator "
        f"@{name}.implements({shown})."
    )


# ---------------------------------------------------------------------- construction


def base_class_built() -> errors.OpaqueTypeError:
    return errors.OpaqueTypeError(
        "OpaqueSubclass is a base class and declares no attributes, so it cannot be built. Fix: declare a "
        'subclass, `class Scaled(OpaqueSubclass): tensor_attrs = ("_data",)`, and build that: Scaled(data) '
        "(add opaque_attrs and meta_attrs as needed)."
    )


def leaf_of_grad_tensor(cls: type, name: str) -> errors.OpaqueValueError:
    return errors.OpaqueValueError(
        f"{subject(cls)}: requires_grad=True asks for a leaf, but the inner tensor {name!r} requires grad, "
        f"so the result would be computed from it. Fix: pass {name}=t.detach() for a leaf, or drop "
        "requires_grad=True to stay differentiable with respect to t."
    )


def too_many_values(cls: type, names: Sequence[str], count: int) -> errors.OpaqueTypeError:
    return errors.OpaqueTypeError(
        f"{subject(cls)}() takes {len(names)} values ({', '.join(names)}), got {count}. Fix: drop the last "
        f"{count - len(names)} value(s): pass one value per declared attribute, in the order {', '.join(names)}"
    )


def unexpected_argument(cls: type, name: str, names: Sequence[str]) -> errors.OpaqueTypeError:
    close = difflib.get_close_matches(name, names, n=1) or difflib.get_close_matches(f"_{name}", names, n=1)
    fix = f"write {close[0]}= instead of {name}=" if close else "use one of the declared names"
    return errors.OpaqueTypeError(
        f"{subject(cls)}() got an unexpected argument {name!r}; declared attributes are {', '.join(names)}. Fix: {fix}"
    )


def given_twice(cls: type, name: str, names: Sequence[str]) -> errors.OpaqueTypeError:
    position = names.index(name) + 1
    return errors.OpaqueTypeError(
        f"{subject(cls)}() got {name!r} both by position and by keyword. Fix: give it once: drop {name}= or "
        f"pass only {position - 1} positional value(s)"
    )


def missing_values(cls: type, missing: Sequence[str], names: Sequence[str]) -> errors.OpaqueTypeError:
    return errors.OpaqueTypeError(
        f"{subject(cls)}() is missing {', '.join(map(repr, missing))}. Fix: pass "
        + ", ".join(f"{n}=..." for n in missing)
        + f" too (declared attributes, in order: {', '.join(names)})"
    )


def _must_be(cls: type, name: str, what: str, group: str, value: object, fix: str) -> errors.OpaqueTypeError:
    return errors.OpaqueTypeError(
        f"{subject(cls)}.{name} must be {what} (declared in {group}), got {describe_type(value)}. Fix: {fix}"
    )


def not_a_tensor(cls: type, name: str, value: object) -> errors.OpaqueTypeError:
    fix = f"pass a tensor for {name}, e.g. {name}=torch.as_tensor(value) for a list or number"
    return _must_be(cls, name, "a tensor", "tensor_attrs", value, fix)


def wrong_opaque(cls: type, name: str, expected: type, value: object) -> errors.OpaqueTypeError:
    fix = f"pass the {expected.__qualname__} object itself."
    return _must_be(cls, name, f"a {qualified_name(expected)}", "opaque_attrs", value, fix)


def wrap_like_mismatch(cls: Any, tensors: Mapping[str, Any]) -> errors.OpaqueSubclassError:
    """``wrap_like(**tensors)`` with names other than exactly ``tensor_attrs``, or a non-tensor."""
    missing = [n for n in cls.tensor_attrs if n not in tensors]
    problems = [f"missing {', '.join(map(repr, missing))}"] if missing else []
    for name, value in tensors.items():
        if name in cls.tensor_attrs:
            if not isinstance(value, torch.Tensor):
                problems.append(f"{name!r} is {describe_type(value)}, not a tensor")
        elif name in cls.opaque_attrs:
            problems.append(f"{name!r} is an opaque attribute (the result keeps the instance's)")
        elif name in cls.meta_attrs:
            problems.append(f"{name!r} is metadata (the result keeps the instance's)")
        else:
            problems.append(f"{name!r} is not an attribute of {cls.__qualname__}")
    given = ", ".join(f"{n}={describe_type(v)}" for n, v in tensors.items()) or "no arguments"
    fix = f"x.wrap_like({', '.join(f'{n}=x.{n}' for n in cls.tensor_attrs)})"
    return errors.OpaqueSubclassError(
        f"{subject(cls)}.wrap_like() takes exactly the inner tensors of tensor_attrs "
        f"({', '.join(map(repr, cls.tensor_attrs))}), each a tensor; opaques and metadata come from the instance. "
        f"It got {given}: {'; '.join(problems)}. Fix: pass every inner tensor, the instance's own where the op "
        f"leaves it unchanged, e.g. `{fix}` with x the {cls.__qualname__} (and the op's results in place of the "
        f"tensors it computes). To change an opaque or metadata, build a new {cls.__qualname__}(...) instead."
    )


# ---------------------------------------------------------------------- dispatch


def opaques_differ(cls: type, func: Any, name: str, value: object) -> errors.OpaqueSubclassError:
    return errors.OpaqueSubclassError(
        f"{subject(cls)}: {func} got arguments whose {name!r} are different {describe_type(value)} objects; "
        f"the default rule needs one {name!r} for all arguments. Fix: bring the arguments to the same {name!r} "
        f"first, or register an implementation with @{cls.__qualname__}.implements({func})."
    )


def metadata_differs(cls: type, func: Any, name: str, a: object, b: object) -> errors.OpaqueSubclassError:
    return errors.OpaqueSubclassError(
        f"{subject(cls)}: {func} got arguments with different {name!r} ({a!r} and {b!r}). Fix: make the "
        f"metadata agree first, or register an implementation with @{cls.__qualname__}.implements({func})."
    )


def rule_raised_type_error(
    cls: type, func: Any, impl: Callable[..., Any] | None, error: TypeError
) -> errors.OpaqueSubclassError:
    rule = "the default rule" if impl is None else f"the rule {getattr(impl, '__qualname__', impl)!s}"
    return errors.OpaqueSubclassError(
        f"{subject(cls)}: {rule} for {func} raised {type(error).__name__}: {error}. It is raised as "
        "OpaqueSubclassError, with the original chained above, because torch turns a TypeError inside a "
        "Python operator (x * 2) into NotImplemented, which would show only 'unsupported operand type(s)'. "
        "Fix: correct the rule where the chained traceback points."
    )
