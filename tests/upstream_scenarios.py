"""Scenarios of upstream torch bugs the library fixes or names
(docs/compatibility.md, "Upstream's own bugs in this feature").

Each scenario asserts what a user should see and, where it guards against a
wrong result, says what it found: ``tests/test_fixes.py`` suspends the fix and
matches that message (the ``*_FAILURE`` records, measured on each release);
``tests/test_upstream_bugs.py`` runs the scenarios with the library on.
"""

from __future__ import annotations

from typing import Any

import torch
from scenarios import StockFailure, fresh_inductor_cache
from subclasses import Config, Mesh, MeshTensor
from torch.utils._pytree import tree_map_only

import opaque_subclass
from opaque_subclass import OpaqueBase

__all__ = [
    "CALLABLE_VALUE_FAILURE",
    "DTENSOR_MESH_CONSTANT_CACHE_FAILURE",
    "DTENSOR_MESH_CONSTANT_LOWERING_FAILURE",
    "GLOBAL_TALLY",
    "MADE_WHILE_TRACING_FAILURE",
    "SET_CONTEXT_FAILURE",
    "UNTRACED_FUNCTION_FAILURE",
    "UNTRACED_SCALE",
    "VALUE_OPAQUE_OUTPUT_FAILURE",
    "CarriedTallied",
    "GlobalTallied",
    "Quantizer",
    "Tallied",
    "Tally",
    "callable_value_opaque_on_an_intermediate_compiles",
    "checkpointed_untraced_function_is_not_served_stale",
    "dtensor_made_on_a_mesh_argument_compiles_with_inductor",
    "equal_set_contexts_share_a_cache_entry",
    "multiply",
    "reference_opaque_made_while_tracing_is_named",
    "tallied_outputs",
    "untraced_scaled_sine",
    "value_opaque_beside_subclass_output_survives_the_caches",
]


def value_opaque_beside_subclass_output_survives_the_caches() -> None:
    """pytorch/pytorch#193190: ``f(x) = (x * 2, Config(7))`` with ``x`` a
    subclass, compiled with inductor, then compiled again in the same process
    and served from AOTAutograd's and inductor's caches (Dynamo reset,
    inductor's loaded modules forgotten; a fresh cache directory for the two).
    Both times the function returns the real ``Config(7)``."""
    from torch._dynamo.utils import counters
    from torch._inductor.codecache import PyCodeCache

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, Config]:
        return x * 2, Config(7)

    with fresh_inductor_cache():
        for attempt in ("compiled", "loaded from the caches"):
            torch._dynamo.reset()
            counters.clear()
            PyCodeCache.cache_clear()  # the second compilation loads the graph from the disk cache
            mesh = Mesh("a")
            out, config = torch.compile(fn, backend="inductor", fullgraph=True)(MeshTensor(torch.ones(2), mesh))
            assert out._mesh is mesh and out._data.tolist() == [2.0, 2.0], attempt
            served = counters["aot_autograd"]["autograd_cache_hit"] > 0
            assert served == (attempt != "compiled"), f"{attempt}: served from AOTAutograd's cache: {served}"
            # torch's fake wrapper passes isinstance(x, Config): compare the exact type
            assert type(config) is Config and config.bits == 7, (
                f"{attempt}: returned {type(config).__name__}, expected Config(7)"
            )
    torch._dynamo.reset()


#: With the fix of ``subclass_utils.unwrap_tensor_subclasses`` suspended (torch
#: 2.12 - 2.14): the first compilation returns torch's fake wrapper on 2.12 and
#: 2.13; on 2.14 it is right, and the graph loaded from the caches returns None.
VALUE_OPAQUE_OUTPUT_FAILURE = {
    (2, 12): StockFailure(AssertionError, r"^compiled: returned FakeScriptObject, expected Config\(7\)$"),
    (2, 13): StockFailure(AssertionError, r"^compiled: returned FakeScriptObject, expected Config\(7\)$"),
    (2, 14): StockFailure(AssertionError, r"^loaded from the caches: returned NoneType, expected Config\(7\)$"),
}


class Tally(OpaqueBase):
    """Mutable state of one call: counts the ops it served (a reference opaque)."""

    def __init__(self) -> None:
        self.count = 0


opaque_subclass.register_opaque(Tally)


@torch.library.custom_op("osc_upstream::tally_scale", mutates_args=())
def _tally_scale(t: torch.Tensor, tally: Tally) -> torch.Tensor:
    tally.count += 1
    return t * tally.count


@_tally_scale.register_fake
def _(t: torch.Tensor, tally: Tally) -> torch.Tensor:
    return torch.empty_like(t)


class Tallied(torch.Tensor):
    """A subclass whose multiplication scales by a Tally's count, with a fresh
    Tally per operation, made in ``__torch_dispatch__`` (see :meth:`tally`)."""

    OPAQUES: tuple[str, ...] = ()

    @staticmethod
    def __new__(cls, data: torch.Tensor, tally: Any = None) -> Any:
        r = torch.Tensor._make_wrapper_subclass(cls, data.shape, strides=data.stride(), dtype=data.dtype)
        r._data = data
        r._tally = tally
        return r

    def __init__(self, data: torch.Tensor, tally: Any = None) -> None:
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={tuple(self.shape)})"

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["_data", *self.OPAQUES], None

    @classmethod
    def __tensor_unflatten__(cls, inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        return cls(inner["_data"], inner.get("_tally"))

    def tally(self) -> Tally:
        return Tally()

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        proto = next(a for a in args if isinstance(a, Tallied))
        args, kwargs = tree_map_only(Tallied, lambda t: t._data, (args, kwargs or {}))
        if func is torch.ops.aten.mul.Tensor:
            out = torch.ops.osc_upstream.tally_scale(args[0] * args[1], proto.tally())
            return cls(out, proto._tally)
        return tree_map_only(torch.Tensor, lambda t: cls(t, proto._tally), func(*args, **kwargs))


class CarriedTallied(Tallied):
    """Uses the Tally it carries as an attribute listed in ``__tensor_flatten__``: a graph input."""

    OPAQUES = ("_tally",)

    def tally(self) -> Tally:
        return self._tally  # type: ignore[no-any-return]


#: The Tally that ``GlobalTallied`` reads below Dynamo, made before any trace.
GLOBAL_TALLY = Tally()


class GlobalTallied(Tallied):
    """Uses a module-level Tally, read in ``__torch_dispatch__`` (torch compiles it in)."""

    def tally(self) -> Tally:
        return GLOBAL_TALLY


def tallied_outputs(fn: Any, make: Any, calls: int = 3) -> list[list[float]]:
    """``fn(*make())`` ``calls`` times: each output's values."""
    return [fn(*make())._data.tolist() for _ in range(calls)]


def multiply(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * y


def reference_opaque_made_while_tracing_is_named() -> None:
    """pytorch/pytorch#176044: ``x * y`` of two subclasses whose
    ``__torch_dispatch__`` makes a fresh ``Tally`` and passes it to a custom
    op; eager gives 2, 2, 2 over three calls. Compiled, the library refuses
    the program by name (torch alone compiles the trace's one Tally in, and
    counts on: 2, 4, 6)."""
    from opaque_subclass.fixes.traced_opaques import OpaqueCreatedWhileTracingError

    def make() -> tuple[Tallied, Tallied]:
        return Tallied(torch.ones(2)), Tallied(torch.full((2,), 2.0))

    eager = tallied_outputs(multiply, make)
    assert eager == [[2.0, 2.0]] * 3, eager
    torch._dynamo.reset()
    compiled = torch.compile(multiply, backend="aot_eager", fullgraph=True)
    try:
        outs = tallied_outputs(compiled, make)
    except OpaqueCreatedWhileTracingError as e:
        text = str(e)
        assert text.startswith("a reference opaque upstream_scenarios.Tally was created while torch traced"), text
        assert "pytorch/pytorch#176044" in text and "Fix: create it outside the compiled function" in text, text
        assert 'register_opaque(Tally, kind="value")' in text, text
    else:
        raise AssertionError(f"compiled outputs {outs}, eager {eager}: no error")
    finally:
        torch._dynamo.reset()


#: With either half of the fix suspended (the metaclass's record, or the
#: tracer's refusal): torch compiles the Tally in, silently (every release).
MADE_WHILE_TRACING_FAILURE = StockFailure(
    AssertionError, r"^compiled outputs \[\[2\.0, 2\.0\], \[4\.0, 4\.0\], \[6\.0, 6\.0\]\], eager .*: no error$"
)


class Quantizer(OpaqueBase):
    """A value opaque that is also callable (a quantizer applied to a tensor)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def factor(self) -> int:
        return self.k

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return t * self.k

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantizer) and other.k == self.k

    def __hash__(self) -> int:
        return hash(self.k)

    def __fx_repr__(self) -> tuple[str, dict[str, type]]:
        return f"Quantizer({self.k})", {"Quantizer": Quantizer}


opaque_subclass.register_opaque(Quantizer, kind="value", members={"factor": opaque_subclass.Member.USE_REAL})


def callable_value_opaque_on_an_intermediate_compiles() -> None:
    """pytorch/pytorch#188796: a subclass tensor made in the compiled region
    (``y = t + 1``) carries a callable value opaque in its flatten context;
    calling its method, and the opaque itself, compiles to one graph each with
    ``fullgraph=True`` and gives eager's values."""

    def method(t: torch.Tensor) -> torch.Tensor:
        y = t + 1
        return y * y._ctx.factor()

    def call(t: torch.Tensor) -> torch.Tensor:
        y = t + 1
        return y._ctx(y)

    for fn in (method, call):
        torch._dynamo.reset()
        mesh = Mesh("q")
        x = MeshTensor(torch.arange(3.0), mesh, ctx=Quantizer(3))
        out = torch.compile(fn, backend="aot_eager", fullgraph=True)(x)
        assert out._data.tolist() == [3.0, 6.0, 9.0] and out._mesh is mesh, fn.__name__
    torch._dynamo.reset()


_METHOD_CALL = StockFailure(torch._dynamo.exc.Unsupported, r"^Unsupported method call\n")

#: With the fix of ``TensorVariable.dynamic_getattr`` suspended: a graph break on the method call.
CALLABLE_VALUE_FAILURE = {
    (2, 12): _METHOD_CALL,
    (2, 13): _METHOD_CALL,
    (2, 14): StockFailure(torch._dynamo.exc.Unsupported, r"^Unsupported python_type\(\) call\n"),
}


def equal_set_contexts_share_a_cache_entry() -> None:
    """pytorch/pytorch#193418: ``t * 2`` of a hand-written subclass whose flatten context is
    a frozenset, compiled with inductor, then compiled again (Dynamo reset, one fresh cache
    directory) for an instance whose equal frozenset iterates in another order (built from
    the colliding 16 and 8 the other way round, as another ``PYTHONHASHSEED`` would order
    strings): AOTAutograd's cache serves the second compilation."""
    from torch._dynamo.utils import counters

    hits = []
    with fresh_inductor_cache():
        for order in ([8, 16], [16, 8]):
            torch._dynamo.reset()
            counters.clear()
            mesh = Mesh("a")
            out = torch.compile(lambda t: t * 2, backend="inductor", fullgraph=True)(
                MeshTensor(torch.ones(2), mesh, ctx=frozenset(order))
            )
            assert out._mesh is mesh and out._data.tolist() == [2.0, 2.0]
            hits.append(counters["aot_autograd"]["autograd_cache_hit"])
    assert hits == [0, 1], f"AOTAutograd cache hits per compilation {hits}, expected [0, 1]"


#: With the fix of ``AOTAutogradCachePickler._default_stable_hash_for_caching`` suspended
#: (torch 2.12 - 2.14): the equal context keys apart.
SET_CONTEXT_FAILURE = StockFailure(
    AssertionError, r"^AOTAutograd cache hits per compilation \[0, 0\], expected \[0, 1\]$"
)


#: What the untraced function in :func:`checkpointed_untraced_function_is_not_served_stale`
#: multiplies by: a setting the second compilation changes.
UNTRACED_SCALE = [2.0]


@torch._dynamo.allow_in_graph
def untraced_scaled_sine(t: torch.Tensor) -> torch.Tensor:
    return torch.sin(t * UNTRACED_SCALE[0])


def checkpointed_untraced_function_is_not_served_stale() -> None:
    """pytorch/pytorch#194658: a ``torch.utils.checkpoint`` region calling a function Dynamo
    does not trace (``allow_in_graph``, reading a module setting), on a subclass holding a
    mesh, compiled with inductor (forward and backward), then compiled again (Dynamo reset,
    one fresh cache directory) after the setting changed: the second compilation computes
    with the new setting, as eager does, whatever AOTAutograd's cache holds."""

    def fn(t: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(untraced_scaled_sine, t, use_reentrant=False)

    outs = []
    try:
        with fresh_inductor_cache():
            for scale in (2.0, 3.0):
                torch._dynamo.reset()
                UNTRACED_SCALE[0] = scale
                mesh = Mesh("a")
                x = MeshTensor(torch.ones(2), mesh).requires_grad_()
                out = torch.compile(fn, backend="inductor")(x)
                out.sum().backward()
                assert out._mesh is mesh
                outs.append(round(out._data[0].item(), 4))
    finally:
        UNTRACED_SCALE[0] = 2.0
        torch._dynamo.reset()
    expected = [round(torch.sin(torch.tensor(s)).item(), 4) for s in (2.0, 3.0)]
    assert outs == expected, f"compiled {outs}, eager {expected}"


#: With the fix of ``check_cacheable`` suspended (every release): the second compilation is
#: served the first one's artifact, sin(2) where sin(3) was asked.
UNTRACED_FUNCTION_FAILURE = StockFailure(AssertionError, r"^compiled \[0\.9093, 0\.9093\], eager \[0\.9093, 0\.1411\]$")


def dtensor_made_on_a_mesh_argument_compiles_with_inductor() -> None:
    """``DTensor.from_local(t * 2, mesh, [Shard(0)]) + 1`` with the mesh an argument, compiled
    with inductor (forward and backward) twice in one fresh cache directory (Dynamo reset
    between), a fake world of 2 (found by the conformance entry of pytorch/pytorch#183999):
    eager's values and gradient, the output on a mesh equal to the one passed in, both times. On torch 2.11
    the backport lists the mesh as a DTensor attribute while Dynamo keeps such a mesh as a
    constant of the graph, which inductor 2.11 could neither lower nor restore from its cache."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def fn(t: torch.Tensor, mesh: Any) -> Any:
        return DTensor.from_local(t * 2, mesh, [Shard(0)]) + 1

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        with fresh_inductor_cache():
            for _ in range(2):
                torch._dynamo.reset()
                t = torch.ones(4, requires_grad=True)
                out = torch.compile(fn, backend="inductor")(t, mesh)
                out.to_local().sum().backward()
                assert out.device_mesh == mesh  # torch 2.11: an equal mesh of an earlier trace may stand for it
                assert out.to_local().tolist() == [3.0] * 4 and t.grad.tolist() == [2.0] * 4
    finally:
        torch._dynamo.reset()
        dist.destroy_process_group()


#: torch 2.11 with the backport's ``GraphLowering.run_node`` patch suspended: the forward
#: graph's mesh constant cannot be lowered.
DTENSOR_MESH_CONSTANT_LOWERING_FAILURE = StockFailure(torch._inductor.exc.InductorError, r"^KeyError: 'val'")

#: torch 2.11 with the backport's ``FxGraphCache._check_for_hop`` patch suspended: the second
#: compilation, served from the FX graph cache, has lost the mesh constant.
DTENSOR_MESH_CONSTANT_CACHE_FAILURE = StockFailure(AttributeError, r"^'NoneType' object has no attribute 'size'$")
