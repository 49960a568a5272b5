"""The manifest: which reference opaques a saved program needs, by name and type.

Stored as JSON in the ``.pt2`` archive's extra file :data:`MANIFEST_NAME`
(readable with ``torch.export.load(f, extra_files=...)``). Example::

    {
      "format": "opaque-subclass/export", "version": 2,
      "torch": "2.13.0+cpu", "opaque_subclass": "0.1.0",
      "opaques": [
        {"name": "w._mesh", "type": "torch.distributed.device_mesh.DeviceMesh",
         "sites": ["state_dict['w']._mesh", "state_dict['v']._mesh"]}
      ],
      "example_inputs_dropped": false,
      "constructions": []
    }

``sites``: every place holding the object (one name per object, so sharing
survives); ``example_inputs_dropped``: example inputs held reference opaques and
were not saved; ``constructions``: subclass constructions of a graph exported
after ``unwrap_subclass_parameters`` (:mod:`opaque_subclass.export._constructions`).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from typing import Any

from opaque_subclass.core.errors import OpaqueSubclassError, qualified_name
from opaque_subclass.export import messages

__all__ = ["MANIFEST_NAME", "ConstructionRecord", "ExportManifest", "OpaqueRecord", "import_qualified"]

#: Name of the manifest among the archive's extra files.
MANIFEST_NAME = "opaque_subclass.json"

_FORMAT = "opaque-subclass/export"
_VERSION = 2  # 2: "constructions" (programs after unwrap_subclass_parameters)


def import_qualified(name: str) -> Any:
    """The object a qualified name (``pkg.module.Class.attr``) spells in this process,
    or ``None`` when no importable module and attribute path gives it."""
    module_name, _, qualname = name.rpartition(".")
    while module_name:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            module_name, _, head = module_name.rpartition(".")
            qualname = f"{head}.{qualname}"
            continue
        obj: Any = module
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
        return obj
    return None


@dataclass(frozen=True, slots=True)
class OpaqueRecord:
    """One reference opaque a saved program needs.

    Attributes
    ----------
    name
        The name :func:`opaque_subclass.export.load` binds an object to.
    type_name
        The qualified name of the object's class when it was saved.
    sites
        Where the program holds it (``"state_dict['w']._mesh"``, ...).
    """

    name: str
    type_name: str
    sites: tuple[str, ...]

    def resolve_type(self) -> type | None:
        """The class named by :attr:`type_name` in this process, or ``None`` when it
        cannot be imported by that name (a class defined in a function)."""
        obj = import_qualified(self.type_name)
        return obj if isinstance(obj, type) else None

    def accepts(self, obj: object) -> bool:
        """Whether ``obj`` may be bound to this record: an instance of the saved
        class, or, where that class cannot be imported, of a class of that name."""
        cls = self.resolve_type()
        if cls is not None:
            return isinstance(obj, cls)
        return any(qualified_name(k) == self.type_name for k in type(obj).__mro__)


@dataclass(frozen=True, slots=True)
class ConstructionRecord:
    """One subclass construction of a saved graph.

    Attributes
    ----------
    key
        The ``key`` argument of the stored op (``opaque_subclass::stored_construction``) (the node's name at save).
    func
        Qualified name of what the construction calls (the subclass).
    in_spec
        ``torch.utils._pytree.treespec_dumps`` of its ``(args, kwargs)`` spec.
    args
        One entry per flat argument: ``("tensor", i)`` (the op's ``i``-th tensor),
        ``("input", fqn)`` (the lifted opaque input of that constant name),
        ``("name", name)`` (a reference opaque baked in, bound by name),
        ``("const", value)``, ``("torch", attr)`` (``torch.<attr>``),
        ``("device", str)`` or ``("pickle", base64)``.
    """

    key: str
    func: str
    in_spec: str
    args: tuple[tuple[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "func": self.func, "in_spec": self.in_spec, "args": [list(a) for a in self.args]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ConstructionRecord:
        return cls(
            str(data["key"]), str(data["func"]), str(data["in_spec"]), tuple((str(k), v) for k, v in data["args"])
        )


@dataclass(frozen=True, slots=True)
class ExportManifest:
    """What :func:`opaque_subclass.export.save` recorded about a program."""

    torch_version: str
    library_version: str
    opaques: tuple[OpaqueRecord, ...]
    example_inputs_dropped: bool = False
    constructions: tuple[ConstructionRecord, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.opaques)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": _FORMAT,
                "version": _VERSION,
                "torch": self.torch_version,
                "opaque_subclass": self.library_version,
                "opaques": [{"name": r.name, "type": r.type_name, "sites": list(r.sites)} for r in self.opaques],
                "example_inputs_dropped": self.example_inputs_dropped,
                "constructions": [c.to_json() for c in self.constructions],
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str, *, source: str = "the archive") -> ExportManifest:
        try:
            data = json.loads(text)
            if data.get("format") != _FORMAT:
                raise messages.manifest_format_unknown(data.get("format"))
            if int(data["version"]) > _VERSION:
                raise messages.manifest_newer(source, data["version"], _VERSION)
            records = tuple(OpaqueRecord(str(o["name"]), str(o["type"]), tuple(o["sites"])) for o in data["opaques"])
            constructions = tuple(ConstructionRecord.from_json(c) for c in data.get("constructions", ()))
            return cls(
                str(data["torch"]),
                str(data["opaque_subclass"]),
                records,
                bool(data.get("example_inputs_dropped")),
                constructions,
            )
        except OpaqueSubclassError:
            raise
        except (ValueError, KeyError, TypeError) as e:
            raise messages.not_a_manifest(source, MANIFEST_NAME, e) from None

    def describe(self) -> str:
        """One line per name: ``'w._mesh' (torch...DeviceMesh) at state_dict['w']._mesh``."""
        lines = []
        for r in self.opaques:
            lines.append(f"  {r.name!r} ({r.type_name}) at {', '.join(r.sites)}")
        return "\n".join(lines)
