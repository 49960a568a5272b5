"""The errors of the torch 2.11 backport's patches (:mod:`opaque_subclass.backport`), one
constructor per situation; the checks stay in the patches and raise what these return."""

from __future__ import annotations

from collections.abc import Sequence

from opaque_subclass.core import errors
from opaque_subclass.core.errors import describe_type, import_fix, qualified_name
from opaque_subclass.core.registry import opaque_type_of
from opaque_subclass.fixes import members

__all__ = [
    "capture_out_of_line",
    "compiled_width",
    "element_differs",
    "mixed_fake",
    "mixed_functional",
    "no_right_inverse",
    "rebuilt_differs",
    "reference_constant_saved",
    "reference_in_tensor_saved",
    "right_inverse_length",
    "translated_width",
    "unstorable_returned",
    "value_member_undeclared",
    "value_opaque_returned",
]


# ---------------------------------------------------------------------- parametrize.py


def _parametrization(owner: str, problem: str, fix: str) -> errors.OpaqueValueError:
    return errors.OpaqueValueError(f"parametrization of {owner}: {problem} Fix: {fix}")


def value_opaque_returned(owner: str, i: int, value: object) -> errors.OpaqueValueError:
    problem = (
        f"right_inverse returned a value-type opaque ({describe_type(value)}) as element {i}. Only tensors and "
        "reference opaques can be stored; a value opaque is a constant."
    )
    fix = (
        "keep it on the parametrization module (self.config = ...) and use it in forward, or register its class "
        "as a reference opaque."
    )
    return _parametrization(owner, problem, fix)


def unstorable_returned(owner: str, i: int, value: object) -> errors.OpaqueValueError:
    problem = (
        f"right_inverse returned element {i} of type {describe_type(value)}, which is neither a tensor nor a "
        "registered reference opaque."
    )
    register = import_fix(opaque_type_of(value), 'opaque_subclass.register_opaque({cls}, kind="reference")')
    return _parametrization(
        owner, problem, f"return tensors and reference opaques only, registering the class: {register}."
    )


def rebuilt_differs(owner: str, rebuilt: object, shape: Sequence[int], dtype: object) -> errors.OpaqueValueError:
    shape_and_dtype = f"shape {getattr(rebuilt, 'shape', None)} and dtype {getattr(rebuilt, 'dtype', None)}"
    problem = (
        f"forward(right_inverse(x)) gave {describe_type(rebuilt)} with {shape_and_dtype}; expected shape "
        f"{tuple(shape)} and dtype {dtype}."
    )
    return _parametrization(owner, problem, "make forward rebuild the original tensor, or pass unsafe=True.")


def no_right_inverse(module: object) -> RuntimeError:
    return RuntimeError(f"parametrization {type(module).__name__} does not implement right_inverse.")


def right_inverse_length(owner: str, count: int, value: object) -> errors.OpaqueValueError:
    length = f" of length {len(value)}" if isinstance(value, Sequence) else ""
    problem = f"right_inverse must return a sequence of {count} elements, got {describe_type(value)}{length}."
    return _parametrization(owner, problem, "return one element per stored original.")


def element_differs(owner: str, i: int, item: object, dtype: object) -> errors.OpaqueValueError:
    problem = (
        f"element {i} returned by right_inverse is {describe_type(item)} ({getattr(item, 'dtype', None)}) while "
        f"original{i} is a tensor of dtype {dtype}."
    )
    return _parametrization(owner, problem, "return the same kinds and dtypes as at registration.")


# ---------------------------------------------------------------------- aot_autograd.py, fake.py: torch's own wording


def mixed_functional(any_fun: bool, all_fun: bool) -> AssertionError:
    return AssertionError(f"mixed functional/non-functional inner tensors: any_fun={any_fun}, all_fun={all_fun}")


def mixed_fake(any_fake: bool, all_fake: bool) -> AssertionError:
    return AssertionError("got mixed fake and real tensors!")


# ---------------------------------------------------------------------- runtime.py, export.py: invariants


def translated_width(cls: type, ours: int, theirs: int) -> AssertionError:
    return AssertionError(f"translated meta of {cls.__qualname__} takes {ours} slots, torch's takes {theirs}")


def compiled_width(returned: int, width: int, saved: int) -> errors.OpaqueSubclassError:
    return errors.OpaqueSubclassError(
        f"compiled graph returned {returned} flat values; its output metadata describes {width} plus {saved} "
        "saved activations"
    )


def capture_out_of_line(placeholders: int, inputs: int, sources: Sequence[int]) -> AssertionError:
    return AssertionError(
        f"export capture: {placeholders} placeholders, {inputs} example inputs and input sources for "
        f"{sorted(sources)} do not line up"
    )


# ---------------------------------------------------------------------- archive.py


def _pickled_by_value(what: str, obj: object) -> errors.OpaqueTypeError:
    """``torch.export.save: <what> (<type>); ...``: a reference opaque met by ``torch.export.save``."""
    consequence = (
        "saving it would pickle the object by value, and another process would load a copy instead of its own object"
    )
    fix = (
        "`import opaque_subclass.export; opaque_subclass.export.save(ep, f)`, which stores it by name, and load "
        "with opaque_subclass.export.load(f, opaques={...})."
    )
    return errors.OpaqueTypeError(f"torch.export.save: {what} ({describe_type(obj)}); {consequence}. Fix: {fix}")


def reference_constant_saved(fqn: str, obj: object) -> errors.OpaqueTypeError:
    return _pickled_by_value(f"the program holds the reference opaque constant {fqn!r}", obj)


def reference_in_tensor_saved(fqn: str, path: str, obj: object) -> errors.OpaqueTypeError:
    return _pickled_by_value(f"the program's tensor {fqn!r} holds the reference opaque {path!r}", obj)


# ---------------------------------------------------------------------- collectives.py


def value_member_undeclared(cls: type, name: str, source: str | None, line: str) -> errors.OpaqueMemberError:
    """``source``: where compiled code reads the opaque (``L['x']._ctx``), ``None`` if unknown;
    ``line``: the user's line (:func:`opaque_subclass.fixes.members.user_line`)."""
    where = f"at {source}.{name}, " if source is not None else ""
    fix = import_fix(
        cls,
        f'opaque_subclass.register_opaque({{cls}}, kind="value", members={{{{"{name}": opaque_subclass.Member.USE_REAL}}}})',
    )
    return members.undeclared_member_error()(
        f"{members.TORCH_SENTENCE}: compiled code reads {name!r} of the value opaque {qualified_name(cls)} "
        f"({where}{line}), a member its registration does not declare. torch 2.11 "
        f"compiles a member of a value opaque only when it is declared (torch 2.12+ reads it as a constant). "
        f"Fix: declare it where the class is registered (the first registration), {fix} (USE_REAL reads it "
        f"while tracing; the value opaque's equality guard covers it)."
    )
