"""DTensor's mesh as an opaque attribute (torch 2.11).

torch 2.11's ``DTensor.__tensor_flatten__`` lists only ``_local_tensor`` and
keeps the ``DeviceMesh`` inside its flatten context (the ``DTensorSpec``).
torch.compile specializes on a context: Dynamo guards on it by equality
(``DeviceMesh.__eq__`` compares ranks and layout, not identity) and
AOTAutograd rebuilds every output DTensor from the context it saw while
compiling. A graph compiled for one mesh is therefore reused for any other
mesh over the same ranks, and its outputs carry the *first* call's mesh
(measured: 15 of 16 calls of a compiled ``t * 2`` with 16 meshes).

torch 2.12 (pytorch/pytorch#178115, on top of #169867 which made
``DeviceMesh`` an opaque type) lists ``device_mesh`` among DTensor's flatten
attributes: the mesh becomes an opaque graph input and each output DTensor is
rebuilt on the mesh passed in at run time. These patches give torch 2.11 the
same, once ``DeviceMesh`` is registered as a reference opaque
(``opaque_subclass.register_opaque(DeviceMesh)``; torch 2.12+ registers it
itself). Without the registration DTensor is left exactly as torch 2.11 has it.

Two things stay as torch 2.11 needs them:

* the flatten context is still ``(spec, requires_grad)``: Dynamo 2.11 checks
  that shape for every DTensor input and guards on the spec by equality, so a
  graph is compiled once for meshes of equal content, as on torch 2.13 (whose
  ``DeviceMesh`` guard compares the same content);
* Dynamo keeps reading a DTensor's mesh in user code (``x.device_mesh``) as
  the compile-time constant its DTensor handlers (``redistribute``,
  ``from_local``, ``to_local``) need (``VariableBuilder._wrap``'s patch in
  ``dynamo.py``); while AOTAutograd traces, a DTensor's spec holds the real
  mesh, because DTensor's sharding propagation reads it.

Because the traced DTensor holds the real mesh, each output's mesh slot
reaches the tracer as a new fake wrapper of an object that is already a graph
input; the ``get_proxy_slot`` patch makes it that input (without it, it would
be baked into the graph as a constant).
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

    Without it, a DTensor's mesh lives only in the flatten context, which
    torch.compile compiles in: a compiled function called with DTensors on
    different ``DeviceMesh`` objects over the same ranks returns DTensors on
    the first call's mesh. With it, once ``DeviceMesh`` is registered as a
    reference opaque, ``device_mesh`` is listed after ``_local_tensor`` (as in
    torch 2.12, pytorch/pytorch#178115 on top of pytorch/pytorch#176457): the
    mesh is an opaque graph input and
    the outputs carry the mesh of the call. The context is torch 2.11's
    ``(spec, requires_grad)``, which Dynamo 2.11 requires of every DTensor.
    Unregistered, torch's result is returned unchanged.
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

    Without it, a DTensor is rebuilt on the mesh of its flatten context: the
    compile-time mesh, for every output of a compiled graph. With it, when the
    inner attributes hold ``device_mesh`` (listed by the patched
    ``__tensor_flatten__``), the DTensor is rebuilt on that mesh: at run time
    the one passed in; while AOTAutograd traces, the real object behind the
    fake wrapper of the input's mesh (DTensor's sharding propagation reads the
    mesh). Everything else (placements, dtype, requires_grad) comes from the
    context through torch's own function. Unnecessary since torch 2.12
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

    While AOTAutograd traces, a DTensor's spec holds a real mesh: the input's
    (the fake wrapper is looked through when the input is rebuilt), or an
    equal one that DTensor's sharding propagation took from its cache (an
    output spec computed for an earlier, equal mesh), or a mesh Dynamo
    compiled in for ``from_local``/``redistribute``. Each output's mesh so
    reaches the tracer as a *new* fake wrapper. Without it, that wrapper has no
    proxy and the tracer bakes its object into the graph as a constant
    (``_torchbind_obj0``): every call returns that compile-time mesh. With it,
    a fake wrapper of a reference opaque that has no proxy of its own gets the
    proxy of the earliest tracked wrapper of the very same object or, for a
    ``DeviceMesh``, of an equal one (``DeviceMesh.__eq__``: the meshes DTensor
    treats as interchangeable; never a tangent's, which the forward graph must
    not read): the output's mesh is a pass-through
    of the input placeholder, so it is the mesh passed in at run time, as in
    torch 2.12+ (pytorch/pytorch#176457, #178115), where the traced DTensor
    holds the input's wrapper itself. Every other lookup is torch's.
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
    """The object a Dynamo opaque variable stands for. For a graph input, the
    example Dynamo recorded (the object passed in): torch 2.11's fake wrapper
    made for Dynamo holds a deep copy of it (``FakeScriptObject.__init__``)."""
    proxy = getattr(variable, "proxy", None)
    grapharg = getattr(getattr(proxy, "node", None), "meta", {}).get("grapharg")
    if grapharg is not None:
        return grapharg.example
    return real_object(variable.value)


def _meshes_as_constants(variables: list[Any]) -> list[Any]:
    """``variables`` with each registered ``DeviceMesh`` (an opaque graph
    input, ``TorchScriptObjectVariable``) replaced by the compile-time constant
    Dynamo 2.11 makes of an unregistered mesh: a ``DeviceMeshVariable`` of the
    real object, guarded by equality on its source (``EQUALS_MATCH``, the guard
    Dynamo 2.11 installs for such a mesh)."""
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
    """A Dynamo handler ``handler(self, tx, *args, **kwargs)`` called with its
    mesh arguments as compile-time constants (:func:`_meshes_as_constants`)."""

    def handle(self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
        names = list(kwargs)
        converted = _meshes_as_constants([*args, *kwargs.values()])
        return handler(self, tx, *converted[: len(args)], **dict(zip(names, converted[len(args) :], strict=True)))

    return handle


def make_get_handlers(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``TorchInGraphFunctionVariable._get_handlers`` (torch 2.11), the
    table of Dynamo's special handlers for torch functions, to wrap the one of
    ``DTensor.from_local``.

    Dynamo 2.11 compiles ``DTensor.from_local(t, mesh, placements)`` into a
    call of a function that closes over ``mesh`` as a constant. Without it, a
    mesh that is a registered reference opaque (a graph input: a
    ``parallelize_module`` hook's mesh, a mesh passed as an argument) fails
    there ("TorchScriptObjectVariable(FakeScriptObject) is self-referential"),
    so tensor parallelism under torch.compile stops working once
    ``DeviceMesh`` is registered. With it, such a mesh is handed to torch's
    handler as the constant Dynamo 2.11 makes of an unregistered mesh, with the
    same equality guard; the DTensor built on it is rebuilt at run time on the
    mesh of its graph input (patches above), as in torch 2.12+, where
    ``from_local`` takes the mesh as a graph input (pytorch/pytorch#169867,
    pytorch/pytorch#176457).
    Every other handler is torch's.
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

    Like ``from_local`` above: Dynamo 2.11 closes over the mesh argument as a
    constant. Without it, ``x.redistribute(mesh, ...)`` with a registered
    ``DeviceMesh`` that is a graph input fails ("... is self-referential").
    With it, the mesh is the constant Dynamo 2.11 makes of an unregistered
    mesh, guarded by equality. torch 2.12+ passes the mesh as a graph input
    (pytorch/pytorch#169867, pytorch/pytorch#176457).

    Dynamo 2.11 also takes this handler for a method named ``redistribute`` of
    any tensor subclass (torch 2.12 removed the handler and traces
    ``DTensor.redistribute`` like any method). Without the check below, the
    library's own ``ShardedTensor.redistribute`` (or any subclass's) is put in
    the graph as a call of a closure (``redistribute_fn_with_prim_types``),
    which AOTAutograd's cache cannot key: every process of a job compiles
    again ("Unsupported call_function target"). With it, a tensor that is not
    a ``DTensor`` gets Dynamo's generic handling of a tensor method (a
    ``call_method`` node, as on torch 2.12+).
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

    Dynamo 2.11 takes every attribute that ``__tensor_flatten__`` lists on such
    a tensor for an inner tensor. Without it, ``y.device_mesh`` of a DTensor
    ``y`` computed in compiled code (listed by the patched
    ``__tensor_flatten__``) fails with a bare ``AssertionError``. With it, the
    mesh is the compile-time ``DeviceMeshVariable`` that Dynamo 2.11 makes of
    it without the patch (and of a DTensor input's mesh, see
    ``VariableBuilder._wrap``), so DTensor code reading and comparing meshes
    compiles as before; outputs still carry the mesh of the call (the
    ``get_proxy_slot`` patch). torch 2.12+ reads it as an opaque
    (pytorch/pytorch#176457).

    The same assertion stops any other reference opaque that a subclass
    computed in compiled code lists: without it, ``y._mesh`` (``y = x * 2``,
    ``_mesh`` listed by ``__tensor_flatten__``) fails with a bare
    ``AssertionError``. With it, the read is the ``getattr`` node torch 2.11
    already makes for a reference opaque the subclass does *not* list (a
    ``TorchScriptObjectVariable`` of torch's fake wrapper of it), as torch
    2.12+ does for a listed one: the opaque can be passed to custom ops
    (returning it from the compiled function is Dynamo 2.11's "Reconstruction
    failure"). Its members are the library's ``OpaqueMemberError``
    (``fixes.members.check_subclass_made_opaque``): such an opaque has no
    source, so a ``USE_REAL`` value would be compiled in unguarded (torch 2.12 -
    2.15 do so: the first call's value for every call) and an ``INLINED``
    member cannot be traced on 2.11. Every other attribute is torch's.
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
    """The reference opaque (or torch's fake wrapper of one) that the traceable
    subclass ``fake`` lists as ``name`` in ``__tensor_flatten__``, else ``None``."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not is_traceable_wrapper_subclass(fake):
        return None
    names, _ctx = fake.__tensor_flatten__()
    if name not in names:
        return None
    value = getattr(fake, name)
    return value if opaque_kind(value) == "reference" else None


_API = "torch.distributed.tensor._api.DTensor."
