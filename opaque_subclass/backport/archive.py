"""The ``.pt2`` archive with opaque constants (torch 2.11; the same functions in 2.12).

torch 2.11 and 2.12 write and read only tensors and TorchScript objects as the
constants of an exported program: a program holding an opaque as a constant (a
lifted custom object: an opaque module attribute a custom op reads) fails in
``torch.export.save`` with ``RuntimeError: Unsupported constant type``. torch
2.13 stores each such constant as a pickle under ``data/constants/opaque_obj_<i>``
and reads it back. The replacements below write and read that same layout, so
an archive saved on 2.11 or 2.12 is the one 2.13 writes.

:func:`opaque_subclass.export.save` puts an ``OpaqueName`` (a reference opaque
of the library) where the program held a reference opaque, so what is pickled
is a name, never the object. On torch 2.11 (backport mode) a reference opaque
that reaches ``torch.export.save`` directly, as a constant or inside a subclass
tensor, is refused with an error pointing to :func:`opaque_subclass.export.save`;
torch 2.12's fix pickles it, as torch 2.13 does (a documented limit of native
mode).
"""

from __future__ import annotations

import copy
import json
import os
import pickle
from collections.abc import Callable
from typing import Any

import torch

from opaque_subclass.core.errors import OpaqueTypeError, describe_type
from opaque_subclass.core.flatten import flatten_subclass, is_wrapper_subclass
from opaque_subclass.core.registry import opaque_kind
from opaque_subclass.core.spec import OpaqueSlot, iter_slots

__all__ = [
    "make_load_constants",
    "make_package_constants",
    "make_package_opaque_constants",
    "make_save_pickled_tensors",
]

# torch 2.13's file-name prefix for pickled opaque constants (pt2_archive_constants.
# OPAQUE_OBJ_FILENAME_PREFIX there; 2.11 and 2.12 have no such constant).
_OPAQUE_PREFIX = "opaque_obj_"


def _opaque_constants(ep: Any) -> dict[str, Any]:
    return {
        fqn: c
        for fqn, c in ep.constants.items()
        if not isinstance(c, (torch.Tensor, torch._C.ScriptObject)) and opaque_kind(c) is not None
    }


def _write_opaque_constants(original: Callable[..., Any], refuse_reference: bool) -> Callable[..., Any]:
    def _package_constants(
        model_name: str, exported_program: Any, archive_writer: Any, *args: Any, **kwargs: Any
    ) -> Any:
        opaques = _opaque_constants(exported_program)
        if not opaques:
            return original(model_name, exported_program, archive_writer, *args, **kwargs)
        if refuse_reference:
            from opaque_subclass.export.archive import OpaqueName  # the library's own name; imported on use only

            unnamed = {
                fqn: c for fqn, c in opaques.items() if opaque_kind(c) == "reference" and not isinstance(c, OpaqueName)
            }
            if unnamed:
                fqn, obj = next(iter(unnamed.items()))
                raise OpaqueTypeError(
                    f"torch.export.save: the program holds the reference opaque constant {fqn!r} "
                    f"({describe_type(obj)}); saving it would pickle the object by value, and another process "
                    "would load a copy instead of its own object. Fix: "
                    "`import opaque_subclass.export; opaque_subclass.export.save(ep, f)`, which stores it by name, "
                    "and load with opaque_subclass.export.load(f, opaques={...})."
                )
        rest = copy.copy(exported_program)
        rest._constants = {fqn: c for fqn, c in exported_program.constants.items() if fqn not in opaques}
        config = original(model_name, rest, archive_writer, *args, **kwargs)
        from torch._export.serde import schema
        from torch.export.pt2_archive.constants import CONSTANTS_DIR
        from torch.serialization import DEFAULT_PROTOCOL

        protocol = kwargs.get("pickle_protocol", args[0] if args else DEFAULT_PROTOCOL)
        index = archive_writer.count_prefix(os.path.join(CONSTANTS_DIR, _OPAQUE_PREFIX))
        for fqn, obj in opaques.items():
            path_name = f"{_OPAQUE_PREFIX}{index}"
            index += 1
            archive_writer.write_bytes(os.path.join(CONSTANTS_DIR, path_name), pickle.dumps(obj, protocol=protocol))
            config.config[fqn] = schema.PayloadMeta(
                path_name=path_name, is_param=False, use_pickle=True, tensor_meta=None
            )
        return config

    return _package_constants


def make_package_constants(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch.export.pt2_archive._package._package_constants`` (torch 2.11).

    Without it, ``torch.export.save`` of a program holding an opaque constant
    fails with ``RuntimeError: Unsupported constant type``, so
    ``opaque_subclass.export.save`` cannot store a lifted reference opaque by
    name. With it, opaque constants are pickled under ``opaque_obj_<i>`` as torch
    2.13 does; a reference opaque itself (not the name the library's save puts
    in its place) is refused with a ``TypeError`` pointing to
    ``opaque_subclass.export.save``. Unnecessary since torch 2.13, which writes
    opaque constants itself (pytorch/pytorch#176457 left the archive of torch
    2.12 unchanged: 2.12 gets the same replacement as a native fix).
    """
    return _write_opaque_constants(original, refuse_reference=True)


def make_package_opaque_constants(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch.export.pt2_archive._package._package_constants`` (torch 2.12).

    Without it, ``torch.export.save`` of a program holding an opaque constant
    fails with ``RuntimeError: Unsupported constant type`` (also for the name
    ``opaque_subclass.export.save`` stores in place of a reference opaque). With
    it, opaque constants are pickled under ``opaque_obj_<i>``, as torch 2.13
    does. Unnecessary since torch 2.13.
    """
    return _write_opaque_constants(original, refuse_reference=False)


def _held_reference_opaque(t: Any, fqn: str) -> tuple[str, Any] | None:
    """``(path, object)`` of the first reference opaque ``t`` holds at any depth."""
    if not is_wrapper_subclass(t):
        return None
    leaves, spec = flatten_subclass(t, name=fqn)
    for path, slot in iter_slots(spec, fqn):
        if isinstance(slot, OpaqueSlot) and opaque_kind(leaves[slot.unwrapped_idx]) == "reference":
            return path, leaves[slot.unwrapped_idx]
    return None


def make_save_pickled_tensors(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch.export.pt2_archive._package._save_pickled_tensors`` (torch 2.11).

    torch pickles each subclass parameter, buffer and tensor constant whole.
    Without it, ``torch.export.save`` of a program whose subclass parameter
    holds a ``DeviceMesh`` writes the mesh by value, and another job loads a
    copy naming process groups it never created. With it, such a tensor
    is refused with a ``TypeError`` pointing to ``opaque_subclass.export.save``
    (which stores the opaque by name); every other tensor is saved by torch's
    function. Not a backport of upstream behaviour: torch 2.12 and newer
    (opaque attributes arrived with pytorch/pytorch#176457) pickle such a tensor
    by value, which native mode leaves as a documented limit.
    """

    def _save_pickled_tensors(pickled_items: Any, *args: Any, **kwargs: Any) -> Any:
        items = list(pickled_items)
        for fqn, tensor in items:
            held = _held_reference_opaque(tensor, fqn)
            if held is not None:
                path, obj = held
                raise OpaqueTypeError(
                    f"torch.export.save: the program's tensor {fqn!r} holds the reference opaque {path!r} "
                    f"({describe_type(obj)}); saving it would pickle the object by value, and another process "
                    "would load a copy instead of its own object. Fix: "
                    "`import opaque_subclass.export; opaque_subclass.export.save(ep, f)`, which stores it by name, "
                    "and load with opaque_subclass.export.load(f, opaques={...})."
                )
        return original(items, *args, **kwargs)

    return _save_pickled_tensors


class _ConfigOverride:
    """An archive reader that serves one file (the constants config) changed."""

    def __init__(self, reader: Any, name: str, text: str) -> None:
        self._reader, self._name, self._text = reader, name, text

    def read_string(self, name: str) -> str:
        return self._text if name == self._name else self._reader.read_string(name)

    def read_bytes(self, name: str) -> bytes:
        return self._text.encode("utf-8") if name == self._name else self._reader.read_bytes(name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


def make_load_constants(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch.export.pt2_archive._package._load_constants`` (torch 2.11, 2.12).

    Without it, ``torch.export.load`` of an archive with opaque constants (as
    written by torch 2.13, or by the patched writer) fails with ``RuntimeError:
    Unsupported constant type: opaque_obj_0``. With it, those constants are
    unpickled and everything else is left to torch's function. Unnecessary since
    torch 2.13 (pytorch/pytorch#176457 left the archive of torch 2.12 unchanged).
    """

    def _load_constants(archive_reader: Any, model_name: str) -> Any:
        from torch.export.pt2_archive.constants import CONSTANTS_CONFIG_FILENAME_FORMAT, CONSTANTS_DIR

        config_file = CONSTANTS_CONFIG_FILENAME_FORMAT.format(model_name)
        if config_file not in archive_reader.get_file_names():
            return original(archive_reader, model_name)
        raw = json.loads(archive_reader.read_string(config_file))
        entries = raw.get("config", {})
        ours = {fqn: m for fqn, m in entries.items() if str(m.get("path_name", "")).startswith(_OPAQUE_PREFIX)}
        if not ours:
            return original(archive_reader, model_name)
        rest = dict(raw, config={fqn: m for fqn, m in entries.items() if fqn not in ours})
        constants = original(_ConfigOverride(archive_reader, config_file, json.dumps(rest)), model_name)
        for fqn, meta in ours.items():
            constants[fqn] = pickle.loads(archive_reader.read_bytes(os.path.join(CONSTANTS_DIR, meta["path_name"])))
        return constants

    return _load_constants
