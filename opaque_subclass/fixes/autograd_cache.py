"""AOTAutograd's cache key and the sharing of opaques (torch 2.12 - 2.15); its cacheability check.

Dynamo recompiles when which inputs share a reference opaque changes (a graph
for ``x._mesh is y._mesh`` may read one slot for both), but AOTAutograd's key
hashes an opaque by type, so the recompilation is served the shared-case graph
(in-process and across a shared cache directory): an output carries the wrong
opaque.

Second (torch 2.11 - 2.15): the cache's check of which graphs it may serve looks at the
top-level graph only, so a function Dynamo does not trace, inside a checkpointed region,
is served stale across compilations (pytorch/pytorch#194658); for graphs with opaques,
:func:`make_check_cacheable` checks the subgraphs too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from opaque_subclass.core.aliasing import opaque_alias_pattern
from opaque_subclass.core.flatten import append_leaves
from opaque_subclass.core.registry import opaque_kind, real_object
from opaque_subclass.core.stable_hash import stable_subclass_hash
from opaque_subclass.core.walk import is_wrapper_subclass
from opaque_subclass.patching import composes

__all__ = [
    "MeshShapeKey",
    "StableSubclassKey",
    "graph_inputs_hold_opaques",
    "make_autograd_cache_key",
    "make_check_cacheable",
    "shared_mesh_inputs",
    "sharing_across_ranks",
    "sharing_key",
    "stable_subclass_inputs",
    "uncacheable_subgraph_node",
]

_TARGET = "torch._functorch._aot_autograd.autograd_cache.autograd_cache_key"


def sharing_key(example_inputs: Sequence[Any]) -> str | None:
    """A short, process-independent digest of which flat slots of
    ``example_inputs`` hold opaques and which share one; ``None`` if none."""
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
    """AOTAutograd's cache-key stand-in for a subclass input with opaques
    (``key_subclasses_by_hash``, torch 2.11): :func:`stable_subclass_inputs`'s hash."""

    digest: str


def stable_subclass_inputs(example_inputs: Sequence[Any]) -> Sequence[Any]:
    """``example_inputs`` with each wrapper-subclass input holding an opaque
    replaced by its :class:`StableSubclassKey` (the same sequence if none): the
    subclass's ``_stable_hash_for_caching()`` as torch 2.12 - 2.15 ask (an
    :class:`~opaque_subclass.OpaqueSubclass` has one; if it raises, torch
    bypasses its cache, as there), else
    :func:`~opaque_subclass.core.stable_hash.stable_subclass_hash`.

    torch 2.11 pickles such an input whole (tensor data, a ``DeviceMesh`` with
    this rank's coordinate and group names), so every rank keys the same
    program differently.
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
    """``example_inputs`` with inputs replaced by ``key_of(index, value)`` where not ``None``."""
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
    """AOTAutograd's cache-key stand-in for a ``DeviceMesh`` input while sharing
    across ranks (:func:`shared_mesh_inputs`): the same on every rank."""

    shape: tuple[int, ...]
    dim_names: tuple[str, ...] | None
    device_type: str


def sharing_across_ranks() -> bool:
    """Whether the joint-graph pass in effect is ``opaque_subclass.dtensor.MeshGroupPass``
    (collectives take their group from a mesh input), found by its marker."""
    from torch._inductor import config

    configured = config.joint_custom_pre_pass
    passes = configured if isinstance(configured, (list, tuple)) else [configured]
    return any(getattr(p, "shares_compiles_across_ranks", False) is True for p in passes)


def shared_mesh_inputs(example_inputs: Sequence[Any]) -> Sequence[Any]:
    """Under :func:`opaque_subclass.dtensor.share_compiles`, ``example_inputs``
    with each ``DeviceMesh`` input (or its fake wrapper) replaced by its
    :class:`MeshShapeKey`; else unchanged. torch pickles the mesh by value
    (this rank's coordinate, group names), so ranks key a DTensor program
    differently; under ``share_compiles`` the graph depends only on its shape.
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

    Without it (inductor, default caches), after ``f(x, y)`` compiled with
    ``x._mesh is y._mesh``, a call with distinct meshes recompiles but gets the
    shared-case graph from AOTAutograd's cache: outputs and gradients carry the
    first mesh, also in a fresh process sharing the cache directory. With it,
    a key with reference opaques ends in their sharing pattern; others keep
    torch's key. Unfixed upstream (``_stable_hash_for_cache_value`` hashes an
    opaque by type).

    ``key_subclasses_by_hash`` (the 2.11 backport) keys subclass inputs by
    :func:`stable_subclass_inputs`, as torch 2.12 - 2.15 do. Under
    :func:`opaque_subclass.dtensor.share_compiles`, a ``DeviceMesh`` input is
    keyed by its shape (:func:`shared_mesh_inputs`) on every release.
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


def graph_inputs_hold_opaques(gm: Any) -> bool:
    """Whether a Dynamo graph's inputs hold an opaque object: a placeholder whose example
    value is one (or torch's fake wrapper of one), or a subclass listing one at any depth.
    A value the library cannot read counts as holding none (torch's verdict stands)."""
    leaves: list[Any] = []
    try:
        for i, node in enumerate(gm.graph.find_nodes(op="placeholder")):
            append_leaves(node.meta.get("example_value"), leaves, f"graph input {i}")
    except Exception:  # not a subclass the library reads: leave it to torch
        return False
    return any(opaque_kind(leaf) is not None for leaf in leaves if not isinstance(leaf, torch.Tensor))


def uncacheable_subgraph_node(gm: Any, check_node_safe: Callable[[Any], None]) -> str | None:
    """The first node of a subgraph of ``gm`` (a checkpointed region's body, an
    ``autograd.Function``'s forward and backward: any nested ``GraphModule``) that torch's
    ``check_node_safe`` refuses, as ``"<subgraph>: <torch's reason>"``; ``None`` if all pass."""
    for name, sub in gm.named_modules():
        if sub is gm or not isinstance(sub, torch.fx.GraphModule):
            continue
        for node in sub.graph.nodes:
            try:
                check_node_safe(node)
            except Exception as e:  # torch's BypassAOTAutogradCache, with its reason
                return f"{name}: {e}"
    return None


def make_check_cacheable(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._functorch._aot_autograd.autograd_cache.check_cacheable``
    (torch 2.11, 2.12, 2.13, 2.14 and 2.15: each release's own fingerprint).

    Without it, AOTAutograd's cache checks only the top-level graph's nodes: a function
    Dynamo does not trace (``torch._dynamo.allow_in_graph``) called inside a
    ``torch.utils.checkpoint`` region or an ``autograd.Function`` sits in a subgraph that
    the key names only by the function's qualified name. A second compilation (another
    process, or after ``torch._dynamo.reset()``) whose function computes something else
    (a module setting changed, another version of the code) is served the first one's
    artifact: a wrong result, silently (pytorch/pytorch#194658, open upstream). With it,
    for a graph whose inputs hold an opaque (a subclass listing one, or the object
    itself), every node of every subgraph passes the same check as the top-level
    graph's, so such a region bypasses the cache (compiled anew, right) as it would at
    the top level. Graphs without opaques (code that does not use the library) are
    checked as torch checks them. On torch 2.11, with the backport of
    pytorch/pytorch#176457, as on 2.12 and newer.
    """
    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache, check_node_safe

    def check_cacheable(gm: Any) -> None:
        original(gm)
        if not graph_inputs_hold_opaques(gm):
            return
        refused = uncacheable_subgraph_node(gm, check_node_safe)
        if refused is not None:
            raise BypassAOTAutogradCache(
                f"in the subgraph {refused} (opaque-subclass: subgraph nodes are checked like the "
                "top-level graph's, pytorch/pytorch#194658)"
            )

    return check_cacheable
