"""The ``.pt2`` archive with opaque constants (torch 2.11; the same functions in 2.12).

torch 2.11 and 2.12 store only tensors and TorchScript objects as program
constants: an opaque constant (a lifted module attribute a custom op reads)
fails ``torch.export.save`` with ``RuntimeError: Unsupported constant type``.
torch 2.13 pickles each under ``data/constants/opaque_obj_<i>``; the
replacements write and read that layout, so 2.11 and 2.12 archives match 2.13's.

:func:`opaque_subclass.export.save` puts an ``OpaqueName`` in place of each
reference opaque, so a name is pickled, never the object. On torch 2.11 a
reference opaque reaching ``torch.export.save`` directly (as a constant or in a
subclass tensor) is refused, pointing to :func:`opaque_subclass.export.save`;
torch 2.12's fix pickles it, as 2.13 does (a documented limit of native mode).
"""

from __future__ import annotations

import copy
import json
import os
import pickle
from collections.abc import Callable
from typing import Any

import torch

from opaque_subclass.backport import messages
from opaque_subclass.core.flatten import flatten_subclass, is_wrapper_subclass
from opaque_subclass.core.registry import opaque_kind
from opaque_subclass.core.spec import OpaqueSlot, iter_slots

__all__ = [
    "make_load_constants",
    "make_package_constants",
    "make_package_opaque_constants",
    "make_save_pickled_tensors",
]

# torch 2.13's pt2_archive_constants.OPAQUE_OBJ_FILENAME_PREFIX (absent in 2.11 and 2.12)
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
                raise messages.reference_constant_saved(*next(iter(unnamed.items())))
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

    Without it, ``torch.export.save`` of an opaque constant fails with
    ``RuntimeError: Unsupported constant type`` (even the library's names).
    With it, opaque constants are pickled under ``opaque_obj_<i>`` as torch 2.13
    does; a reference opaque itself is refused with a ``TypeError`` pointing to
    ``opaque_subclass.export.save``. Unnecessary since torch 2.13
    (pytorch/pytorch#176457 left torch 2.12's archive unchanged: 2.12 gets it as a native fix).
    """
    return _write_opaque_constants(original, refuse_reference=True)


def make_package_opaque_constants(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch.export.pt2_archive._package._package_constants`` (torch 2.12).

    Without it, ``torch.export.save`` of an opaque constant (even the library's
    names) fails with ``RuntimeError: Unsupported constant type``. With it, they
    are pickled under ``opaque_obj_<i>``, as torch 2.13 does. Unnecessary since torch 2.13.
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

    Without it, a subclass tensor holding a ``DeviceMesh`` is pickled whole, and
    another job loads a copy naming process groups it never created. With it,
    such a tensor is refused with a ``TypeError`` pointing to
    ``opaque_subclass.export.save`` (which stores opaques by name); others are
    saved by torch. Not a backport: torch 2.12+ (pytorch/pytorch#176457) pickles
    it by value, a documented limit of native mode.
    """

    def _save_pickled_tensors(pickled_items: Any, *args: Any, **kwargs: Any) -> Any:
        items = list(pickled_items)
        for fqn, tensor in items:
            held = _held_reference_opaque(tensor, fqn)
            if held is not None:
                raise messages.reference_in_tensor_saved(fqn, *held)
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

    Without it, loading opaque constants (written by torch 2.13 or the patched
    writer) fails with ``RuntimeError: Unsupported constant type: opaque_obj_0``.
    With it, they are unpickled, the rest left to torch. Unnecessary since torch
    2.13 (pytorch/pytorch#176457 left the archive of torch 2.12 unchanged).
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
