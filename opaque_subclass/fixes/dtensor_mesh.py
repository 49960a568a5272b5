"""DTensor outputs and the meshes of DTensor's sharding cache (torch 2.12 - 2.15).

DTensor's sharding propagation caches output specs by the *equality* of their
inputs' specs, and ``DeviceMesh.__eq__`` compares ranks and layout, not
identity. So when AOTAutograd traces a DTensor program, an output's spec may
hold an equal mesh from an earlier computation (in eager that is torch's
design, and stays so): a real ``DeviceMesh`` of an earlier program, possibly
one whose process group was destroyed since. Flattening the output wraps that
mesh in a new ``FakeScriptObject`` that no graph input tracks, and the tracer
compiles its object into the graph as a constant (``_torchbind_obj0``): every
call of the compiled program returns it, whatever mesh is passed in.
Measured with a compiled ``t * 2`` run as three programs of four meshes each
(fresh fake process groups, ``torch._dynamo.reset()`` in between): 0, 4 and 4
outputs on a stale mesh on torch 2.12 - 2.15; 0, 0, 0 on torch 2.11 with the
backport, whose ``get_proxy_slot`` patch (``backport/dtensor.py``) the
fix below carries over to the native releases' trackers. With
``requires_grad`` inputs the same mesh matches the tangent placeholder that
AOTAutograd built from the output's metadata, and the second program fails to
compile ("Node tangents_2 was invalid, but is output").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from opaque_subclass.core.registry import opaque_kind, real_object
from opaque_subclass.patching import composes

__all__ = ["make_get_proxy_slot", "stand_in"]

_TARGET = "torch.fx.experimental.proxy_tensor.get_proxy_slot"


def stand_in(obj: Any, tracked: Mapping[Any, Any]) -> Any:
    """The tracked wrapper that ``obj``, a fake wrapper no proxy tracks, stands
    for: among the tracked fake wrappers (``tracked``: wrapper -> proxy, in the
    order they were tracked) whose proxy is not a tangent's, the earliest of
    the very same object, else, for a ``DeviceMesh``, the earliest of an equal
    mesh; ``obj`` itself when there is none or it is not a reference opaque."""
    real = real_object(obj)
    if real is obj or opaque_kind(real) != "reference":
        return obj
    from torch._functorch._aot_autograd.utils import _is_tangent
    from torch.distributed.device_mesh import DeviceMesh

    candidates = []
    for wrapper, proxy in list(tracked.items()):
        node = getattr(proxy, "node", None)
        other = real_object(wrapper)
        if other is wrapper or node is None or _is_tangent(node):
            continue  # a tangent must not feed the forward graph
        if other is real:
            return wrapper
        candidates.append((wrapper, other))
    if type(real) is DeviceMesh:
        return next((w for w, other in candidates if type(other) is DeviceMesh and other == real), obj)
    return obj


@composes
def make_get_proxy_slot(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch.fx.experimental.proxy_tensor.get_proxy_slot`` (torch
    2.12, 2.13, 2.14 and 2.15: each release's own fingerprint).

    While AOTAutograd traces a DTensor program, DTensor's sharding propagation
    may give an output a spec holding an equal mesh from its cache, a real
    ``DeviceMesh`` of an earlier program, which flattening wraps in a new fake
    wrapper. Without it, that wrapper has no proxy: the tracer bakes its object
    into the graph as a constant (``_torchbind_obj0``) and every call returns
    that earlier mesh (a compiled ``t * 2`` in a second program on fresh meshes:
    4 of 4 outputs on the first program's mesh); with ``requires_grad`` inputs
    torch's fallback finds the tangent placeholder built for that mesh and the
    forward graph fails to partition ("Node tangents_2 was invalid, but is
    output"). With it, a fake wrapper of a reference opaque that no proxy
    tracks takes the proxy of the earliest tracked wrapper of the very same
    object or, for a ``DeviceMesh``, of an equal one (``DeviceMesh.__eq__``:
    the meshes DTensor treats as interchangeable), never a tangent's: the
    output's mesh is a pass-through of the input placeholder, the mesh passed
    in at run time, as torch 2.11 with the backport (its ``get_proxy_slot``
    patch) does. Every other lookup is torch's, unchanged.
    """
    from torch._library.fake_class_registry import FakeScriptObject

    def get_proxy_slot(obj: Any, tracer: Any, *args: Any, **kwargs: Any) -> Any:
        if type(obj) is FakeScriptObject:
            tracked = tracer.opaque_tracker
            if obj not in tracked:
                obj = stand_in(obj, tracked)
        return original(obj, tracer, *args, **kwargs)

    return get_proxy_slot
