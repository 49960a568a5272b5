"""AOTAutograd's cache key and the sharing of opaques (torch 2.12 - 2.15).

Dynamo guards on which inputs share one reference opaque, and recompiles when
the sharing changes: a graph compiled while ``x._mesh is y._mesh`` may read the
shared object from one slot for both outputs. AOTAutograd's cache key, though,
hashes an opaque by its type only, so the recompilation for distinct meshes is
served the graph compiled for shared ones - in the same process, and across
processes sharing a cache directory - and an output carries the wrong opaque.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from opaque_subclass.core.aliasing import opaque_alias_pattern
from opaque_subclass.core.flatten import append_leaves
from opaque_subclass.core.registry import real_object
from opaque_subclass.core.stable_hash import stable_subclass_hash
from opaque_subclass.core.walk import is_wrapper_subclass
from opaque_subclass.patching import composes

__all__ = [
    "MeshShapeKey",
    "StableSubclassKey",
    "make_autograd_cache_key",
    "shared_mesh_inputs",
    "sharing_across_ranks",
    "sharing_key",
    "stable_subclass_inputs",
]

_TARGET = "torch._functorch._aot_autograd.autograd_cache.autograd_cache_key"


def sharing_key(example_inputs: Sequence[Any]) -> str | None:
    """A short, process-independent text for which flat slots of
    ``example_inputs`` (subclass inputs flattened to their leaves) hold opaques
    and which of them share one object; ``None`` when there is no opaque."""
    leaves: list[Any] = []
    for i, value in enumerate(example_inputs):
        append_leaves(value, leaves, f"example_inputs[{i}]")
    pattern = opaque_alias_pattern(leaves)
    if not pattern.slots:
        return None
    text = f"{pattern.slots}->{pattern.owners}"
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class StableSubclassKey:
    """What the key of AOTAutograd's cache holds in place of a subclass input
    that carries opaques, under :func:`make_autograd_cache_key` with
    ``key_subclasses_by_hash`` (torch 2.11): the hash
    :func:`stable_subclass_inputs` computes for it."""

    digest: str


def stable_subclass_inputs(example_inputs: Sequence[Any]) -> Sequence[Any]:
    """``example_inputs`` with each wrapper-subclass input that holds an opaque
    replaced by its :class:`StableSubclassKey`; the same sequence when none does.
    The key is the subclass's own ``_stable_hash_for_caching()`` where it has
    one (an :class:`~opaque_subclass.OpaqueSubclass` has), as torch 2.12 - 2.15
    ask for it, else :func:`~opaque_subclass.core.stable_hash.stable_subclass_hash`;
    an exception of the method (a context that cannot be pickled) makes torch
    bypass its cache for the program, as on those releases.

    torch 2.11's key pickles such an input whole: its inner tensors' data and
    each opaque by value (a ``DeviceMesh`` with this rank's coordinate and
    process-group names), so every rank of a job computes another key for the
    same program. torch 2.12 - 2.15 ask the subclass for a stable hash instead
    (``_stable_hash_for_caching``), which hashes an opaque by its class.
    """

    def key_of(i: int, value: Any) -> StableSubclassKey | None:
        if not is_wrapper_subclass(value):
            return None
        leaves: list[Any] = []
        append_leaves(value, leaves, f"example_inputs[{i}]")
        if not opaque_alias_pattern(leaves).slots:
            return None
        own = getattr(value, "_stable_hash_for_caching", None)  # what torch 2.12+ asks a subclass for
        return StableSubclassKey(own() if callable(own) else stable_subclass_hash(value))

    return _keyed(example_inputs, key_of)


def _keyed(example_inputs: Sequence[Any], key_of: Callable[[int, Any], object | None]) -> Sequence[Any]:
    """``example_inputs`` with each input for which ``key_of(index, value)``
    gives a key replaced by it; the same sequence when it gives none."""
    replaced: list[Any] | None = None
    for i, value in enumerate(example_inputs):
        key = key_of(i, value)
        if key is None:
            continue
        if replaced is None:
            replaced = list(example_inputs)
        replaced[i] = key
    return example_inputs if replaced is None else replaced


@dataclass(frozen=True)
class MeshShapeKey:
    """What the key of AOTAutograd's cache holds in place of a ``DeviceMesh``
    input while compilations share across ranks (:func:`shared_mesh_inputs`):
    the mesh's shape, dimension names and device type, the same on every rank
    of a job."""

    shape: tuple[int, ...]
    dim_names: tuple[str, ...] | None
    device_type: str


def sharing_across_ranks() -> bool:
    """Whether inductor's joint-graph pass in effect makes every collective take
    its group from a mesh input (``opaque_subclass.dtensor.MeshGroupPass``, found
    by its marker: this layer does not import the DTensor module)."""
    from torch._inductor import config

    configured = config.joint_custom_pre_pass
    passes = configured if isinstance(configured, (list, tuple)) else [configured]
    return any(getattr(p, "shares_compiles_across_ranks", False) is True for p in passes)


def shared_mesh_inputs(example_inputs: Sequence[Any]) -> Sequence[Any]:
    """``example_inputs`` with each ``DeviceMesh`` input (torch's fake wrapper of
    one, as AOTAutograd receives it) replaced by its :class:`MeshShapeKey`
    while :func:`opaque_subclass.dtensor.share_compiles` is in effect; the same
    sequence otherwise.

    torch pickles a ``DeviceMesh`` graph input into the key by value, with this
    rank's coordinate and process-group names, so each rank of a job keys a
    DTensor program (whose tensor-parallel hooks pass the mesh to ``from_local``)
    differently. Under ``share_compiles`` no group name is compiled into the
    graph (the collectives take the mesh input), so the mesh's shape is all the
    graph depends on.
    """
    if not sharing_across_ranks():
        return example_inputs
    from torch.distributed.device_mesh import DeviceMesh

    def key_of(i: int, value: Any) -> MeshShapeKey | None:
        mesh = real_object(value)
        if not isinstance(mesh, DeviceMesh):
            return None
        names = mesh.mesh_dim_names
        return MeshShapeKey(tuple(mesh.shape), tuple(names) if names else None, mesh.device_type)

    return _keyed(example_inputs, key_of)


@composes
def make_autograd_cache_key(
    original: Callable[..., Any], *, key_subclasses_by_hash: bool = False
) -> Callable[..., Any]:
    """Replaces ``torch._functorch._aot_autograd.autograd_cache.autograd_cache_key``
    (torch 2.12, 2.13, 2.14 and 2.15: each release's own fingerprint).

    Without it, with ``backend="inductor"`` and torch's default caches, after
    ``f(x, y)`` compiled with ``x._mesh is y._mesh``, a call with two distinct
    meshes recompiles in Dynamo but AOTAutograd's cache serves the graph made
    for the shared case: both outputs (and gradients) carry the first mesh. A
    fresh process sharing the cache directory gets the wrong mesh on its first
    call. With it, the key of a graph whose inputs hold reference opaques ends
    in the opaques' sharing pattern (which flat slots hold the same object),
    so graphs compiled for different sharing never share an entry; graphs
    without opaques keep torch's key unchanged. No torch release has fixed it
    yet (upstream ``_stable_hash_for_cache_value`` hashes an opaque by type).

    With ``key_subclasses_by_hash`` (the 2.11 backport's replacement), each
    subclass input holding opaques is keyed by its stable hash
    (:func:`stable_subclass_inputs`), as torch 2.12 - 2.15 key it, so that every
    rank of a job computes one key for one program.

    Under :func:`opaque_subclass.dtensor.share_compiles`, a ``DeviceMesh``
    input is keyed by its shape (:func:`shared_mesh_inputs`) on every release.
    """

    def autograd_cache_key(mod: Any, example_inputs: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        keyed = stable_subclass_inputs(example_inputs) if key_subclasses_by_hash else example_inputs
        keyed = shared_mesh_inputs(keyed)
        key, debug_lines = original(mod, keyed, *args, **kwargs)
        sharing = sharing_key(example_inputs)
        if sharing is None:
            return key, debug_lines
        return f"{key}-opaque-sharing-{sharing}", [*debug_lines, f"[opaque-subclass] opaque sharing: {sharing}"]

    return autograd_cache_key
