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
from typing import Any

from opaque_subclass.core.aliasing import opaque_alias_pattern
from opaque_subclass.core.flatten import append_leaves

__all__ = ["make_autograd_cache_key", "sharing_key"]

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


def make_autograd_cache_key(original: Callable[..., Any]) -> Callable[..., Any]:
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
    """

    def autograd_cache_key(mod: Any, example_inputs: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        key, debug_lines = original(mod, example_inputs, *args, **kwargs)
        sharing = sharing_key(example_inputs)
        if sharing is None:
            return key, debug_lines
        return f"{key}-opaque-sharing-{sharing}", [*debug_lines, f"[opaque-subclass] opaque sharing: {sharing}"]

    return autograd_cache_key
