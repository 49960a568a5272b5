"""A process-independent hash of what a compiled program depends on of a wrapper
subclass (never an opaque's identity or value, tensor data or an ``id()``).
:meth:`OpaqueSubclass._stable_hash_for_caching
<opaque_subclass.OpaqueSubclass._stable_hash_for_caching>` returns it for torch
2.12 - 2.15's AOTAutograd cache key; on torch 2.11 the library's key computes
it (:mod:`opaque_subclass.fixes.autograd_cache`)."""

from __future__ import annotations

import hashlib
import io
import pickle
from typing import Any

import torch

from opaque_subclass.core.errors import qualified_name
from opaque_subclass.core.registry import opaque_type_of
from opaque_subclass.core.walk import Attr, walk
from opaque_subclass.releases import LIBRARY_VERSION

__all__ = ["stable_subclass_hash"]


class _SetsSortedPickler(pickle._Pickler):  # the Python pickler: asks reducer_override for every object
    """Pickles sets with elements sorted by their pickle, not per-process ``hash()``."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (set, frozenset)):
            return type(obj), (sorted(obj, key=_stable_dumps),)
        return NotImplemented


def stable_subclass_hash(t: torch.Tensor) -> str:
    """The hash :meth:`OpaqueSubclass._stable_hash_for_caching` returns, for any wrapper subclass ``t``."""
    parts: list[tuple[Any, ...]] = [("opaque-subclass", LIBRARY_VERSION)]
    for path, slot in walk(t):
        if not isinstance(slot, Attr):  # a Level: a subclass, this one first
            owner = slot.owner
            parts.append((path, qualified_name(type(owner)), _tensor_key(owner), _stable_dumps(slot.ctx)))
        elif slot.kind == "opaque":
            parts.append((path, "opaque", qualified_name(opaque_type_of(slot.value))))
        else:
            parts.append((path, "tensor", _tensor_key(slot.value)))
    return hashlib.blake2b(pickle.dumps(parts, 4), digest_size=16).hexdigest()


def _stable_dumps(value: Any) -> bytes:
    """``pickle.dumps(value, 4)``, the same in every process (see :class:`_SetsSortedPickler`)."""
    stream = io.BytesIO()
    _SetsSortedPickler(stream, 4).dump(value)
    return stream.getvalue()


def _tensor_key(t: torch.Tensor) -> tuple[Any, ...]:
    """What a compiled program depends on of one tensor, as text: never its data,
    storage or identity. A symbolic size is its symbol (``s0``)."""
    return (
        tuple(str(s) for s in t.shape),
        tuple(str(s) for s in t.stride()) if t.layout == torch.strided else (),
        str(t.dtype),
        str(t.device),
        str(t.layout),
        t.requires_grad,
        t.is_conj(),
        t.is_neg(),
        t.is_inference(),
    )
