"""The errors of saving and loading exported programs with opaques (:mod:`opaque_subclass.export`),
one constructor per situation; the checks stay where they run and raise what these return.

Most say ``opaque_subclass.export.save: <problem> Fix: <fix>`` (or ``load``): :func:`_api`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

import torch

from opaque_subclass.core.errors import (
    OpaqueSubclassError,
    OpaqueTypeError,
    OpaqueValueError,
    describe_type,
    qualified_name,
)

__all__ = [
    "argument_kind_unknown",
    "constant_not_picklable",
    "construction_not_importable",
    "construction_not_restored",
    "construction_unresolved",
    "extra_file_reserved",
    "graph_copy_out_of_step",
    "graph_value_in_construction",
    "manifest_format_unknown",
    "manifest_newer",
    "name_for_two_objects",
    "name_not_a_string",
    "named_twice",
    "names_not_held",
    "not_a_manifest",
    "not_an_exported_program",
    "opaques_for_plain_archive",
    "placeholder_used",
    "spec_not_serializable",
    "stored_format_newer",
    "torch_cannot_load",
    "tree_node_unknown",
    "unbound",
]

_E = TypeVar("_E", bound=Exception)


class _Record(Protocol):
    """A manifest's :class:`~opaque_subclass.export.manifest.OpaqueRecord`, as messages read it."""

    @property
    def name(self) -> str: ...
    @property
    def type_name(self) -> str: ...


class _Manifest(Protocol):
    """An :class:`~opaque_subclass.export.manifest.ExportManifest`, as messages read it."""

    @property
    def opaques(self) -> Sequence[_Record]: ...
    def describe(self) -> str: ...


def _api(error: type[_E], function: str, problem: str, fix: str) -> _E:
    return error(f"opaque_subclass.export.{function}: {problem} Fix: {fix}")


def _cause(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


# ---------------------------------------------------------------------- the saved placeholder


def tree_node_unknown(node: object) -> OpaqueSubclassError:
    return OpaqueSubclassError(
        f"a saved subclass structure has an unknown node {node!r}: the archive was written by a "
        "newer opaque-subclass. Fix: load it with the opaque-subclass release that saved it, or newer."
    )


def stored_format_newer(path: str, version: int, supported: int) -> OpaqueSubclassError:
    problem = f"the saved subclass at {path!r} has payload format {version}"
    return OpaqueSubclassError(
        f"{problem}; this opaque-subclass reads format {supported} and older. "
        "Fix: upgrade opaque-subclass to the release that saved it."
    )


def _variable(name: str) -> str:
    """A Python variable name for the object stored under ``name`` (``'w._mesh'`` -> ``mesh``)."""
    last = name.rsplit(".", 1)[-1].strip("_[]'\"")
    return last if last.isidentifier() else "obj"


def placeholder_used(
    func: object, cls: type, path: str, names: Sequence[str], opaque_types: Iterable[type]
) -> OpaqueSubclassError:
    """``names``: the saved name at each opaque slot; ``opaque_types``: each slot's class."""
    binding = "{" + ", ".join(f"{n!r}: {_variable(n)}" for n in names) + "}"
    parts = [f"{_variable(n)} is your {qualified_name(t)} for {n!r}" for n, t in zip(names, opaque_types, strict=True)]
    variables = ", ".join(parts) if parts else "opaques maps each saved name to your object"
    return OpaqueSubclassError(
        f"{func} was called on the saved placeholder of {qualified_name(cls)} at "
        f"{path!r}: this program was saved by opaque_subclass.export.save, which stores reference "
        "opaques by name and never by value, and it was loaded without binding them. Fix: load it with "
        f"`opaque_subclass.export.load(f, opaques={binding})`, where f is the saved archive and "
        f"{variables} (opaque_subclass.export.read_manifest(f).opaques lists every name the "
        "program needs)."
    )


# ---------------------------------------------------------------------- the manifest


def manifest_format_unknown(found: object) -> ValueError:
    """Caught where the manifest is read: the detail of :func:`not_a_manifest`."""
    return ValueError(f"format {found!r}")


def manifest_newer(source: str, version: object, supported: int) -> OpaqueSubclassError:
    versions = f"manifest version {version}, this release reads {supported}"
    return OpaqueSubclassError(
        f"{source} was saved by a newer opaque-subclass ({versions}). Fix: python -m pip install -U opaque-subclass"
    )


def not_a_manifest(source: str, file_name: str, error: Exception) -> OpaqueValueError:
    return OpaqueValueError(
        f"{source} has an extra file {file_name!r} that is not an opaque-subclass manifest ({error}). "
        "Fix: load it with torch.export.load, or re-save the program with opaque_subclass.export.save."
    )


# ---------------------------------------------------------------------- save


def not_an_exported_program(ep: object) -> OpaqueTypeError:
    return OpaqueTypeError(
        f"opaque_subclass.export.save expects a torch.export.ExportedProgram, got {describe_type(ep)}. "
        "Fix: opaque_subclass.export.save(torch.export.export(model, args), f)"
    )


def extra_file_reserved(file_name: str) -> OpaqueValueError:
    problem = f"extra file name {file_name!r} is reserved for the manifest."
    return _api(OpaqueValueError, "save", problem, "rename that extra file.")


def name_not_a_string(name: object) -> OpaqueTypeError:
    problem = f"opaque names must be non-empty strings, got {name!r}."
    return _api(OpaqueTypeError, "save", problem, "opaques={'mesh': mesh}")


def named_twice(obj: object, first: str, second: str) -> OpaqueValueError:
    problem = f"one {describe_type(obj)} is named both {first!r} and {second!r}."
    return _api(OpaqueValueError, "save", problem, "give each object one name.")


def name_for_two_objects(
    name: str, first: object, first_sites: Sequence[str], second: object, second_sites: Sequence[str]
) -> OpaqueValueError:
    at = [
        f"{describe_type(obj)} at {', '.join(sites)}" for obj, sites in ((first, first_sites), (second, second_sites))
    ]
    fix = "name them apart, opaque_subclass.export.save(ep, f, opaques={'first': obj1, 'second': obj2})."
    return _api(
        OpaqueValueError, "save", f"the name {name!r} would stand for two different objects ({' and '.join(at)}).", fix
    )


def names_not_held(unused: Sequence[str], held: Iterable[tuple[str, object]]) -> OpaqueValueError:
    """``held``: ``(name, object)`` of each reference opaque the program holds."""
    listed = ", ".join(f"{name!r} ({describe_type(obj)})" for name, obj in held) or "none"
    problem = f"opaques={{...}} names {unused}, which the program does not hold (it holds: {listed})."
    return _api(OpaqueValueError, "save", problem, "name only objects of the program, or drop those names.")


def graph_value_in_construction(where: str, name: str, value: object) -> OpaqueSubclassError:
    return _api(
        OpaqueSubclassError,
        "save",
        f"{where} takes the graph value {name!r} ({describe_type(value)}), which the library cannot store in a "
        "construction (it stores tensors, lifted opaques and constants).",
        "export with static shapes, or export the subclass parameter itself instead of unwrapping it: "
        "torch.nn.utils.parametrize.remove_parametrizations(module, name).",
    )


def constant_not_picklable(where: str, value: object, error: Exception) -> OpaqueSubclassError:
    problem = (
        f"{where} takes the constant {describe_type(value)}, which cannot be pickled ({_cause(error)}). Constants "
        "other than scalars, dtypes and devices (a value opaque, for one) are stored with their own pickling."
    )
    fix = "make the class picklable (define it at module level, or give it __reduce__)."
    return _api(OpaqueSubclassError, "save", problem, fix)


def spec_not_serializable(where: str, error: Exception) -> OpaqueSubclassError:
    problem = f"{where} has an argument structure torch cannot serialize ({_cause(error)})."
    fix = "pass the class's constructor arguments as tensors, opaques and plain constants, in tuples and dicts."
    return _api(OpaqueSubclassError, "save", problem, fix)


def construction_not_importable(where: str, func: object) -> OpaqueSubclassError:
    problem = f"{where} calls {func!r}, which a loading process cannot import by name."
    return _api(OpaqueSubclassError, "save", problem, "define the subclass at module level, so `import` finds it.")


def graph_copy_out_of_step(node: str) -> AssertionError:
    return AssertionError(f"graph copy out of step at {node!r}")


# ---------------------------------------------------------------------- load


def torch_cannot_load(source: str, saved_with: str, error: Exception) -> OpaqueSubclassError:
    return OpaqueSubclassError(
        f"torch {torch.__version__} cannot load the program in {source}, saved with torch {saved_with} "
        f"({_cause(error)}). Fix: load it with torch=={saved_with.split('+')[0]}, or export and save it again "
        "with this torch."
    )


def opaques_for_plain_archive(binding_error: type[_E], source: str) -> _E:
    problem = (
        f"the program in {source} was not saved by opaque_subclass.export.save and binds no opaques, but "
        "opaques={...} was given."
    )
    return _api(binding_error, "load", problem, "load it without opaques=.")


def unbound(
    error: type[_E],
    manifest: _Manifest,
    source: str,
    missing: Sequence[_Record],
    wrong: Sequence[tuple[_Record, object, bool]],
    unknown: Sequence[str],
) -> _E:
    """Every problem of one binding; ``wrong``: ``(record, object given, whether it is a value opaque)``."""
    problems = []
    if missing:
        problems.append("no object for " + ", ".join(repr(r.name) for r in missing))
    for record, obj, is_value in wrong:
        registered = "registered as a value opaque in this process" if is_value else f"not a {record.type_name}"
        problems.append(f"{record.name!r} is a {describe_type(obj)}, {registered}")
    if unknown:
        problems.append(f"names the program does not have: {', '.join(map(repr, unknown))}")
    example = ", ".join(f"{r.name!r}: ..." for r in manifest.opaques)
    return error(
        f"opaque_subclass.export.load: {'; '.join(problems)}. The program in {source} holds reference opaques, "
        f"which are saved by name and never by value; it needs:\n{manifest.describe()}\n"
        f"Fix: pass this process's objects, opaque_subclass.export.load(f, opaques={{{example}}}), "
        "or a resolver opaques=lambda name, cls: ... returning one for each name."
    )


def construction_unresolved(source: str, key: str, func: str | None) -> OpaqueSubclassError:
    """``func``: the qualified name the manifest records for construction ``key``, ``None`` without a record."""
    what, problem = (repr(key), "find its record in the manifest") if func is None else (func, "import it")
    fix = (
        "import the module that defines the subclass before loading, or load with the opaque-subclass release "
        "that saved it."
    )
    problem = f"the program in {source} constructs {what} and this process cannot {problem}."
    return _api(OpaqueSubclassError, "load", problem, fix)


def argument_kind_unknown(source: str, kind: str) -> OpaqueSubclassError:
    problem = (
        f"the program in {source} has a construction argument of kind {kind!r}, written by a newer opaque-subclass."
    )
    return _api(OpaqueSubclassError, "load", problem, "upgrade opaque-subclass.")


def construction_not_restored(key: str) -> OpaqueSubclassError:
    return OpaqueSubclassError(
        f"the subclass construction {key!r} of a program saved by opaque_subclass.export.save ran without being "
        "restored: the program was loaded with torch.export.load, which cannot bind its reference opaques. "
        "Fix: load it with `opaque_subclass.export.load(f, opaques=objects)`, where f is the saved archive and "
        "objects maps each name of `[r.name for r in opaque_subclass.export.read_manifest(f).opaques]` to your "
        "object of that name (the manifest also says each one's type and where the program holds it)."
    )
