"""AOTAutograd with opaque attributes (torch 2.11).

torch 2.12+ (pytorch/pytorch#176457) gives each opaque its own flat slot,
traced as a fake script object (an output that is an input's opaque passes the
*runtime* object through) and skipped by tangent and mutation analysis. These
patches do the same on 2.11: ``create_subclass_metadata`` gives an opaque a
one-slot :class:`OpaqueSlotMeta` (no layout); ``unwrap_tensor_subclasses``
wraps each opaque leaf in a fake script object of the very object; the
functionalization helpers walk only tensor attributes.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from opaque_subclass.backport import messages
from opaque_subclass.backport.hiding import skip_opaque_leaves, tensor_attrs_decide, tensor_leaves
from opaque_subclass.core.flatten import is_wrapper_subclass
from opaque_subclass.core.registry import opaque_kind, real_object
from opaque_subclass.fixes import autograd_cache as _native_autograd_cache

__all__ = [
    "fake_opaque",
    "fake_opaque_always",
    "make_autograd_cache_key",
    "make_create_subclass_metadata",
    "make_is_fun",
    "make_metadata_repr",
    "make_sc_visit",
    "make_set_proxy_slot",
    "make_skip_opaque",
    "make_unwrap_tensor_subclasses",
]


def _is_reference_opaque(value: object) -> bool:
    return not isinstance(value, torch.Tensor) and opaque_kind(value) == "reference"


def fake_opaque(value: Any) -> Any:
    """:func:`fake_opaque_always` under a fake mode, else ``value``."""
    from torch._guards import detect_fake_mode

    if detect_fake_mode() is None:
        return value
    return fake_opaque_always(value)


def fake_opaque_always(value: Any) -> Any:
    """A fake script object wrapping the very object ``value`` (no copy)."""
    from torch._library.fake_class_registry import FakeScriptObject
    from torch._library.opaque_object import FakeOpaqueObject, get_opaque_type_name

    if isinstance(value, FakeScriptObject):
        return value
    fake = FakeScriptObject.__new__(FakeScriptObject)
    object.__setattr__(fake, "wrapped_obj", FakeOpaqueObject())
    object.__setattr__(fake, "script_class_name", get_opaque_type_name(_registered_base(type(value))))
    object.__setattr__(fake, "real_obj", value)
    return fake


def _registered_base(cls: type) -> type:
    from torch._library.opaque_object import _OPAQUE_TYPES

    return next((k for k in cls.__mro__ if k in _OPAQUE_TYPES), cls)


def make_create_subclass_metadata(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``subclass_utils.create_subclass_metadata`` (torch 2.11).

    Without it, metadata of a subclass listing an opaque asks the opaque for a
    memory format and fails (``'Mesh' object has no attribute 'layout'``). With
    it, an opaque gets a one-slot :class:`OpaqueSlotMeta`. Unnecessary since
    torch 2.12 (pytorch/pytorch#176457), whose ``SubclassCreationMeta.attrs`` holds ``OpaqueMeta``.
    """

    def create_subclass_metadata(a: Any, start_idx: int, count_symints: bool, with_memory_format: bool = False) -> Any:
        if _is_reference_opaque(a):
            # Defined outside the package, so that unpickling a cache entry never enables the backport.
            from _opaque_subclass_pickle import OpaqueSlotMeta

            return OpaqueSlotMeta(start_idx + 1, memory_format=None), start_idx + 1
        return original(a, start_idx, count_symints, with_memory_format)

    return create_subclass_metadata


def _lists_opaque(meta: Any) -> bool:
    """Whether a subclass meta (or any nested in it) holds an opaque slot."""
    from _opaque_subclass_pickle import OpaqueSlotMeta

    attrs = getattr(meta, "attrs", None) or {}
    return any(isinstance(a, OpaqueSlotMeta) or _lists_opaque(a) for a in attrs.values())


def _shown(value: Any) -> str:
    """``repr(value)``, with each wrapper-subclass tensor in it shown by type, shape and dtype."""
    if isinstance(value, torch.Tensor) and is_wrapper_subclass(value):
        return f"<{type(value).__qualname__} size={tuple(value.shape)} dtype={value.dtype}>"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_shown(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_shown(v)}" for k, v in value.items()) + "}"
    return repr(value)


def make_metadata_repr(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces the ``__repr__`` that ``@dataclass`` wrote for AOTAutograd's
    ``schemas.SubclassCreationMeta`` and ``schemas.ViewAndMutationMeta`` (torch 2.11).

    torch 2.11 formats this metadata for a debug log on every compilation, logged
    or not (``str(fw_metadata)`` in ``aot_dispatch_base_graph`` and in the
    autograd path), and the metadata holds the traced subclass inputs and
    tangents: fake tensors, formatted by their class's ``__repr__``. Without it,
    a subclass that keeps Tensor's default ``__repr__`` (it reads the values)
    cannot be compiled (``GuardOnDataDependentSymNode``), with or without the
    backport. With it, metadata of a subclass listing an opaque shows each traced
    subclass tensor as its type, shape and dtype; any other metadata is formatted
    by torch. Unnecessary since torch 2.12, which formats it only when the log is
    on (the release of pytorch/pytorch#176457, which the backport brings to 2.11).
    """

    def __repr__(self: Any) -> str:
        metas = getattr(self, "subclass_inp_meta", None)
        if metas is None:  # a SubclassCreationMeta
            scoped = [self]
        else:  # a ViewAndMutationMeta
            scoped = [*metas, *(self.subclass_fw_graph_out_meta or ()), *(self.subclass_tangent_meta or ())]
        if not any(_lists_opaque(m) for m in scoped):
            return str(original(self))
        import dataclasses

        shown = ", ".join(f"{f.name}={_shown(getattr(self, f.name))}" for f in dataclasses.fields(self) if f.repr)
        return f"{type(self).__qualname__}({shown})"

    return __repr__


def make_unwrap_tensor_subclasses(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``subclass_utils.unwrap_tensor_subclasses`` (torch 2.11), the
    trace-time unwrap.

    Without it, opaque leaves are baked in as constants: every call returns the
    compile-time object. With it, each is a fake script object of the same
    object, a graph input, so outputs return the runtime object. Unnecessary
    since torch 2.12 (pytorch/pytorch#176457).
    """

    def unwrap_tensor_subclasses(wrapped_args: Any, wrapped_args_descs: Any, *, append_symints: bool) -> Any:
        flat, descs = original(wrapped_args, wrapped_args_descs, append_symints=append_symints)
        if any(_is_reference_opaque(v) for v in flat):
            flat = [fake_opaque(v) if _is_reference_opaque(v) else v for v in flat]
        return flat, descs

    return unwrap_tensor_subclasses


def make_is_fun(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._functorch._aot_autograd.functional_utils.is_fun`` (torch 2.11).

    Without it, an opaque counts as a non-functional inner tensor ("mixed
    functional/non-functional inner tensors"). With it, only tensor attributes
    decide. Unnecessary since torch 2.12 (pytorch/pytorch#176457).
    """

    return tensor_attrs_decide(original, any, messages.mixed_functional)


def make_skip_opaque(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces a torch 2.11 functionalization helper that recurses into every
    attribute of a subclass by calling itself (``sync_functional_tensor``,
    ``are_all_mutations_under_no_grad_or_inference_mode``).

    Without it, an opaque is taken for an inner tensor (``torch._sync`` of a
    non-tensor; "expected FunctionalTensor"). With it, an opaque answers
    neutrally (no sync, no mutation). Unnecessary since torch 2.12
    (pytorch/pytorch#176457).
    """
    neutral = True if original.__name__ == "are_all_mutations_under_no_grad_or_inference_mode" else None
    return skip_opaque_leaves(original, result=neutral)


def make_sc_visit(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``graph_capture_wrappers.sc_visit`` (torch 2.11), the reduction
    over a subclass's inner tensors used for mutation counters.

    Without it, mutating a subclass input holding an opaque under
    ``torch.no_grad()`` fails reading ``.elem`` of its fake script object. With
    it, only tensor leaves are reduced, in torch's order. Unnecessary since
    torch 2.12 (pytorch/pytorch#176457).
    """

    def sc_visit(t: Any, fn: Callable[[Any], Any], reduce_fn: Callable[[Any, Any], Any], accum_init: Any) -> Any:
        if not is_wrapper_subclass(t):
            return original(t, fn, reduce_fn, accum_init)
        accum = accum_init
        for leaf in tensor_leaves(t):
            accum = reduce_fn(accum, fn(leaf))
        return accum

    return sc_visit


def make_set_proxy_slot(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch.fx.experimental.proxy_tensor.set_proxy_slot`` (torch 2.11).

    The joint graph's tracer meets an opaque as a primal and inside a tangent.
    Without it, the backward reads it from the *tangent* (``tangents_2``) and
    the gradient carries the tangent's object. With it, as in torch 2.12
    (pytorch/pytorch#176457), every fake wrapper of a real object gets its
    first (the primal's) proxy: the gradient carries the input's object.
    """

    # per tracer, dropped with it: {id(real object): (real object, its first proxy)}
    first_proxies: weakref.WeakKeyDictionary[Any, dict[int, tuple[Any, Any]]] = weakref.WeakKeyDictionary()
    lock = threading.Lock()

    def set_proxy_slot(obj: Any, tracer: Any, proxy: Any) -> Any:  # returns what the original returns
        real = real_object(obj)
        if real is obj:  # not a fake wrapper
            return original(obj, tracer, proxy)
        with lock:
            first = first_proxies.setdefault(tracer, {})
            seen = first.get(id(real))
            if seen is None or seen[0] is not real:
                first[id(real)] = seen = (real, proxy)
        return original(obj, tracer, seen[1])

    return set_proxy_slot


_FU = "torch._functorch._aot_autograd.functional_utils."
_SU = "torch._functorch._aot_autograd.subclass_utils."


def make_autograd_cache_key(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._functorch._aot_autograd.autograd_cache.autograd_cache_key``
    (torch 2.11).

    Without it, a backport-mode entry for a graph with opaques is stored under
    stock torch's key, and a process without the library could load it and,
    unpickling the backport's classes, run fully patched. With it, such a key
    ends in the opaques' sharing pattern (the native fix's suffix), so stock
    torch never looks it up; graphs without opaques keep torch's key. torch
    2.12 needs no backport entries (pytorch/pytorch#176457) but gets the same
    suffix from its own fix.

    It also keys subclass inputs holding opaques by stable hash
    (``opaque_subclass.fixes.autograd_cache.stable_subclass_inputs``), as 2.12 -
    2.15 do: 2.11 pickles them whole (shard data, ``DeviceMesh`` coordinate), so
    without it every rank missed the cache for the same program.
    """
    return _native_autograd_cache.make_autograd_cache_key(original, key_subclasses_by_hash=True)
