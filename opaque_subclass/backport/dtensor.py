"""DTensor's mesh as an opaque attribute (torch 2.11).

torch 2.11's ``DTensor.__tensor_flatten__`` lists only ``_local_tensor``; the
``DeviceMesh`` sits in the flatten context (``DTensorSpec``), which Dynamo
guards by equality (ranks and layout, not identity) and AOTAutograd rebuilds
outputs from. A graph compiled for one mesh is reused for any equal mesh and
its outputs carry the *first* call's mesh (measured: 15 of 16 calls of a
compiled ``t * 2`` with 16 meshes).

torch 2.12 (pytorch/pytorch#178115, on top of #169867 which made
``DeviceMesh`` an opaque type) lists ``device_mesh`` as a flatten attribute:
an opaque graph input, outputs rebuilt on the run-time mesh. These patches do
the same on 2.11 once ``DeviceMesh`` is registered as a reference opaque
(``opaque_subclass.register_opaque(DeviceMesh)``; 2.12+ registers it itself);
unregistered, DTensor is left as torch 2.11 has it.

Kept as torch 2.11 needs them: the context stays ``(spec, requires_grad)``
(Dynamo 2.11 checks that shape and guards the spec by equality, so equal meshes
share a graph, as on 2.13); Dynamo still reads ``x.device_mesh`` in user code
as the constant its DTensor handlers need (``VariableBuilder._wrap``'s patch in
``dynamo.py``); and the traced spec holds the real mesh (sharding propagation
reads it), so each output's mesh reaches the tracer as a new fake wrapper,
which the ``get_proxy_slot`` patch maps to the input (else it is baked in).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opaque_subclass.core.registry import opaque_kind, real_object
from opaque_subclass.fixes.members import note_subclass_made_opaque

__all__ = [
    "make_dynamic_getattr",
    "make_get_handlers",
    "make_get_proxy_slot",
    "make_method_redistribute",
    "make_tensor_flatten",
    "make_tensor_unflatten",
]

#: The flatten attribute torch 2.12+ gives a DTensor's mesh.
MESH_ATTR = "device_mesh"


def make_tensor_flatten(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch.distributed.tensor._api.DTensor.__tensor_flatten__``
    (torch 2.11).

    Without it, the mesh is compiled in with the flatten context: calls on
    different, equal meshes return DTensors on the first call's mesh. With it,
    once ``DeviceMesh`` is registered as a reference opaque, ``device_mesh`` is
    listed after ``_local_tensor`` (as in torch 2.12, pytorch/pytorch#178115 on
    top of pytorch/pytorch#176457): an opaque graph input, so outputs carry the
    call's mesh. The context stays ``(spec, requires_grad)`` (Dynamo 2.11
    requires it); unregistered, torch's result is unchanged.
    """

    from torch.distributed.device_mesh import DeviceMesh

    def __tensor_flatten__(self: Any) -> tuple[list[str], Any]:
        names, ctx = original(self)
        if MESH_ATTR in names or opaque_kind(DeviceMesh) != "reference":
            return names, ctx
        return [*names, MESH_ATTR], ctx

    return __tensor_flatten__


def make_tensor_unflatten(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch.distributed.tensor._api.DTensor.__tensor_unflatten__``
    (torch 2.11), the rebuilding counterpart of the patch above.

    Without it, every compiled output is rebuilt on the compile-time mesh of
    its flatten context. With it, a listed ``device_mesh`` is used instead: at
    run time the one passed in, while tracing the real object behind its fake
    wrapper (sharding propagation reads it); the rest comes from the context
    via torch's function. Unnecessary since torch 2.12
    (pytorch/pytorch#178115, on top of pytorch/pytorch#176457).
    """

    def __tensor_unflatten__(
        inner_tensors: dict[str, Any], flatten_spec: Any, outer_size: Any, outer_stride: Any
    ) -> Any:
        if MESH_ATTR not in inner_tensors:
            return original(inner_tensors, flatten_spec, outer_size, outer_stride)
        import dataclasses

        spec, requires_grad = flatten_spec
        mesh = real_object(inner_tensors[MESH_ATTR])
        if mesh is not spec.mesh:
            spec = dataclasses.replace(spec, mesh=mesh)
        tensors = {k: v for k, v in inner_tensors.items() if k != MESH_ATTR}
        return original(tensors, (spec, requires_grad), outer_size, outer_stride)

    return __tensor_unflatten__


def make_get_proxy_slot(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch.fx.experimental.proxy_tensor.get_proxy_slot`` (torch 2.11).

    While AOTAutograd traces, a DTensor's spec holds a real mesh (the input's,
    an equal one from the sharding-propagation cache, or one Dynamo compiled in
    for ``from_local``/``redistribute``), so each output's mesh reaches the
    tracer as a *new* fake wrapper. Without it, that wrapper has no proxy and is
    baked in as a constant (``_torchbind_obj0``): every call returns the
    compile-time mesh. With it, such a wrapper of a reference opaque gets the
    proxy of the earliest tracked wrapper of the same object or, for a
    ``DeviceMesh``, an equal one (never a tangent's): the output's mesh passes
    through from the input, as in torch 2.12+
    (pytorch/pytorch#176457, #178115). Every other lookup is torch's.
    """
    from torch._library.fake_class_registry import FakeScriptObject

    def _stand_in(obj: Any, tracer: Any) -> Any:
        """The tracked wrapper that ``obj`` (an untracked wrapper) stands for, or ``obj``."""
        real = real_object(obj)
        if opaque_kind(real) != "reference":
            return obj
        from torch._functorch._aot_autograd.utils import _is_tangent
        from torch.distributed.device_mesh import DeviceMesh

        tracked = tracer.script_object_tracker

        def stands_for(wrapper: Any) -> bool:
            node = getattr(tracked.get(wrapper), "node", None)
            if type(wrapper) is not FakeScriptObject or (node is not None and _is_tangent(node)):
                return False  # a tangent must not feed the forward graph
            other = real_object(wrapper)
            if other is real:
                return True
            return type(real) is DeviceMesh and type(other) is DeviceMesh and other == real

        return next((w for w in list(tracked.keys()) if stands_for(w)), obj)

    def get_proxy_slot(obj: Any, tracer: Any, default: Any = _MISSING, transform: Any = _MISSING) -> Any:
        if type(obj) is FakeScriptObject and obj not in tracer.script_object_tracker:
            obj = _stand_in(obj, tracer)
        args = (obj, tracer) if default is _MISSING else (obj, tracer, default)
        if transform is _MISSING:
            return original(*args)
        return original(*args, transform=transform)

    return get_proxy_slot


_MISSING: Any = object()


def _real_input(variable: Any) -> object:
    """The object a Dynamo opaque variable stands for; for a graph input the
    recorded example (2.11's fake wrapper holds a deep copy)."""
    proxy = getattr(variable, "proxy", None)
    grapharg = getattr(getattr(proxy, "node", None), "meta", {}).get("grapharg")
    if grapharg is not None:
        return grapharg.example
    return real_object(variable.value)


def _meshes_as_constants(variables: list[Any]) -> list[Any]:
    """``variables`` with each registered ``DeviceMesh`` graph input replaced by
    what Dynamo 2.11 makes of an unregistered one: a ``DeviceMeshVariable``
    guarded by ``EQUALS_MATCH`` on its source."""
    from torch._dynamo.guards import GuardBuilder, install_guard
    from torch._dynamo.variables.distributed import DeviceMeshVariable  # type: ignore[attr-defined]  # torch 2.11 only (removed in 2.12)
    from torch._dynamo.variables.lazy import LazyVariableTracker
    from torch._dynamo.variables.script_object import TorchScriptObjectVariable  # type: ignore[attr-defined]  # torch 2.11's name; the lint torch renamed it
    from torch.distributed.device_mesh import DeviceMesh

    out = []
    for v in variables:
        if isinstance(v, LazyVariableTracker):
            v = v.realize()
        if isinstance(v, TorchScriptObjectVariable):
            mesh = _real_input(v)
            if type(mesh) is DeviceMesh:
                if v.source is not None:
                    install_guard(v.source.make_guard(GuardBuilder.EQUALS_MATCH))
                v = DeviceMeshVariable(mesh, source=v.source)
        out.append(v)
    return out


def _with_constant_meshes(handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler(self, tx, *args, **kwargs)`` with meshes as constants (:func:`_meshes_as_constants`)."""

    def handle(self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
        names = list(kwargs)
        converted = _meshes_as_constants([*args, *kwargs.values()])
        return handler(self, tx, *converted[: len(args)], **dict(zip(names, converted[len(args) :], strict=True)))

    return handle


def make_get_handlers(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``TorchInGraphFunctionVariable._get_handlers`` (torch 2.11), the
    table of Dynamo's special handlers for torch functions, to wrap the one of
    ``DTensor.from_local``.

    Dynamo 2.11 closes over ``from_local``'s ``mesh`` as a constant. Without
    it, a registered mesh that is a graph input (a ``parallelize_module``
    hook's, an argument) fails ("TorchScriptObjectVariable(FakeScriptObject) is
    self-referential"): tensor parallelism under torch.compile breaks once
    ``DeviceMesh`` is registered. With it, torch's handler gets the constant
    Dynamo 2.11 makes of an unregistered mesh, with its equality guard; outputs
    are rebuilt on the input's mesh at run time, as in torch 2.12+
    (pytorch/pytorch#169867, pytorch/pytorch#176457). Other handlers are torch's.
    """
    import functools

    from torch.distributed.tensor import DTensor

    @functools.cache
    def _get_handlers() -> dict[Callable[..., Any], Callable[..., Any]]:
        handlers = dict(original())
        from_local = DTensor.from_local
        if from_local in handlers:
            handlers[from_local] = _with_constant_meshes(handlers[from_local])
        return handlers

    return _get_handlers


def make_method_redistribute(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``TensorVariable.method_redistribute`` (torch 2.11), Dynamo's
    handler of ``DTensor.redistribute``.

    As for ``from_local``. Without it, ``x.redistribute(mesh, ...)`` with a
    registered mesh graph input fails ("... is self-referential"). With it, the
    mesh is Dynamo 2.11's equality-guarded constant. torch 2.12+ passes the
    mesh as a graph input (pytorch/pytorch#169867, pytorch/pytorch#176457).

    Dynamo 2.11 also uses this handler for any subclass's ``redistribute``
    (2.12 removed it). Without the check, ``ShardedTensor.redistribute`` becomes
    a closure call AOTAutograd's cache cannot key, so every process recompiles
    ("Unsupported call_function target"). With it, a non-``DTensor`` gets the
    generic ``call_method`` node, as on torch 2.12+.
    """
    handle = _with_constant_meshes(original)

    def method_redistribute(self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.tensor import DTensor

        if not issubclass(self.python_type(), DTensor):
            return None  # Dynamo's generic path: the method call in the graph
        return handle(self, tx, *args, **kwargs)

    return method_redistribute


def make_dynamic_getattr(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``TensorVariable.dynamic_getattr`` (torch 2.11), Dynamo's read
    of an attribute of a tensor produced inside the compiled region.

    Dynamo 2.11 takes every listed attribute of such a tensor for an inner
    tensor. Without it, ``y.device_mesh`` of a DTensor computed in compiled code
    fails with a bare ``AssertionError``. With it, the mesh is the compile-time
    ``DeviceMeshVariable`` Dynamo 2.11 makes without the patch (as for an
    input's mesh, ``VariableBuilder._wrap``); outputs still carry the call's
    mesh (``get_proxy_slot``). torch 2.12+ reads it as an opaque
    (pytorch/pytorch#176457).

    Likewise ``y._mesh`` (``y = x * 2``, ``_mesh`` listed) fails without it;
    with it, the read is the ``getattr`` node 2.11 makes for an unlisted
    reference opaque (a ``TorchScriptObjectVariable`` of its fake wrapper), as
    2.12+ does: it can go to custom ops (returning it is Dynamo 2.11's
    "Reconstruction failure"); its members are ``OpaqueMemberError``
    (``fixes.members.check_subclass_made_opaque``: no source, so no guard).
    Every other attribute is torch's.
    """

    def dynamic_getattr(self: Any, tx: Any, name: str) -> Any:
        if not self.source:
            fake = self.proxy.node.meta.get("example_value")
            if name == MESH_ATTR:
                from torch._dynamo.variables.distributed import DeviceMeshVariable  # type: ignore[attr-defined]  # torch 2.11 only (removed in 2.12)
                from torch.distributed.tensor import DTensor

                if isinstance(fake, DTensor):
                    return DeviceMeshVariable(fake.device_mesh)
            listed = _listed_reference_opaque(fake, name)
            if listed is not None:
                from torch._dynamo.variables.script_object import (  # type: ignore[attr-defined]  # torch 2.11's name; mypy reads torch 2.14+, which renamed it
                    TorchScriptObjectVariable,
                )
                from torch._library.fake_class_registry import FakeScriptObject, maybe_to_fake_obj

                wrapped = (
                    listed if isinstance(listed, FakeScriptObject) else maybe_to_fake_obj(tx.output.fake_mode, listed)
                )
                proxy = getattr(self.as_proxy(), name)
                note_subclass_made_opaque(proxy.node, name)
                return TorchScriptObjectVariable.create(proxy, wrapped)
        return original(self, tx, name)

    return dynamic_getattr


def _listed_reference_opaque(fake: object, name: str) -> object | None:
    """The reference opaque (or its fake wrapper) ``fake`` lists as ``name``, else ``None``."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not is_traceable_wrapper_subclass(fake):
        return None
    names, _ctx = fake.__tensor_flatten__()
    if name not in names:
        return None
    value = getattr(fake, name)
    return value if opaque_kind(value) == "reference" else None


_API = "torch.distributed.tensor._api.DTensor."
