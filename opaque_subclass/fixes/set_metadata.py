"""Sets in a subclass's flatten context, keyed alike in every process (torch 2.12 - 2.14).

AOTAutograd's cache key hashes a traceable subclass that defines no
``_stable_hash_for_caching`` by pickling its ``__tensor_flatten__`` context.
A ``set`` or ``frozenset`` pickles in iteration order, which follows the
elements' hashes (``PYTHONHASHSEED`` for strings) and the order they were
added: equal contexts give different keys, so a second process, or a second
instance built in another order, misses an entry it could have used
(pytorch/pytorch#193418; torch 2.15 sorts them). No wrong result, only
compilations repeated where the cache should serve.

For a subclass listing an opaque, the replacement hands torch's own hashing a
view of the subclass whose context has each set replaced by :class:`SortedSet`
(its kind and its elements in the order of their pickles); the subclass itself
is not touched. Contexts without a set, subclasses without opaques, and
subclasses that hash themselves (``OpaqueSubclass`` does), are hashed exactly
as torch hashes them.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opaque_subclass.core.registry import opaque_kind

__all__ = ["SortedSet", "canonical_sets", "make_default_stable_hash"]


@dataclass(frozen=True)
class SortedSet:
    """A set of a flatten context as the cache key sees it: ``kind`` (``set`` or
    ``frozenset``) and the elements sorted by their pickles."""

    kind: str
    elements: tuple[Any, ...]


def _sort_key(value: Any) -> bytes:
    try:
        return pickle.dumps(value)
    except Exception:  # torch's own pickling of the context reports it: keep an order that always exists
        return repr(value).encode()


def canonical_sets(value: Any) -> Any:
    """``value`` with every ``set``/``frozenset`` in it (inside tuples, lists and dict
    values too) replaced by a :class:`SortedSet`; the very object when it holds none."""
    if isinstance(value, (set, frozenset)):
        elements = [canonical_sets(v) for v in value]
        return SortedSet(type(value).__name__, tuple(sorted(elements, key=_sort_key)))
    if isinstance(value, (tuple, list)):
        items = [canonical_sets(v) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, dict):
        mapped = {k: canonical_sets(v) for k, v in value.items()}
        return value if all(mapped[k] is value[k] for k in value) else mapped
    return value


class _CanonicalContext:
    """What torch's default hash reads of a subclass tensor, with the context's sets sorted:
    ``__tensor_flatten__`` answers the canonical context, every other read goes to the tensor."""

    __slots__ = ("_ctx", "_names", "_tensor")

    def __init__(self, tensor: Any, names: Any, ctx: Any) -> None:
        self._tensor, self._names, self._ctx = tensor, names, ctx

    def __tensor_flatten__(self) -> tuple[Any, Any]:
        return self._names, self._ctx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tensor, name)


def make_default_stable_hash(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces
    ``torch._functorch._aot_autograd.autograd_cache.AOTAutogradCachePickler._default_stable_hash_for_caching``
    (torch 2.12, 2.13, 2.14), the cache key's hash of a traceable subclass that defines no
    ``_stable_hash_for_caching``.

    Without it, a ``set``/``frozenset`` in the flatten context is pickled in iteration
    order: equal contexts key apart across processes (``PYTHONHASHSEED``) or insertion
    orders, and the AOTAutograd cache misses (pytorch/pytorch#193418). With it, torch's
    hash of a subclass listing an opaque reads the context with each set sorted
    (:class:`SortedSet`); contexts without a set, and subclasses without opaques (code
    that does not use the library), are hashed as torch hashes them. Unnecessary since
    torch 2.15.
    """

    def _default_stable_hash_for_caching(self: Any, tensor: Any) -> str:
        names, ctx = tensor.__tensor_flatten__()
        canonical = canonical_sets(ctx)
        if canonical is ctx or not any(opaque_kind(getattr(tensor, n)) is not None for n in names):
            return str(original(self, tensor))
        return str(original(self, _CanonicalContext(tensor, names, canonical)))

    return _default_stable_hash_for_caching
