"""``save`` and ``load``: exported programs whose reference opaques are rebound at load.

Note [Reference opaques are rebound, never pickled]
---------------------------------------------------
A reference opaque (a ``DeviceMesh``, a process-group handle) means *this
process's* object: unpickled in another job, it would name a process group that
job never created. ``torch.export.save`` pickles such objects by value wherever
it meets them (in subclass parameters and buffers, as lifted custom-object
constants). :func:`save` instead hands torch a copy of the program in which

* every subclass tensor holding reference opaques (parameters, buffers,
  constants; nested at any depth) is a
  :class:`~opaque_subclass.export._stored.StoredSubclass` placeholder keeping
  the tensors and contexts, each opaque replaced with a name;
* every reference opaque held directly as a constant is an :class:`OpaqueName`;
* every subclass the graph rebuilds (after ``unwrap_subclass_parameters``) is a
  library op whose arguments the manifest records
  (:mod:`opaque_subclass.export._constructions`);
* example inputs holding reference opaques are left out (torch reloads them
  with ``weights_only=True``, which rebuilds no subclass);

and records each name and type in a manifest, an extra file of the archive
(:mod:`opaque_subclass.export.manifest`). :func:`load` lets torch load the
archive, binds every name to a caller-supplied object and rebuilds the
subclasses through their own ``__tensor_unflatten__``. One object at several
places gets one name, so sharing survives. The caller's program is never changed.
"""

from __future__ import annotations

import copy
import os
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import torch
from torch.utils import _pytree as pytree

from opaque_subclass.core.errors import OpaqueSubclassError, OpaqueTypeError, qualified_name
from opaque_subclass.core.flatten import flatten_subclass, is_wrapper_subclass
from opaque_subclass.core.registry import OpaqueBase, opaque_kind, register_opaque
from opaque_subclass.core.spec import OpaqueSlot, iter_slots
from opaque_subclass.export import messages
from opaque_subclass.export._constructions import decode, default_names, encode
from opaque_subclass.export._stored import FORMAT_VERSION, StoredSubclass, restore_stored, spec_tree
from opaque_subclass.export.manifest import MANIFEST_NAME, ConstructionRecord, ExportManifest, OpaqueRecord
from opaque_subclass.releases import LIBRARY_VERSION

__all__ = ["OpaqueBindingError", "OpaqueName", "load", "read_manifest", "save"]

FileLike = str | os.PathLike[str] | IO[bytes]
Resolver = Callable[[str, type], object]


class OpaqueBindingError(OpaqueSubclassError, LookupError):
    """:func:`load` was not given an object for every name the program needs."""


class OpaqueName(OpaqueBase):
    """Stands for a reference opaque held directly as a program constant (a
    lifted custom object). A reference opaque itself, registered on first use,
    so that ``torch.export.save`` stores it where the object was."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"OpaqueName({self.name!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (OpaqueName, (self.name,))


def _register_name_type() -> None:
    if opaque_kind(OpaqueName) is None:
        register_opaque(OpaqueName, kind="reference")


@dataclass
class _Found:
    obj: object
    name: str
    sites: list[str] = field(default_factory=list)


class _Plan:
    """The names of a program's reference opaques, and its placeholders."""

    def __init__(self, user_names: Mapping[str, object]) -> None:
        self.found: dict[int, _Found] = {}
        self._user: dict[int, str] = {}
        for name, obj in user_names.items():
            if not isinstance(name, str) or not name:
                raise messages.name_not_a_string(name)
            if id(obj) in self._user:
                raise messages.named_twice(obj, self._user[id(obj)], name)
            self._user[id(obj)] = name
        self._user_objects = dict(user_names)
        self.dropped_example_inputs = False

    def name_of(self, obj: object, site: str, default: str) -> str:
        found = self.found.get(id(obj))
        if found is None:
            found = _Found(obj, self._user.get(id(obj), default))
            self.found[id(obj)] = found
        found.sites.append(site)
        return found.name

    @staticmethod
    def holds_opaque(t: torch.Tensor) -> bool:
        if not is_wrapper_subclass(t):
            return False
        _, spec = flatten_subclass(t)
        return any(isinstance(slot, OpaqueSlot) for _, slot in iter_slots(spec))

    def stand_in(self, t: torch.Tensor, path: str, site: str) -> torch.Tensor:
        """``t``, or its placeholder when it holds reference opaques."""
        if not is_wrapper_subclass(t):
            return t
        leaves, spec = flatten_subclass(t, name=path)
        opaque_paths = {slot.unwrapped_idx: p for p, slot in iter_slots(spec, path) if isinstance(slot, OpaqueSlot)}
        if not opaque_paths:
            return t
        names = [self.name_of(leaves[i], site + p[len(path) :], p) for i, p in sorted(opaque_paths.items())]
        return restore_stored(
            FORMAT_VERSION,
            spec_tree(spec),
            [None if i in opaque_paths else leaf for i, leaf in enumerate(leaves)],
            names,
            path,
            tuple(t.shape),
            tuple(t.stride()),
            t.dtype,
            str(t.device),
            t.requires_grad,
            isinstance(t, torch.nn.Parameter),
        )

    def manifest(self, constructions: tuple[ConstructionRecord, ...] = ()) -> ExportManifest:
        by_name: dict[str, _Found] = {}
        for found in self.found.values():
            other = by_name.setdefault(found.name, found)
            if other is not found:
                raise messages.name_for_two_objects(found.name, other.obj, other.sites, found.obj, found.sites)
        unused = [name for name, obj in self._user_objects.items() if id(obj) not in self.found]
        if unused:
            raise messages.names_not_held(unused, [(f.name, f.obj) for f in self.found.values()])

        records = tuple(OpaqueRecord(f.name, qualified_name(type(f.obj)), tuple(f.sites)) for f in self.found.values())
        return ExportManifest(torch.__version__, LIBRARY_VERSION, records, self.dropped_example_inputs, constructions)


def _strip(ep: Any, plan: _Plan) -> tuple[Any, tuple[ConstructionRecord, ...]]:
    """A shallow copy of ``ep`` whose state dict, constants and example inputs hold
    placeholders instead of reference opaques, and whose graph stores subclass
    constructions as the library op (``ep`` itself is not changed); with the
    records of those constructions."""
    defaults = default_names(ep)
    state_dict = {fqn: plan.stand_in(t, fqn, f"state_dict[{fqn!r}]") for fqn, t in ep.state_dict.items()}
    constants: dict[str, Any] = {}
    for fqn, c in ep.constants.items():
        if isinstance(c, torch.Tensor):
            constants[fqn] = plan.stand_in(c, fqn, f"constants[{fqn!r}]")
        elif opaque_kind(c) == "reference":
            constants[fqn] = _opaque_name(plan.name_of(c, f"constants[{fqn!r}]", defaults.get(fqn, fqn)))
        else:
            constants[fqn] = c
    example_inputs = ep.example_inputs
    if example_inputs is not None and any(
        plan.holds_opaque(x) for x in pytree.tree_leaves(example_inputs) if isinstance(x, torch.Tensor)
    ):
        # torch loads example inputs with weights_only=True, which can rebuild no
        # subclass; and they are only examples: not saved, rather than pickled.
        example_inputs = None
        plan.dropped_example_inputs = True
    graph_module, constructions = encode(ep, plan.name_of)
    stripped = copy.copy(ep)
    stripped._graph_module = graph_module
    stripped._state_dict = state_dict
    stripped._constants = constants
    stripped._example_inputs = example_inputs
    return stripped, tuple(constructions)


def _opaque_name(name: str) -> OpaqueName:
    _register_name_type()
    return OpaqueName(name)


def save(
    ep: torch.export.ExportedProgram,
    f: FileLike,
    *,
    opaques: Mapping[str, object] | None = None,
    extra_files: Mapping[str, str] | None = None,
) -> ExportManifest:
    """Save ``ep`` like ``torch.export.save``, with every reference opaque stored by name.

    Parameters
    ----------
    ep
        The exported program (not changed).
    f
        A file name or a writable binary file object.
    opaques
        Optional names for the reference opaques, ``{"mesh": mesh}``; others are named after
        the first place holding them (``"w._mesh"`` for the ``_mesh`` of subclass parameter ``w``).
    extra_files
        More extra files for the archive, as for ``torch.export.save``.

    Returns
    -------
    ExportManifest
        Each name, its type and where the program holds it.
    """
    if not isinstance(ep, torch.export.ExportedProgram):
        raise messages.not_an_exported_program(ep)
    files = dict(extra_files or {})
    if MANIFEST_NAME in files:
        raise messages.extra_file_reserved(MANIFEST_NAME)
    plan = _Plan(opaques or {})
    stripped, constructions = _strip(ep, plan)
    manifest = plan.manifest(constructions)
    files[MANIFEST_NAME] = manifest.to_json()
    torch.export.save(stripped, f, extra_files=files)
    return manifest


def read_manifest(f: FileLike) -> ExportManifest | None:
    """The manifest of an archive written by :func:`save`, without loading the
    program; ``None`` for an archive that has none."""
    pos = f.tell() if hasattr(f, "tell") else None
    try:
        with zipfile.ZipFile(f) as archive:
            for member in archive.namelist():
                if member.endswith(f"extra/{MANIFEST_NAME}"):
                    return ExportManifest.from_json(archive.read(member).decode("utf-8"), source=_describe(f))
    finally:
        if pos is not None:
            f.seek(pos)  # type: ignore[union-attr]  # checked by hasattr
    return None


def _describe(f: FileLike) -> str:
    return repr(os.fspath(f)) if isinstance(f, (str, os.PathLike)) else "the archive"


def _bind(manifest: ExportManifest, opaques: Mapping[str, object] | Resolver | None, source: str) -> dict[str, object]:
    """Every name of ``manifest`` -> the caller's object, checked; one error lists every problem."""
    objects: dict[str, object] = {}
    missing: list[OpaqueRecord] = []
    wrong: list[tuple[OpaqueRecord, object]] = []
    mapping = opaques if isinstance(opaques, Mapping) else None
    for record in manifest.opaques:
        if mapping is not None:
            obj = mapping.get(record.name, _MISSING)
        elif opaques is not None:
            obj = opaques(record.name, record.resolve_type() or object)  # type: ignore[operator]  # a resolver
            obj = _MISSING if obj is None else obj
        else:
            obj = _MISSING
        if obj is _MISSING:
            missing.append(record)
        elif not record.accepts(obj) or opaque_kind(obj) == "value":
            wrong.append((record, obj))
        else:
            objects[record.name] = obj
    unknown = sorted(set(mapping) - set(manifest.names)) if mapping is not None else []
    if not (missing or wrong or unknown):
        for obj in objects.values():
            # Saved as a reference opaque; a process that has not registered the
            # class yet (DeviceMesh on torch 2.11 before its first ShardedTensor)
            # gets the same registration, so the rebuilt subclasses accept it.
            if opaque_kind(obj) is None:
                register_opaque(type(obj), kind="reference")
        return objects
    given = [(record, obj, opaque_kind(obj) == "value") for record, obj in wrong]
    error = OpaqueTypeError if wrong and not missing else OpaqueBindingError
    raise messages.unbound(error, manifest, source, missing, given, unknown)


_MISSING = object()


def _rebind(ep: Any, objects: Mapping[str, object]) -> None:
    """Replace the placeholders of the freshly loaded ``ep`` (the library's own
    object, not the caller's) by the bound objects and rebuilt subclasses."""
    for container in (ep.state_dict, ep.constants):
        for key, value in list(container.items()):
            if isinstance(value, StoredSubclass):
                container[key] = value.rebuild(objects)
            elif isinstance(value, OpaqueName):
                container[key] = objects[value.name]


def load(
    f: FileLike,
    *,
    opaques: Mapping[str, object] | Resolver | None = None,
    extra_files: dict[str, Any] | None = None,
) -> torch.export.ExportedProgram:
    """Load a program saved by :func:`save`, binding its reference opaques to ``opaques``.

    Parameters
    ----------
    f
        A file name or a readable binary file object.
    opaques
        This process's objects: ``{name: object}`` with the manifest's names (see :func:`read_manifest`),
        or a resolver ``(name, cls) -> object`` called once per name (``None`` for none).
    extra_files
        As for ``torch.export.load``: the names to read, filled in place.

    Returns
    -------
    torch.export.ExportedProgram
        The program; its subclass parameters, buffers, constants and so outputs hold the given objects.

    Raises
    ------
    OpaqueBindingError
        A required name has no object (the message lists every name and type).
    TypeError
        An object is not an instance of the type saved for its name.
    OpaqueSubclassError
        torch could not load an archive saved with another torch release.
    """
    source = _describe(f)
    files: dict[str, Any] = dict.fromkeys(extra_files or {}, "")
    files[MANIFEST_NAME] = ""
    pos = f.tell() if hasattr(f, "tell") else None
    _register_name_type()  # before torch unpickles the constants that are OpaqueNames
    try:
        ep = torch.export.load(f, extra_files=files)
    except Exception as error:
        if pos is not None:
            f.seek(pos)  # type: ignore[union-attr]  # checked by hasattr
        try:
            manifest = read_manifest(f)
        except Exception:
            manifest = None
        if manifest is not None and manifest.torch_version != torch.__version__:
            raise messages.torch_cannot_load(source, manifest.torch_version, error) from error
        raise
    text = files.pop(MANIFEST_NAME)
    if extra_files is not None:
        extra_files.update(files)
    if not text:
        if opaques:
            raise messages.opaques_for_plain_archive(OpaqueBindingError, source)
        return ep
    manifest = ExportManifest.from_json(text, source=source)
    objects = _bind(manifest, opaques, source)
    _rebind(ep, objects)
    decode(ep, manifest.constructions, objects, source)
    return ep
