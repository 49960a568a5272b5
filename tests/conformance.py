"""The cross-release conformance corpus: behaviours a user can observe, recorded
the same way on every torch leg and compared with one reference.

Each entry is a small program that returns its *observation*: plain JSON
(outputs as rounded values, the opaque each output carries named by the input
it is identical to, numbers of compilations, recompile reasons and graphs as
normalised text, exception types with the names their messages mention, member
values, export round trips, DTensor and ``ShardedTensor`` programs on fake
process groups). ``tests/test_conformance.py`` runs every entry on the running
leg and compares it with ``tests/conformance_reference.json`` (recorded on the
newest release); a difference fails unless the release table lists it
(``opaque_subclass.releases.RELEASES[...].differences``, each difference naming
the entries that show it), and a listed difference that no longer shows fails
too.

Record a reference or a leg's observations::

    python tests/conformance.py --out observations.json          # the library on
    python tests/conformance.py --stock --out stock.json          # torch alone (2.12+)
    python tests/conformance.py --compare reference.json observations.json

Entries are independent: each resets Dynamo before and after, builds its own
objects, and tears down any process group it creates.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import io
import json
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch._dynamo.testing

import opaque_subclass
from opaque_subclass import Member, OpaqueBase, OpaqueSubclass, OpaqueSubclassError
from opaque_subclass.testing import warm

REFERENCE = Path(__file__).with_name("conformance_reference.json")

Observation = Any
ENTRIES: dict[str, Callable[[], Observation]] = {}


def entry(name: str) -> Callable[[Callable[[], Observation]], Callable[[], Observation]]:
    """Add ``fn`` to the corpus under ``name`` (``family/behaviour``)."""

    def add(fn: Callable[[], Observation]) -> Callable[[], Observation]:
        if name in ENTRIES:
            raise ValueError(f"duplicate conformance entry {name!r}")
        ENTRIES[name] = fn
        return fn

    return add


# ---------------------------------------------------------------------------
# The corpus's own classes (module level: export and pickling need names).


class CMesh(OpaqueBase):
    """A reference opaque standing in for a mesh: identity matters."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"CMesh({self.name!r})"


class CStream(OpaqueBase):
    """A second reference opaque type."""

    def __init__(self, idx: int) -> None:
        self.idx = idx

    def __repr__(self) -> str:
        return f"CStream({self.idx})"


class CConfig(OpaqueBase):
    """A value opaque: compared by equality, baked into graphs."""

    def __init__(self, bits: int) -> None:
        self.bits = bits

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CConfig) and other.bits == self.bits

    def __hash__(self) -> int:
        return hash(self.bits)

    def __fx_repr__(self) -> tuple[str, dict[str, type]]:
        return f"CConfig({self.bits})", {"CConfig": CConfig}

    def __repr__(self) -> str:
        return f"CConfig({self.bits})"


class CGauge(OpaqueBase):
    """An opaque whose members compiled code reads."""

    def __init__(self, factor: int, offset: int = 0) -> None:
        self._factor = factor
        self.offset = offset

    def factor(self) -> int:
        return self._factor

    def doubled(self) -> int:
        return 2 * self.factor()

    def other(self) -> int:
        return -1

    def __repr__(self) -> str:
        return f"CGauge({self._factor})"


class CForeign:
    """A registered class that does not inherit OpaqueBase."""

    def __init__(self, name: str) -> None:
        self.name = name


class CUnregistered:
    """Never registered."""


class CColor(enum.Enum):
    RED = 1


class CAnswersAll(OpaqueBase):
    """An opaque whose ``__getattr__`` answers every name (a forwarding proxy)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attr: str) -> Any:
        return self


opaque_subclass.register_opaque(CMesh)
opaque_subclass.register_opaque(CStream)
opaque_subclass.register_opaque(CConfig, kind="value")
opaque_subclass.register_opaque(CForeign)
opaque_subclass.register_opaque(CAnswersAll)
opaque_subclass.register_opaque(
    CGauge,
    members={"factor": Member.USE_REAL, "offset": Member.USE_REAL, "doubled": Member.INLINED},
)


class CSharded(OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": CMesh}
    meta_attrs = ("_tag",)


class CProxied(OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_proxy": CAnswersAll}


class CTwo(OpaqueSubclass):
    tensor_attrs = ("_a", "_b")
    opaque_attrs = {"_mesh": CMesh, "_stream": CStream}


class CGaugeTensor(OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_gauge": CGauge}


class CHand(torch.Tensor):
    """A hand-written wrapper subclass (no OpaqueSubclass): one tensor, one
    opaque attribute, a value opaque in the context."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, mesh: Any, config: Any) -> Any:
        r = torch.Tensor._make_wrapper_subclass(cls, data.shape, strides=data.stride(), dtype=data.dtype)
        r._data = data
        r._mesh = mesh
        r._config = config
        return r

    def __init__(self, data: torch.Tensor, mesh: Any, config: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"CHand(shape={tuple(self.shape)})"

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["_data", "_mesh"], self._config

    @classmethod
    def __tensor_unflatten__(cls, inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        return cls(inner["_data"], inner["_mesh"], ctx)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torch.utils._pytree import tree_leaves, tree_map_only

        proto = next(a for a in tree_leaves((args, kwargs)) if isinstance(a, cls))
        out = func(*tree_map_only(cls, lambda t: t._data, args), **tree_map_only(cls, lambda t: t._data, kwargs or {}))
        return tree_map_only(torch.Tensor, lambda t: cls(t, proto._mesh, proto._config), out)


class CHandConstant(CHand):
    """``CHand`` whose ``__tensor_flatten__`` returns constants only: every instance
    flattens alike (no value opaque in the context)."""

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["_data", "_mesh"], None


class CBare(CHand):
    """``CHand`` with torch's default ``Tensor.__repr__`` (it reads the values), as many
    hand-written subclasses have."""

    __repr__ = torch.Tensor.__repr__


class CNested(OpaqueSubclass):
    """An OpaqueSubclass whose inner tensor is itself a CSharded."""

    tensor_attrs = ("_inner",)
    opaque_attrs = {"_stream": CStream}


class CScale(torch.nn.Module):
    def __init__(self, mesh: CMesh) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(CSharded(torch.arange(3.0), mesh, "w"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x + 1


class CAffine(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1


# ---------------------------------------------------------------------------
# Normalisation.


def _values(t: torch.Tensor) -> list[float]:
    return [round(float(v), 4) for v in t.detach().reshape(-1).tolist()]


def _ident(obj: object, known: dict[str, object]) -> str:
    for name, candidate in known.items():
        if candidate is obj:
            return name
    return f"other {type(obj).__name__}"


def describe(x: object, known: dict[str, object] | None = None) -> Any:
    """A JSON description of an output: values, types, and each opaque named by
    the known object it is (``"other <type>"`` when none)."""
    known = known or {}
    if isinstance(x, (tuple, list)):
        return [describe(v, known) for v in x]
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        return round(x, 4)
    if not isinstance(x, torch.Tensor):
        return _ident(x, known)
    if _is_dtensor(x):
        return {
            "DTensor": _values(x.to_local()),
            "placements": [str(p) for p in x.placements],
            "mesh": _ident(x.device_mesh, known),
        }
    if type(x) is torch.Tensor or type(x) is torch.nn.Parameter:
        return {"tensor": _values(x), "shape": list(x.shape)}
    names, _ctx = x.__tensor_flatten__()  # type: ignore[attr-defined]
    out: dict[str, Any] = {"type": type(x).__name__, "shape": list(x.shape)}
    for name in names:
        value = getattr(x, name)
        out[name] = describe(value, known) if isinstance(value, torch.Tensor) else _ident(value, known)
    return out


def _is_dtensor(x: object) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return isinstance(x, DTensor)


_IDS = re.compile(r"\d{6,}")
_HEX = re.compile(r"0x[0-9a-f]+")


def normalise(text: str) -> str:
    """Drop what varies between runs (ids, addresses, source comments, spacing)."""
    text = text.split("#", 1)[0]
    text = _HEX.sub("<addr>", _IDS.sub("<id>", text))
    return " ".join(text.split())


def recompile_reasons() -> list[str]:
    failures = torch._dynamo.utils.guard_failures
    return sorted(normalise(r) for reasons in failures.values() for r in reasons)


def error(e: BaseException, *names: str) -> dict[str, Any]:
    """An exception as its type, whether it is the library's, and which of
    ``names`` (the subclass, the path, the type found, ...) its message names."""
    text = str(e)
    return {
        "raised": type(e).__name__,
        "ours": isinstance(e, OpaqueSubclassError),
        "names": [n for n in names if n in text],
        "has_fix": "Fix" in text or "fix" in text,
    }


def raised(fn: Callable[[], object], *names: str) -> dict[str, Any]:
    try:
        value = fn()
    except Exception as e:  # the observation is the exception
        return error(e, *names)
    return {"returned": describe(value)}


def _graph_text(gm: torch.fx.GraphModule) -> list[str]:
    """A graph as its node kinds: placeholders by the kind of value they stand
    for, calls by target; names and ids dropped."""
    lines = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val", node.meta.get("example_value"))
            kind = (
                "tensor"
                if isinstance(val, torch.Tensor)
                else "symint"
                if isinstance(val, torch.SymInt)
                else "opaque"
                if (val is not None and "ScriptObject" in type(val).__name__) or opaque_subclass.is_opaque(val)
                else type(val).__name__
            )
            lines.append(f"input {kind}")
        elif node.op in ("call_function", "call_method"):
            lines.append(str(node.target))
        elif node.op == "output":
            lines.append(f"output {len(node.args[0]) if isinstance(node.args[0], (tuple, list)) else 1}")
    return lines


def capturing_backend(graphs: list[list[str]]) -> Any:
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(_graph_text(gm))
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=compiler, bw_compiler=compiler)


@contextlib.contextmanager
def fresh() -> Iterator[None]:
    torch._dynamo.reset()
    try:
        yield
    finally:
        torch._dynamo.reset()


def counter(backend: Any) -> torch._dynamo.testing.CompileCounterWithBackend:
    return torch._dynamo.testing.CompileCounterWithBackend(backend)


@contextlib.contextmanager
def fake_world(world_size: int) -> Iterator[Any]:
    """torch's fake process group as the default group, ProcessGroup and
    DeviceMesh registered; destroyed on exit."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.distributed_c10d import ProcessGroup
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        opaque_subclass.register_opaque(ProcessGroup)
        opaque_subclass.register_opaque(DeviceMesh)
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------
# Compiled programs on CSharded: outputs, identities, compilations.

BACKENDS = ("eager", "aot_eager", "inductor")


def _sharded_runs(
    fn: Callable[..., Any], *, backend: str, grad: bool = False, calls: int = 3, two_inputs: bool = False
) -> dict[str, Any]:
    with fresh():
        count = counter(backend)
        compiled = torch.compile(fn, backend=count, fullgraph=True)
        outs = []
        for i in range(calls):
            mesh = CMesh(f"m{i}")
            known: dict[str, object] = {"input mesh": mesh}
            x = CSharded(torch.arange(4.0) + i, mesh, "t", requires_grad=grad)
            args = (x, CSharded(torch.ones(4), mesh, "t")) if two_inputs else (x,)
            out = compiled(*args)
            seen: dict[str, Any] = {"out": describe(out, known)}
            if grad:
                (out if out.dim() == 0 else out.sum()).backward()
                seen["grad"] = describe(x.grad, known)
            outs.append(seen)
        return {"calls": outs, "compilations": count.frame_count, "reasons": recompile_reasons()}


_PROGRAMS: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
    "scale": (lambda t: t * 2, {}),
    "sum-backward": (lambda t: (t * t).sum(), {"grad": True}),
    "binary": (lambda t, u: t + u * 3, {"two_inputs": True}),
    "view-slice": (lambda t: t.view(2, 2)[1:], {}),
    "inplace-clone": (lambda t: t.clone().add_(1), {}),
    "mul-add-backward": (lambda t: t * 3 + 1, {"grad": True}),
}

for _name, (_fn, _opts) in _PROGRAMS.items():
    for _backend in BACKENDS:

        def _run(fn: Callable[..., Any] = _fn, backend: str = _backend, opts: dict[str, Any] = _opts) -> Observation:
            return _sharded_runs(fn, backend=backend, **opts)

        entry(f"compile/{_name}/{_backend}")(_run)


@entry("compile/graph-break/aot_eager")
def _graph_break() -> Observation:
    def fn(t: torch.Tensor) -> torch.Tensor:
        y = t * 2
        torch._dynamo.graph_break()
        return y + 1

    with fresh():
        count = counter("aot_eager")
        compiled = torch.compile(fn, backend=count)
        meshes = [CMesh("a"), CMesh("b")]
        outs = [describe(compiled(CSharded(torch.ones(2), m, "t")), {"input mesh": m}) for m in meshes]
        return {"outs": outs, "compilations": count.frame_count}


@entry("compile/opaque-getattr-answers-all/aot_eager")
def _getattr_answers_all() -> Observation:
    with fresh():
        count = counter("aot_eager")
        compiled = torch.compile(lambda t: t * 2, backend=count, fullgraph=True)
        proxies = [CAnswersAll("a"), CAnswersAll("b")]
        outs = [describe(compiled(CProxied(torch.ones(2), p)), {"input proxy": p}) for p in proxies]
        return {"outs": outs, "compilations": count.frame_count}


@entry("compile/returns-input/aot_eager")
def _returns_input() -> Observation:
    with fresh():
        count = counter("aot_eager")
        compiled = torch.compile(lambda t: (t, t * 1), backend=count, fullgraph=True)
        m = CMesh("a")
        x = CSharded(torch.ones(2), m, "t")
        a, b = compiled(x)
        return {"first is input": a is x, "second": describe(b, {"input mesh": m}), "compilations": count.frame_count}


@entry("compile/two-opaques/aot_eager")
def _two_opaques() -> Observation:
    with fresh():
        count = counter("aot_eager")
        compiled = torch.compile(lambda t: t * 2, backend=count, fullgraph=True)
        outs = []
        for i in range(3):
            m, s = CMesh(str(i)), CStream(i)
            outs.append(describe(compiled(CTwo(torch.ones(2), torch.zeros(2), m, s)), {"mesh": m, "stream": s}))
        return {"outs": outs, "compilations": count.frame_count}


@entry("compile/nested/aot_eager")
def _nested() -> Observation:
    with fresh():
        count = counter("aot_eager")
        compiled = torch.compile(lambda t: t + 1, backend=count, fullgraph=True)
        outs = []
        for i in range(2):
            m, s = CMesh(str(i)), CStream(i)
            x = CNested(CSharded(torch.ones(2) * i, m, "in"), s)
            outs.append(describe(compiled(x), {"mesh": m, "stream": s}))
        return {"outs": outs, "compilations": count.frame_count}


@entry("compile/handwritten/aot_eager")
def _handwritten() -> Observation:
    with fresh():
        count = counter("aot_eager")
        compiled = torch.compile(lambda t: t * 2, backend=count, fullgraph=True)
        outs = []
        for i, bits in enumerate((8, 8, 4)):
            m = CMesh(str(i))
            out = compiled(CHand(torch.ones(2), m, CConfig(bits)))
            outs.append({"out": describe(out, {"mesh": m}), "config": out._config.bits})
        return {"outs": outs, "compilations": count.frame_count, "reasons": recompile_reasons()}


@entry("compile/meta-change-recompiles/aot_eager")
def _meta_change() -> Observation:
    with fresh():
        count = counter("aot_eager")
        compiled = torch.compile(lambda t: t * 2, backend=count, fullgraph=True)
        for tag in ("a", "a", "b"):
            compiled(CSharded(torch.ones(2), CMesh(tag), tag))
        return {"compilations": count.frame_count, "reasons": recompile_reasons()}


@entry("compile/shape-change/aot_eager")
def _shape_change() -> Observation:
    with fresh():
        count = counter("aot_eager")
        compiled = torch.compile(lambda t: t * 2, backend=count, fullgraph=True)
        outs = []
        for n in (2, 3, 4):
            m = CMesh(str(n))
            outs.append(describe(compiled(CSharded(torch.ones(n), m, "t")), {"input mesh": m}))
        return {"outs": outs, "compilations": count.frame_count}


@entry("compile/opaque-argument/aot_eager")
def _opaque_argument() -> Observation:
    with fresh():
        count = counter("aot_eager")
        compiled = torch.compile(lambda x, m: torch.ops.conformance.name_length(x, m), backend=count, fullgraph=True)
        outs = [describe(compiled(torch.ones(2), CMesh(n))) for n in ("a", "bb", "cc")]
        return {"outs": outs, "compilations": count.frame_count}


@entry("compile/custom-op-takes-opaque/aot_eager")
def _custom_op() -> Observation:
    with fresh():
        count = counter("aot_eager")
        compiled = torch.compile(
            lambda t: torch.ops.conformance.name_length(t._data, t._mesh), backend=count, fullgraph=True
        )
        outs = [describe(compiled(CSharded(torch.ones(2), CMesh(n), "t"))) for n in ("a", "bbb")]
        return {"outs": outs, "compilations": count.frame_count}


@entry("compile/custom-op-takes-opaque/inductor-with-metrics-log")
def _custom_op_inductor_metrics() -> Observation:
    """The custom op taking a subclass's mesh, compiled with inductor while inductor's
    metrics log is on (``TORCH_LOGS=inductor_metrics``: inductor then counts the bytes of
    every buffer of its graph, the mesh's among them), two meshes."""
    from scenarios import inductor_metrics_log_on
    from torch._inductor.utils import fresh_cache

    # a graph inductor compiles, not one its cache serves
    with inductor_metrics_log_on(), fresh(), fresh_cache():
        count = counter("inductor")
        compiled = torch.compile(
            lambda t: torch.ops.conformance.name_length(t._data, t._mesh), backend=count, fullgraph=True
        )
        outs: list[Any] = []
        for n in ("a", "bbb"):
            try:
                outs.append(describe(compiled(CSharded(torch.ones(2), CMesh(n), "t"))))
            except Exception as e:  # the observation is the exception
                outs.append(error(e))
        return {"outs": outs, "compilations": count.frame_count}


@torch.library.custom_op("conformance::name_length", mutates_args=())
def _name_length(t: torch.Tensor, mesh: CMesh) -> torch.Tensor:
    return t + len(mesh.name)


@_name_length.register_fake
def _(t: torch.Tensor, mesh: CMesh) -> torch.Tensor:
    return torch.empty_like(t)


@entry("compile/module-attribute/aot_eager")
def _module_attribute() -> Observation:
    class Holds(torch.nn.Module):
        def __init__(self, mesh: CMesh) -> None:
            super().__init__()
            self.mesh = mesh

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return CSharded(x * 2, self.mesh, "t")

    with fresh():
        count = counter("aot_eager")
        outs = []
        for n in ("a", "b"):
            m = CMesh(n)
            outs.append(describe(torch.compile(Holds(m), backend=count, fullgraph=True)(torch.ones(2)), {"mesh": m}))
        return {"outs": outs, "compilations": count.frame_count}


@entry("compile/construct-in-graph/aot_eager")
def _construct_in_graph() -> Observation:
    with fresh():
        count = counter("aot_eager")
        compiled = torch.compile(lambda x, m: CSharded(x + 1, m, "t") * 2, backend=count, fullgraph=True)
        outs = []
        for n in ("a", "b"):
            m = CMesh(n)
            outs.append(describe(compiled(torch.ones(2), m), {"mesh": m}))
        return {"outs": outs, "compilations": count.frame_count}


@entry("compile/dynamic-shapes/aot_eager")
def _dynamic() -> Observation:
    with fresh():
        count = counter("aot_eager")
        compiled = torch.compile(lambda t: t * 2, backend=count, fullgraph=True, dynamic=True)
        outs = []
        for n in (2, 3, 5):
            m = CMesh(str(n))
            outs.append(describe(compiled(CSharded(torch.ones(n), m, "t")), {"input mesh": m}))
        return {"outs": outs, "compilations": count.frame_count}


@entry("compile/compiled-autograd/aot_eager")
def _compiled_autograd() -> Observation:
    import torch._dynamo.compiled_autograd as ca

    with fresh():
        compiled = torch.compile(lambda t: (t * t).sum(), backend="aot_eager", fullgraph=True)
        m = CMesh("a")
        x = CSharded(torch.arange(3.0), m, "t", requires_grad=True)
        out = compiled(x)
        with ca._enable(torch.compile(backend="aot_eager")):
            out.backward()
        return {"grad": describe(x.grad, {"input mesh": m})}


@contextlib.contextmanager
def _structured_trace_as_torch_leaves_it() -> Iterator[None]:
    """torch's structured-trace logger (``torch.__trace``) without the handlers pytest's log
    capture adds to it, for the duration: torch computes that log's payloads (its metadata
    formatted with the traced tensors' ``__repr__``) only while the logger has a handler, as
    under ``TORCH_TRACE``; a plain run has none once torch's lazy handler removed itself."""
    import logging

    trace = logging.getLogger("torch.__trace")
    foreign = [h for h in trace.handlers if not type(h).__module__.startswith("torch.")]
    for h in foreign:
        trace.removeHandler(h)
    try:
        yield
    finally:
        for h in foreign:
            trace.addHandler(h)


@entry("compile/subclass-without-repr")
def _subclass_without_repr() -> Observation:
    """A hand-written subclass that keeps torch's default ``__repr__``, compiled with
    aot_eager, forward then forward and backward, each on two meshes: outputs and gradients
    (torch 2.11 alone cannot compile it: it formats its traced inputs on every compilation).
    Without a structured trace (``TORCH_TRACE``), as a user runs it."""
    seen: dict[str, Any] = {}
    for label, grad in (("forward", False), ("forward and backward", True)):
        with fresh(), _structured_trace_as_torch_leaves_it():
            count = counter("aot_eager")
            compiled = torch.compile(lambda t: t * 2, backend=count, fullgraph=True)
            calls: list[Any] = []
            for name in ("a", "b"):
                m = CMesh(name)
                x = CBare(torch.arange(3.0), m, CConfig(1)).requires_grad_(grad)
                try:
                    out = compiled(x)
                except Exception as e:  # the observation is the exception
                    calls.append(error(e))
                    continue
                call = {"out": describe(out, {"input mesh": m})}
                if grad:
                    out.sum().backward()
                    call["grad"] = describe(x.grad, {"input mesh": m})
                calls.append(call)
            seen[label] = {"calls": calls, "compilations": count.frame_count}
    return seen


def _computed_list_class(how: str) -> type[torch.Tensor]:
    """A fresh wrapper subclass whose ``__tensor_flatten__`` computes its attribute
    list when it runs, by ``how``: a class attribute (``class``), a list shared between
    instances (``shared``), a method of the instance's state (``method``), a property
    reading the instance's ``__dict__`` (``dict-property``). Both meshes are kept,
    listed or not; the context is ``None`` throughout."""
    from torch.utils._pytree import tree_map_only

    shared = ["_data", "_a"]

    class Computed(torch.Tensor):
        NAMES = ["_data", "_a"]

        @staticmethod
        def __new__(cls, data: torch.Tensor, a: Any, b: Any, which: str = "_a") -> Any:
            r = torch.Tensor._make_wrapper_subclass(cls, data.shape, strides=data.stride(), dtype=data.dtype)
            r._data, r._a, r._b, r._which = data, a, b, which
            r.__dict__["_source"] = ["_data", which]
            return r

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def __repr__(self) -> str:
            return "Computed()"

        def _from_state(self) -> list[str]:
            return ["_data", self._which]

        @property
        def names(self) -> list[str]:
            if how == "class":
                return type(self).NAMES
            if how == "shared":
                return shared
            if how == "method":
                return self._from_state()
            return list(self.__dict__["_source"])

        def __tensor_flatten__(self) -> tuple[list[str], Any]:
            return self.names, None

        @classmethod
        def __tensor_unflatten__(cls, inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
            (which,) = [k for k in inner if k != "_data"]
            meshes = {"_a": None, "_b": None, which: inner[which]}
            return cls(inner["_data"], meshes["_a"], meshes["_b"], which)

        @classmethod
        def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            ref = next(a for a in args if isinstance(a, cls))
            unwrapped = tree_map_only(cls, lambda t: t._data, (args, kwargs or {}))
            out = func(*unwrapped[0], **unwrapped[1])
            which = ref.names[1]
            return tree_map_only(torch.Tensor, lambda t: cls(t, ref._a, ref._b, which), out)

    def change(t: Any) -> None:
        if how == "class":
            Computed.NAMES = ["_data", "_b"]
        elif how == "shared":
            shared[1] = "_b"
        elif how == "method":
            t._which = "_b"
        else:
            t.__dict__["_source"] = ["_data", "_b"]

    Computed.change = staticmethod(change)  # type: ignore[attr-defined]
    return Computed


def _computed_attribute_list(how: str, backend: str) -> Observation:
    """A subclass input whose computed attribute list changes between two calls while
    its context stays equal: each output's listed mesh (eager's is the input's newly
    listed one), the compilations, and whether the second compilation came from the
    failed guard on the attribute list."""
    cls = _computed_list_class(how)
    with fresh():
        count = counter(backend)
        compiled = torch.compile(lambda t: t * 2, backend=count, fullgraph=True)
        a, b = CMesh("a"), CMesh("b")
        x = cls(torch.ones(2), a, b)
        first = describe(compiled(x), {"mesh a": a, "mesh b": b})
        cls.change(x)  # type: ignore[attr-defined]
        second = describe(compiled(x), {"mesh a": a, "mesh b": b})
        list_guard = any("__tensor_flatten__()[0]" in r for r in recompile_reasons())
        return {
            "first": first,
            "after the list changed": second,
            "eager after": describe(x * 2, {"mesh a": a, "mesh b": b}),
            "compilations": count.frame_count,
            "the attribute-list guard failed": list_guard,
        }


for _how in ("class", "shared", "method", "dict-property"):
    entry(f"compile/computed-attribute-list-changes/{_how}/aot_eager")(
        lambda how=_how: _computed_attribute_list(how, "aot_eager")
    )
entry("compile/computed-attribute-list-changes/dict-property/inductor")(
    lambda: _computed_attribute_list("dict-property", "inductor")
)


@entry("compile/mark-dynamic-nested")
def _mark_dynamic_nested() -> Observation:
    """``torch._dynamo.mark_dynamic(x, 0)`` on a nested hand-written subclass (``CHand``
    over ``CHand``, a mesh at each level), compiled with aot_eager, three sizes: the
    outputs (each level's mesh) and the compilations."""
    with fresh():
        count = counter("aot_eager")
        compiled = torch.compile(lambda t: t * 2, backend=count, fullgraph=True)
        outs: list[Any] = []
        for n in (2, 3, 5):
            inner, outer = CMesh(f"in {n}"), CMesh(f"out {n}")
            x = CHand(CHand(torch.ones(n), inner, CConfig(1)), outer, CConfig(2))
            try:
                torch._dynamo.mark_dynamic(x, 0)
                outs.append(describe(compiled(x), {"inner mesh": inner, "outer mesh": outer}))
            except Exception as e:  # the observation is the exception
                outs.append(error(e))
        return {"outs": outs, "compilations": count.frame_count}


@entry("compile/mark-dynamic-nested-opaque-subclass")
def _mark_dynamic_nested_opaque_subclass() -> Observation:
    """``torch._dynamo.mark_dynamic(x, 0)`` on a ``CSharded`` inside a ``CSharded`` (an
    ``OpaqueSubclass``, whose ``__tensor_unflatten__`` honours ``outer_size``), compiled
    with aot_eager, three sizes, forward and backward: the gradients (each level's mesh)
    and the compilations."""
    with fresh():
        count = counter("aot_eager")
        compiled = torch.compile(lambda t: (t * 2).sum(), backend=count, fullgraph=True)
        grads: list[Any] = []
        for n in (2, 3, 5):
            inner, outer = CMesh(f"in {n}"), CMesh(f"out {n}")
            x = CSharded(CSharded(torch.ones(n), inner, "in"), outer, "out", requires_grad=True)
            try:
                torch._dynamo.mark_dynamic(x, 0)
                compiled(x).backward()
                grads.append(describe(x.grad, {"inner mesh": inner, "outer mesh": outer}))
            except Exception as e:  # the observation is the exception
                grads.append(error(e))
        return {"grads": grads, "compilations": count.frame_count}


@entry("compile/constant-flatten-guards/aot_eager")
def _constant_flatten_guards() -> Observation:
    """Per class, three inputs compiled twice with fresh meshes: the Python calls of
    ``__tensor_flatten__`` in the guards per input (none for a class whose instances
    all flatten alike: a hand-written constant flatten, an ``OpaqueSubclass`` without
    ``meta_attrs``; torch's two for a context per instance), the compilations, each
    output's mesh; then the constant class's method replaced: compiled again, and why."""
    from scenarios import python_flatten_calls_per_input

    makes: dict[str, Callable[[CMesh], torch.Tensor]] = {
        "hand-written constant": lambda m: CHandConstant(torch.ones(2), m, None),
        "OpaqueSubclass without meta_attrs": lambda m: CTwo(torch.ones(2), torch.ones(2), m, CStream(0)),
        "context per instance": lambda m: CHand(torch.ones(2), m, CConfig(8)),
        "OpaqueSubclass with meta_attrs": lambda m: CSharded(torch.ones(2), m, "t"),
    }
    seen: dict[str, Any] = {}
    for label, make in makes.items():
        with fresh():

            def fn(*xs: Any) -> list[Any]:
                return [x + 1 for x in xs]

            count = counter("aot_eager")
            compiled = torch.compile(fn, backend=count, fullgraph=True)
            own = []
            for call in range(2):
                meshes = [CMesh(f"{call}-{i}") for i in range(3)]
                outs = compiled(*(make(m) for m in meshes))
                own.append(all(o._mesh is m for o, m in zip(outs, meshes, strict=True)))
            seen[label] = {
                "python flatten calls per input": python_flatten_calls_per_input(fn.__code__),
                "compilations": count.frame_count,
                "each output on its call's mesh": own,
            }
    with fresh():

        class Replaced(CHandConstant):
            pass

        count = counter("aot_eager")
        compiled = torch.compile(lambda x: x + 1, backend=count, fullgraph=True)
        compiled(Replaced(torch.ones(2), CMesh("a"), None))
        Replaced.__tensor_flatten__ = lambda self: (["_data", "_mesh"], "v2")  # type: ignore[method-assign]
        with torch._dynamo.config.patch(error_on_recompile=False):
            out = compiled(Replaced(torch.ones(2), CMesh("b"), None))
        seen["method replaced"] = {
            "compilations": count.frame_count,
            "class guard failed": any("___check_constant_flatten_" in r for r in recompile_reasons()),
            "output": describe(out),
        }
    return seen


@entry("compile/tangents-ready-and-coerced/aot_eager")
def _tangents_ready_and_coerced() -> Observation:
    # A tangent that needs nothing from torch and one whose inner layout torch coerces: the
    # gradients (values, which mesh), and whether torch's per-tangent function ran for each.
    from scenarios import runs_of_torchs_tangent_function

    with fresh():
        compiled = torch.compile(lambda t: t * 2, backend="aot_eager", fullgraph=True)
        seen: dict[str, Any] = {}
        for label, inner in (("ready", torch.ones(3, 2)), ("coerced", torch.arange(6.0).reshape(2, 3).t())):
            m, tm = CMesh("x"), CMesh("tangent")
            x = CSharded(torch.arange(6.0).reshape(3, 2), m, "t", requires_grad=True)
            out, tangent = compiled(x), CSharded(inner, tm, "t")
            grads: list[Any] = []
            runs = runs_of_torchs_tangent_function(
                lambda o=out, i=x, t=tangent, g=grads: g.extend(torch.autograd.grad(o, i, t))
            )
            seen[label] = {
                "grad": describe(grads[0], {"input mesh": m, "tangent mesh": tm}),
                "torch's function ran": runs > 0,
            }
        return seen


# ---------------------------------------------------------------------------
# Graphs as normalised text.


def _graphs(fn: Callable[..., Any], make: Callable[[], tuple[Any, ...]], backward: bool = False) -> Observation:
    with fresh():
        graphs: list[list[str]] = []
        compiled = torch.compile(fn, backend=capturing_backend(graphs), fullgraph=True)
        out = compiled(*make())
        if backward:
            out.backward()
        return graphs


entry("graph/scale")(lambda: _graphs(lambda t: t * 2, lambda: (CSharded(torch.ones(3), CMesh("a"), "t"),)))
entry("graph/sum-backward")(
    lambda: _graphs(
        lambda t: (t * t).sum(), lambda: (CSharded(torch.ones(3), CMesh("a"), "t", requires_grad=True),), backward=True
    )
)
entry("graph/two-opaques")(
    lambda: _graphs(lambda t: t + 1, lambda: (CTwo(torch.ones(2), torch.ones(2), CMesh("a"), CStream(0)),))
)
entry("graph/custom-op")(
    lambda: _graphs(
        lambda t: torch.ops.conformance.name_length(t._data, t._mesh),
        lambda: (CSharded(torch.ones(2), CMesh("a"), "t"),),
    )
)
entry("graph/value-opaque-context")(
    lambda: _graphs(lambda t: t * 2, lambda: (CHand(torch.ones(2), CMesh("a"), CConfig(8)),))
)


# ---------------------------------------------------------------------------
# Members of opaques in compiled code.


def _members(fn: Callable[[Any], Any], factors: Sequence[int]) -> Observation:
    with fresh():
        count = counter("aot_eager")
        compiled = torch.compile(fn, backend=count, fullgraph=True)
        outs = [describe(compiled(CGaugeTensor(torch.ones(2), CGauge(f, offset=f + 1)))) for f in factors]
        return {"outs": outs, "compilations": count.frame_count, "reasons": recompile_reasons()}


entry("members/method-use-real")(lambda: _members(lambda t: t._data * t._gauge.factor(), (2, 2, 3)))
entry("members/attribute-use-real")(lambda: _members(lambda t: t._data + t._gauge.offset, (1, 4, 4)))
entry("members/inlined")(lambda: _members(lambda t: t._data * t._gauge.doubled(), (2, 3)))
entry("members/undeclared")(
    lambda: raised(
        lambda: _members(lambda t: t._data * t._gauge.other(), (2,)), "CGauge", "other", "_gauge", "members="
    )
)


@entry("compile_passes/member-recompile-reasons-translated")
def _member_reasons_translated() -> Observation:
    """compile_passes' translation of the recompile reasons of member guards:
    the same text on every release, though torch's raw reason for an attribute
    differs (object.__getattribute__(...) on 2.11 and 2.12)."""
    import compile_passes

    translated = []
    for fn in (lambda t: t._data * t._gauge.factor(), lambda t: t._data + t._gauge.offset):
        with fresh():
            report = compile_passes.explain(fn, CGaugeTensor(torch.ones(2), CGauge(2, offset=3)))
            report.call(CGaugeTensor(torch.ones(2), CGauge(5, offset=6)))
            translated += [r.reason for r in report.recompiles]
    return {"reasons": translated}


@entry("members/undeclared-eager")
def _undeclared_eager() -> Observation:
    return {"value": CGaugeTensor(torch.ones(1), CGauge(2))._gauge.other()}


def _group_program(fn: Callable[[Any], Any], sizes: Sequence[int]) -> Observation:
    import torch.distributed as dist

    class GroupT(OpaqueSubclass):
        tensor_attrs = ("_data",)
        opaque_attrs = {"_group": dist.ProcessGroup}

    with fake_world(8), fresh():
        count = counter("aot_eager")
        compiled = torch.compile(fn, backend=count, fullgraph=True)
        groups = {n: dist.new_group(list(range(n))) for n in sorted(set(sizes))}
        outs = [describe(compiled(GroupT(torch.ones(2), groups[n]))) for n in sizes]
        return {"outs": outs, "compilations": count.frame_count, "reasons": recompile_reasons()}


class CAmax:
    """Registered by the declaration below, with its members."""

    def __init__(self, scale: float) -> None:
        self._scale = scale

    def scale(self) -> float:
        return self._scale


class CScaled(OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_amax": opaque_subclass.OpaqueAttr(CAmax, members={"scale": Member.USE_REAL})}


@entry("members/declared-in-opaque-subclass")
def _declared_members() -> Observation:
    with fresh():
        count = counter("aot_eager")
        compiled = torch.compile(lambda t: t._data * t._amax.scale(), backend=count, fullgraph=True)
        outs = [describe(compiled(CScaled(torch.ones(2), CAmax(s)))) for s in (2.0, 2.0, 0.5)]
        return {"outs": outs, "compilations": count.frame_count, "reasons": recompile_reasons()}


entry("members/process-group-size")(lambda: _group_program(lambda t: t._data * t._group.size(), (4, 2, 2, 4)))
entry("members/process-group-rank")(lambda: _group_program(lambda t: t._data + t._group.rank(), (4, 2)))
entry("members/process-group-unused")(lambda: _group_program(lambda t: t._data * 2, (4, 2, 8)))


def _mesh_program(fn: Callable[[Any], Any], rank_lists: Sequence[Sequence[int]], world: int = 8) -> Observation:
    from torch.distributed.device_mesh import DeviceMesh

    class MeshT(OpaqueSubclass):
        tensor_attrs = ("_data",)
        opaque_attrs = {"_mesh": DeviceMesh}

    with fake_world(world), fresh():
        count = counter("aot_eager")
        compiled = torch.compile(fn, backend=count, fullgraph=True)
        outs = []
        for ranks in rank_lists:
            mesh = DeviceMesh("cpu", list(ranks))
            out = compiled(MeshT(torch.ones(2), mesh))
            outs.append(describe(out, {"input mesh": mesh}))
        return {"outs": outs, "compilations": count.frame_count}


entry("members/device-mesh-size")(
    lambda: _mesh_program(lambda t: t._data * t._mesh.size(), ([0, 1], [0, 1, 2, 3], [0, 1]))
)
entry("members/device-mesh-coordinate")(
    lambda: _mesh_program(lambda t: t._data + t._mesh.get_coordinate()[0], ([0, 1], [1, 0]))
)
entry("members/device-mesh-unused")(
    lambda: _mesh_program(
        lambda t: t._data * 2,
        [list(range(i, i + 2)) if i else [0, 1] for i in range(0, 8, 2)][:1] * 2 + [[0, 2], [0, 3]],
    )
)


entry("members/device-mesh-eight-rank-lists")(
    lambda: _mesh_program(lambda t: t._data * 2, [[0, i] for i in range(1, 8)] + [[1, 0]])
)


@entry("members/device-mesh-coordinate-below-dynamo")
def _mesh_read_below_dynamo() -> Observation:
    """A subclass's dispatch reads its mesh's coordinate while AOTAutograd
    traces: only the guard on the whole rank map protects the value compiled
    in (opaque_subclass.fixes.mesh_guards keeps it for such a mesh)."""
    from torch.distributed.device_mesh import DeviceMesh

    class CoordT(OpaqueSubclass):
        tensor_attrs = ("_data",)
        opaque_attrs = {"_mesh": DeviceMesh}

    @CoordT.implements(torch.ops.aten.mul.Tensor)
    def _mul(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        t = args[0]
        return CoordT(t._data * args[1] + t._mesh.get_coordinate()[0], t._mesh)

    def run() -> Observation:
        with fake_world(8), fresh():
            count = counter("aot_eager")
            compiled = torch.compile(lambda t: t * 2, backend=count, fullgraph=True)
            outs = [describe(compiled(CoordT(torch.zeros(2), DeviceMesh("cpu", r)))) for r in ([0, 1], [1, 0], [0, 2])]
            return {"outs": outs, "compilations": count.frame_count}

    try:
        return run()
    except Exception as e:  # torch 2.11: its fake mesh answers no member while AOTAutograd traces
        return error(e, "get_coordinate")


@entry("dtensor/share-compiles-runs-on-the-input-meshs-group")
def _dtensor_share_compiles() -> Observation:
    """DTensor compiled with inductor under opaque_subclass.dtensor.share_compiles:
    each call all-gathers on its own mesh's group (a mesh over other ranks, and
    one over the first one's ranks with its own group, which reuses the first
    graph); whether AOTAutograd's cache could take the graph at all."""
    from torch._dynamo.utils import counters
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    from opaque_subclass.dtensor import share_compiles
    from opaque_subclass.sharded import record_collectives

    def gathered(x: Any) -> Any:
        return (x + 1).redistribute(x.device_mesh, [Replicate()]).to_local()

    with fake_world(8), fresh(), share_compiles():
        counters.clear()
        count = counter("inductor")
        compiled = torch.compile(gathered, backend=count)
        own = []
        for ranks in ([0, 2, 4, 6], [0, 1, 3, 5], [0, 2, 4, 6]):
            mesh = DeviceMesh("cpu", ranks)
            with record_collectives() as seen:
                out = compiled(DTensor.from_local(torch.zeros(2, 2), mesh, [Shard(0)], run_check=False))
            own.append([r.group_name for r in seen] == [str(mesh.get_group().group_name)])
        bypassed = counters["aot_autograd"]["autograd_cache_bypass"] > 0
        # Replicate -> Shard picks this rank's chunk while tracing: refused where another rank could load it
        mesh = DeviceMesh("cpu", [1, 0, 2, 3])
        x = DTensor.from_local(torch.arange(8.0).reshape(4, 2), mesh, [Replicate()], run_check=False)
        try:
            chunk = torch.compile(lambda t: t.redistribute(mesh, [Shard(0)]).to_local() * 1)(x).tolist()
        except Exception as e:
            chunk = f"{type(e).__name__}: {str(e)[:60]}"
        return {
            "shape": list(out.shape),
            "each_call_on_its_own_group": own,
            "compilations": count.frame_count,
            "aot_cache_bypassed": bypassed,
            "rank_position_used": chunk,
        }


@entry("dtensor/share-compiles-job-of-two-ranks")
def _dtensor_share_compiles_job() -> Observation:
    """Two ranks of a simulated job (one process each, fake process group, one
    shared compile-cache directory) compile under share_compiles, with inductor,
    ``(t * 2).redistribute(t.device_mesh, [Shard(0)])`` of a Replicate DTensor
    (this rank's chunk, read from the real mesh: the output's spec comes from
    DTensor's sharding cache) and the rank-free ``(t * 2 + 1).to_local()``:
    per rank, whether each was refused or compiled right, and its AOTAutograd
    cache hits (pytorch/pytorch#188390's reproduction)."""
    from scenarios import shared_chunk_job

    def outcome(program: dict[str, Any]) -> str:
        if "refused" in program:
            return "ShareCompilesError: " + program["refused"][:60]
        return "right" if program["compiled"] == program["eager"] else f"WRONG: {program['compiled']}"

    return [
        {name: {"outcome": outcome(value[name]), "aot_hits": value[name]["aot_hits"]} for name in ("chunk", "free")}
        for value in shared_chunk_job()
    ]


@entry("dtensor/share-compiles-runs-on-a-group-input")
def _share_compiles_group_input() -> Observation:
    """A subclass whose ``__torch_dispatch__`` sums every result over its
    ``ProcessGroup`` attribute (a functional collective issued while AOTAutograd
    traces, its group a graph input), compiled with inductor under share_compiles
    and called with three groups (the third over the first one's ranks): the
    group each call's collective ran on, and the compilations."""
    import torch.distributed as dist
    from subclasses import SummedOverGroup as Summed

    from opaque_subclass.dtensor import share_compiles
    from opaque_subclass.sharded import record_collectives

    with fake_world(4), fresh(), share_compiles():
        count = counter("inductor")
        compiled = torch.compile(lambda t: (t * 2)._data, backend=count)
        own: list[Any] = []
        for ranks in ([0, 1], [0, 2, 3], [0, 1]):
            group = dist.new_group(ranks)
            with record_collectives() as seen:
                try:
                    compiled(Summed(torch.ones(2), group))
                except Exception as e:
                    own.append(type(e).__name__)
                    continue
            own.append([r.group_name for r in seen] == [str(group.group_name)])
        return {"each_call_on_its_own_group": own, "compilations": count.frame_count}


@entry("cache/entry-naming-a-group-served-per-rank")
def _entry_naming_a_group() -> Observation:
    """Three ranks of a 4-rank job (fake process groups, one cache directory,
    inductor) compile a program whose dispatch sums over the rank's group [0, 1]
    or [2, 3]: AOTAutograd's cache use per rank (rank 2 must not get rank 0's
    entry, whose graph names group '1'; rank 1 shares rank 0's group and gets it)."""
    from scenarios import no_rank_loads_another_groups_entry

    try:
        return {str(rank): use for rank, use in no_rank_loads_another_groups_entry().items()}
    except AssertionError as e:
        return {"AssertionError": str(e)[:120]}


opaque_subclass.register_opaque(torch.distributed.ProcessGroup)  # before a schema names it


@torch.library.custom_op("conformance::group_sum", mutates_args=())
def _group_sum(t: torch.Tensor, group: torch.distributed.ProcessGroup) -> torch.Tensor:
    import torch.distributed as dist

    out = t.clone()
    dist.all_reduce(out, group=group)
    return out + group.size()


@_group_sum.register_fake
def _(t: torch.Tensor, group: torch.distributed.ProcessGroup) -> torch.Tensor:
    return torch.empty_like(t)


entry("collectives/custom-op-takes-process-group")(
    lambda: _group_program(lambda t: torch.ops.conformance.group_sum(t._data, t._group), (4, 2, 4))
)


def _functional_all_reduce(t: Any) -> Any:
    import torch.distributed._functional_collectives as funcol

    return funcol.all_reduce(t._data * 2, "sum", t._group)


entry("collectives/functional-all-reduce")(lambda: _group_program(_functional_all_reduce, (4, 2, 4)))


@entry("collectives/process-group-in-context")
def _group_in_context() -> Observation:
    import torch.distributed as dist

    with fake_world(4), fresh():
        group = dist.new_group([0, 1])
        x = _MeshInContext(torch.ones(2), group, CConfig(8))
        return raised(
            lambda: torch.compile(lambda t: t * 2, backend="aot_eager", fullgraph=True)(x),
            "_MeshInContext",
            "ProcessGroup",
        )


@entry("compile_passes/osc005-collective-groups")
def _osc005() -> Observation:
    """OSC005 on torch's functional all_reduce (the group named by a constant)
    and not on the custom op that takes the group."""
    import torch.distributed as dist

    import compile_passes

    class GroupT(OpaqueSubclass):
        tensor_attrs = ("_data",)
        opaque_attrs = {"_group": dist.ProcessGroup}

    seen = {}
    with fake_world(4):
        group = dist.new_group([0, 1])
        for name, fn in (
            ("functional", _functional_all_reduce),
            ("custom-op", lambda t: torch.ops.conformance.group_sum(t._data, t._group)),
        ):
            with fresh():
                report = compile_passes.explain(fn, GroupT(torch.ones(2), group))
                seen[name] = [
                    (f.code, f.severity, "_c10d_functional.all_reduce" in f.message, "ranks [0, 1]" in f.message)
                    for f in report.findings
                ]
    return seen


class _GroupSummed(OpaqueSubclass):
    """All-reduces every result over its group in ``__torch_dispatch__`` (below Dynamo)."""

    tensor_attrs = ("_data",)
    opaque_attrs: dict[str, Any] = {}  # the ProcessGroup, set once fake_world registered it (_osc005_per_call)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        import torch.distributed._functional_collectives as funcol
        from torch.utils._pytree import tree_leaves, tree_map_only

        group = next(a for a in tree_leaves((args, kwargs)) if isinstance(a, cls))._group
        out = func(*tree_map_only(cls, lambda t: t._data, args), **tree_map_only(cls, lambda t: t._data, kwargs or {}))
        out = tree_map_only(torch.Tensor, lambda r: funcol.all_reduce(r, "sum", group), out)
        return tree_map_only(torch.Tensor, lambda r: cls(_data=r, _group=group), out)


@entry("compile_passes/osc005-one-finding-per-call-and-its-guard")
def _osc005_per_call() -> Observation:
    """#36 item 4: a collective on a group attribute, compiled for two groups:
    in the compiled function (``dist.all_reduce(x, group=t._group)``: Dynamo
    guards the group's name, two compilations, one finding naming both
    groups) and below Dynamo (a ``__torch_dispatch__`` reducing over the
    input's group: nothing guards it, one compilation, an error finding)."""
    import torch.distributed as dist

    import compile_passes

    def in_place(t: Any) -> Any:
        x = t._data.clone()
        dist.all_reduce(x, group=t._group)
        return x

    seen: dict[str, Any] = {}
    with fake_world(4):

        class GroupT(OpaqueSubclass):
            tensor_attrs = ("_data",)
            opaque_attrs = {"_group": dist.ProcessGroup}

        class Summed(_GroupSummed):
            opaque_attrs = {"_group": dist.ProcessGroup}

        groups = dist.new_group([0, 1]), dist.new_group([0, 2, 3])
        for name, fn, cls in (("dynamo", in_place, GroupT), ("below-dynamo", lambda t: (t * 2)._data, Summed)):
            with fresh():
                report = compile_passes.explain(fn, cls(_data=torch.ones(2), _group=groups[0]))
                report.call(cls(_data=torch.ones(2), _group=groups[1]))
                seen[name] = {
                    "graphs": len(report.graphs),
                    "errors": [e.split(":")[0] for e in report.errors],
                    "findings": [
                        (
                            f.code,
                            f.severity,
                            f.path,
                            sum(repr(g.group_name) in f.message for g in groups),
                            "Dynamo guards its name" in f.message,
                            "nothing guards it" in f.message,
                        )
                        for f in report.findings
                    ],
                }
    return seen


_DECLARE_PROGRAM = """
import opaque_subclass, torch.distributed as dist
from opaque_subclass import OpaqueSubclass
class GroupT(OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_group": dist.ProcessGroup}
print(opaque_subclass.opaque_kind(dist.ProcessGroup))
"""


@entry("collectives/declare-process-group-first")
def _declare_first() -> Observation:
    """``opaque_attrs = {"_g": ProcessGroup}`` in a fresh process, before
    anything registers ProcessGroup."""
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", _DECLARE_PROGRAM], capture_output=True, text=True, timeout=300, check=False
    )
    last = proc.stderr.strip().splitlines()[-1:] if proc.returncode else []
    return {"exit": proc.returncode, "printed": proc.stdout.strip(), "error": normalise(last[0]) if last else None}


# ---------------------------------------------------------------------------
# Errors: exception types and what their messages name.


def _compile_error(fn: Callable[..., Any], *args: Any, names: Sequence[str]) -> Observation:
    with fresh():
        return raised(lambda: torch.compile(fn, backend="aot_eager", fullgraph=True)(*args), *names)


class _Unregistered(torch.Tensor):
    @staticmethod
    def __new__(cls, data: torch.Tensor) -> Any:
        r = torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype)
        r._data, r._h = data, CUnregistered()
        return r

    def __init__(self, data: torch.Tensor) -> None:
        pass

    def __repr__(self) -> str:
        return "_Unregistered"

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["_data", "_h"], None

    @classmethod
    def __tensor_unflatten__(cls, inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        return cls(inner["_data"])

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torch.utils._pytree import tree_map_only

        return func(*tree_map_only(cls, lambda t: t._data, args), **tree_map_only(cls, lambda t: t._data, kwargs or {}))


class _MeshInContext(CHand):
    """The classic mistake: a reference opaque kept in the flatten context."""

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["_data"], (self._mesh, self._config)

    @classmethod
    def __tensor_unflatten__(cls, inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        return cls(inner["_data"], ctx[0], ctx[1])


entry("errors/unregistered-opaque-compiled")(
    lambda: _compile_error(
        lambda t: t * 2, _Unregistered(torch.ones(2)), names=("_Unregistered", "_h", "CUnregistered")
    )
)
entry("errors/unregistered-opaque-flatten-api")(
    lambda: raised(
        lambda: opaque_subclass.flatten_subclass(_Unregistered(torch.ones(2))), "_Unregistered", "_h", "CUnregistered"
    )
)
entry("errors/reference-opaque-in-context-compiled")(
    lambda: _compile_error(
        lambda t: t * 2, _MeshInContext(torch.ones(2), CMesh("a"), CConfig(8)), names=("_MeshInContext", "CMesh")
    )
)


@entry("errors/opaque-subclass-unregistered-declaration")
def _bad_declaration() -> Observation:
    def declare() -> type:
        class Bad(OpaqueSubclass):
            tensor_attrs = ("_data",)
            opaque_attrs = {"_h": CUnregistered}

        return Bad

    return raised(declare, "Bad", "_h", "CUnregistered", "register_opaque")


@entry("errors/opaque-subclass-value-in-opaque-attrs")
def _value_declaration() -> Observation:
    def declare() -> type:
        class BadValue(OpaqueSubclass):
            tensor_attrs = ("_data",)
            opaque_attrs = {"_c": CConfig}

        return BadValue

    return raised(declare, "BadValue", "_c", "CConfig", "meta_attrs")


@entry("errors/opaque-subclass-wrong-opaque-type")
def _wrong_type() -> Observation:
    return raised(lambda: CSharded(torch.ones(2), CStream(0), "t"), "CSharded", "_mesh", "CStream")


@entry("errors/mixed-meshes")
def _mixed() -> Observation:
    return raised(
        lambda: CSharded(torch.ones(2), CMesh("a"), "t") + CSharded(torch.ones(2), CMesh("b"), "t"), "CSharded"
    )


@entry("errors/export-unflatten-returns-another-type")
def _export_wrong_unflatten() -> Observation:
    class CReturnsInner(CSharded):
        @classmethod
        def __tensor_unflatten__(cls, inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
            return inner["_data"]

    class Double(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    x = CReturnsInner(torch.ones(2), CMesh("a"), "t")
    return raised(lambda: torch.export.export(Double(), (x,), strict=False), "CReturnsInner", "L['x']", "torch.Tensor")


@entry("errors/parametrization-deleted-opaque-leaf")
def _deleted_opaque_leaf() -> Observation:
    """``module.w`` after ``del module.parametrizations.w.original1`` (the opaque
    leaf), eager and under torch.compile: the library's error, not the property
    reported missing."""
    model = opaque_subclass.unwrap_subclass_parameters(CScale(CMesh("w")))
    del model.parametrizations.w.original1
    names = ("CSharded", "module.parametrizations.w.original1", "w._mesh", "CMesh", "found: nothing")
    eager = raised(lambda: model.w, *names)
    with fresh():
        compiled = torch.compile(model, backend="aot_eager")
        under_compile = raised(lambda: compiled(torch.ones(3)), *names)
    return {"eager": eager, "compiled": under_compile}


@entry("errors/register-value-without-eq")
def _value_without_eq() -> Observation:
    class NoEq:
        pass

    return raised(lambda: opaque_subclass.register_opaque(NoEq, kind="value"), "NoEq", "__eq__", "__hash__")


@entry("errors/register-bad-kind")
def _bad_kind() -> Observation:
    class K:
        pass

    return raised(lambda: opaque_subclass.register_opaque(K, kind="weird"), "K", "weird")


@entry("errors/register-bad-member")
def _bad_member() -> Observation:
    class K2:
        pass

    return raised(lambda: opaque_subclass.register_opaque(K2, members={"size": "sometimes"}), "K2", "size", "sometimes")


@entry("errors/unflatten-wrong-width")
def _unflatten_width() -> Observation:
    leaves, spec = opaque_subclass.flatten_subclass(CSharded(torch.ones(2), CMesh("a"), "t"))
    return raised(lambda: opaque_subclass.unflatten_subclass(leaves[:1], spec), "CSharded")


@entry("errors/unflatten-non-opaque-in-slot")
def _unflatten_slot() -> Observation:
    leaves, spec = opaque_subclass.flatten_subclass(CSharded(torch.ones(2), CMesh("a"), "t"))
    return raised(
        lambda: describe(opaque_subclass.unflatten_subclass([leaves[0], "not a mesh"], spec)),
        "CSharded",
        "_mesh",
        "str",
    )


@entry("errors/export-load-without-opaques")
def _load_without() -> Observation:
    import opaque_subclass.export

    ep = torch.export.export(CScale(CMesh("saver")), (torch.ones(3),), strict=False)
    buffer = io.BytesIO()
    opaque_subclass.export.save(ep, buffer)
    buffer.seek(0)
    return raised(lambda: opaque_subclass.export.load(buffer), "w._mesh", "opaques=")


# ---------------------------------------------------------------------------
# The version-stable API.


@entry("api/flatten-subclass")
def _api_flatten() -> Observation:
    m = CMesh("a")
    leaves, spec = opaque_subclass.flatten_subclass(CSharded(torch.arange(2.0), m, "t"))
    return {"leaves": describe(leaves, {"mesh": m}), "spec": type(spec).__name__}


@entry("api/round-trip")
def _api_round_trip() -> Observation:
    m, s = CMesh("a"), CStream(1)
    x = CNested(CSharded(torch.arange(2.0), m, "in"), s)
    leaves, spec = opaque_subclass.flatten_subclass(x)
    return describe(opaque_subclass.unflatten_subclass(leaves, spec), {"mesh": m, "stream": s})


@entry("api/describe-args")
def _api_meta() -> Observation:
    metas = opaque_subclass.describe_args([torch.ones(1), CTwo(torch.ones(2), torch.ones(2), CMesh("a"), CStream(0))])
    out = []
    for meta in metas:
        if isinstance(meta, opaque_subclass.SubclassLayout):
            slots = [
                (path, type(slot).__name__, getattr(slot, "index", None))
                for path, slot in opaque_subclass.iter_slots(meta)
            ]
            out.append({"subclass": meta.subclass_type.__name__, "slots": slots})
        else:
            out.append(type(meta).__name__)
    return out


@entry("api/unwrap-wrap")
def _api_unwrap_wrap() -> Observation:
    m = CMesh("a")
    args = [torch.ones(1), CSharded(torch.arange(2.0), m, "t")]
    metas = opaque_subclass.describe_args(args)
    flat = opaque_subclass.unwrap_args(args, is_joint_structure=False)
    back = opaque_subclass.wrap_args(flat, subclass_metas=metas)
    return {"flat": describe(flat, {"mesh": m}), "back": describe(back, {"mesh": m})}


@entry("api/opaque-kind")
def _api_kind() -> Observation:
    return {
        name: opaque_subclass.opaque_kind(cls)
        for name, cls in (
            ("CMesh", CMesh),
            ("CConfig", CConfig),
            ("CForeign", CForeign),
            ("CUnregistered", CUnregistered),
        )
    }


@entry("api/enum-is-value-opaque")
def _api_enum() -> Observation:
    return {"kind": opaque_subclass.opaque_kind(CColor)}


@entry("api/is-opaque")
def _api_is_opaque() -> Observation:
    return [opaque_subclass.is_opaque(v) for v in (CMesh("a"), CConfig(1), CForeign("f"), CUnregistered(), 3, None)]


@entry("api/foreign-isinstance-in-compiled-code")
def _foreign_isinstance() -> Observation:
    with fresh():
        compiled = torch.compile(
            lambda x, h: x + 1 if isinstance(h, CForeign) else x - 1, backend="eager", fullgraph=True
        )
        return describe(compiled(torch.zeros(1), CForeign("f")))


_TORCH_CLASSES_PROGRAM = """
import torch, opaque_subclass as osc, torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
after_import = [osc.opaque_kind(dist.ProcessGroup), osc.opaque_kind(DeviceMesh)]
import torch.distributed.tensor
after_dtensor = [osc.opaque_kind(dist.ProcessGroup), osc.opaque_kind(DeviceMesh)]
print(after_import, after_dtensor)
"""


@entry("api/torch-classes-registration-moment")
def _torch_classes_moment() -> Observation:
    """When ProcessGroup and DeviceMesh are registered, in a fresh process:
    after ``import torch, opaque_subclass``, then after importing
    ``torch.distributed.tensor`` (nothing of the library names them)."""
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", _TORCH_CLASSES_PROGRAM], capture_output=True, text=True, timeout=300, check=False
    )
    return {"exit": proc.returncode, "printed": proc.stdout.strip()}


@entry("api/support")
def _api_support() -> Observation:
    s = opaque_subclass.support()
    return {"enabled": bool(s), "mode": s.mode in ("backport", "native")}


# ---------------------------------------------------------------------------
# Export round trips.


@entry("export/parameter/non-strict")
def _export_param() -> Observation:
    m = CMesh("w")
    ep = torch.export.export(CScale(m), (torch.ones(3),), strict=False)
    return describe(ep.module()(torch.ones(3)), {"mesh": m})


@entry("export/parameter/strict")
def _export_param_strict() -> Observation:
    m = CMesh("w")
    ep = torch.export.export(CScale(m), (torch.ones(3),), strict=True)
    return describe(ep.module()(torch.ones(3)), {"mesh": m})


@entry("export/input/non-strict")
def _export_input() -> Observation:
    ep = torch.export.export(CAffine(), (CSharded(torch.ones(3), CMesh("trace"), "t"),), strict=False)
    run = CMesh("run")
    return describe(ep.module()(CSharded(torch.arange(3.0), run, "t")), {"runtime mesh": run})


@entry("export/graph")
def _export_graph() -> Observation:
    ep = torch.export.export(CAffine(), (CSharded(torch.ones(3), CMesh("trace"), "t"),), strict=False)
    return [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]


@entry("export/save-load")
def _export_save_load() -> Observation:
    import opaque_subclass.export

    ep = torch.export.export(CScale(CMesh("saver")), (torch.ones(3),), strict=False)
    buffer = io.BytesIO()
    manifest = opaque_subclass.export.save(ep, buffer)
    buffer.seek(0)
    loader = CMesh("loader")
    loaded = opaque_subclass.export.load(buffer, opaques={"w._mesh": loader})
    return {
        "manifest": normalise(manifest.describe()),
        "out": describe(loaded.module()(torch.ones(3)), {"loader mesh": loader}),
        "param": describe(loaded.state_dict["w"], {"loader mesh": loader}),
    }


@entry("export/unwrap-parameters-save-load")
def _export_unwrapped() -> Observation:
    import opaque_subclass.export

    model = opaque_subclass.unwrap_subclass_parameters(CScale(CMesh("saver")))
    ep = torch.export.export(model, (torch.ones(3),), strict=False)
    buffer = io.BytesIO()
    opaque_subclass.export.save(ep, buffer)
    buffer.seek(0)
    loader = CMesh("loader")
    loaded = opaque_subclass.export.load(buffer, opaques={"w._mesh": loader})
    return describe(loaded.module()(torch.ones(3)), {"loader mesh": loader})


@entry("export/torch-save-direct")
def _export_torch_save() -> Observation:
    ep = torch.export.export(CScale(CMesh("saver")), (torch.ones(3),), strict=False)
    return raised(lambda: torch.export.save(ep, io.BytesIO()), "opaque_subclass.export.save")


# ---------------------------------------------------------------------------
# Parametrizations and modules.


@entry("modules/unwrap-parameters-compiled")
def _unwrap_params_compiled() -> Observation:
    m = CMesh("w")
    model = opaque_subclass.unwrap_subclass_parameters(CScale(m))
    with fresh():
        count = counter("aot_eager")
        out = torch.compile(model, backend=count, fullgraph=True)(torch.ones(3))
        return {
            "out": describe(out, {"mesh": m}),
            "params": sorted(name for name, _ in model.named_parameters()),
            "compilations": count.frame_count,
        }


@entry("modules/untyped-storages")
def _storages() -> Observation:
    x = CTwo(torch.ones(2), torch.ones(3), CMesh("a"), CStream(0))
    return sorted(s.nbytes() for s in opaque_subclass.untyped_storages(x))


@entry("modules/training-step")
def _training_step() -> Observation:
    m = CMesh("w")
    model = CScale(m)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with fresh():
        step = torch.compile(lambda x: model(x).sum(), backend="aot_eager", fullgraph=True)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = step(torch.ones(3))
            loss.backward()
            opt.step()
            losses.append(round(float(loss), 4))
        return {"losses": losses, "param": describe(model.w, {"mesh": m})}


# ---------------------------------------------------------------------------
# Threads.


@entry("threads/compile-and-call")
def _threads() -> Observation:
    with fresh():
        compiled = torch.compile(lambda t: t * 2, backend="aot_eager", fullgraph=True)
        compiled(CSharded(torch.ones(2), CMesh("warm"), "t"))
        results: dict[int, bool] = {}

        def work(i: int) -> None:
            m = CMesh(str(i))
            out = compiled(CSharded(torch.ones(2) * i, m, "t"))
            results[i] = out._mesh is m and torch.equal(out._data, torch.ones(2) * 2 * i)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return [results.get(i) for i in range(4)]


_THREAD_EXIT_PROGRAM = """
import threading, torch
def compile_once():
    torch._dynamo.reset()
    x = torch.ones(2, requires_grad=True)
    torch.compile(lambda t: (t * 2).sum(), backend="aot_eager", fullgraph=True)(x).backward()
for _ in range(3):
    t = threading.Thread(target=compile_once)
    t.start()
    t.join()
print("done")
"""


@entry("threads/compile-after-thread-exit")
def _compile_after_thread_exit() -> Observation:
    """A thread compiles after another compiling thread has exited (torch alone,
    in a child process: a crash there is the observation)."""
    import subprocess

    # a new interpreter, not a served one: torch 2.11's crash (listed) needs one
    proc = subprocess.run(
        [sys.executable, "-c", _THREAD_EXIT_PROGRAM], capture_output=True, text=True, timeout=300, check=False
    )
    completed = proc.stdout.strip() == "done"
    # Whether the program ran to its end; a crash during it is named. (torch
    # 2.12's CUDA build may also abort at interpreter exit, after "done", in
    # some runs: a listed limit, not observed here since it is not repeatable.)
    return {"completed": completed, "crash": None if completed else _exit_name(proc.returncode)}


def _exit_name(code: int) -> str:
    import signal

    return signal.Signals(-code).name if code < 0 else f"exit {code}"


# ---------------------------------------------------------------------------
# Beside another package that patches the same torch function (tests/other_patchers).

_OTHER_PATCHER_PROGRAM = """
import json, sys
FIRST = sys.argv[1] == "first"
if FIRST:
    import other_patchers.wrapping
import opaque_subclass
import other_patchers.wrapping
import torch._dynamo
from torch._functorch._aot_autograd.runtime_wrappers import AOTDispatchAutograd
from opaque_subclass.patching import _wrapped_functions
from opaque_subclass.releases import current

def chain():
    top = AOTDispatchAutograd.__dict__["process_runtime_tangent"].__func__
    names = {"opaque_subclass": "library", "other_patchers": "other", "torch": "torch"}
    return [names[f.__module__.split(".")[0]] for f in (top, *_wrapped_functions(top, depth=4))
            if f.__module__.split(".")[0] in names and f.__name__.endswith("process_runtime_tangent")]

def state(s):
    return {"all rows on": len(s.patched) + len(s.fixes) == len(current().patches) + len(current().fixes),
            "problem": s.problem, "others": list(s.others)}

on = state(opaque_subclass.support()); on["chain"] = chain()
off = state(opaque_subclass.disable()); off["chain"] = chain()
again = state(opaque_subclass.enable()); again["chain"] = chain()
print(json.dumps({"on": on, "off": off, "on again": again}))
"""


@entry("patching/another-package-wraps-a-patched-function")
def _another_package() -> Observation:
    """A package that wraps AOTAutograd's ``process_runtime_tangent`` (patched by the
    library on every release), imported before and after the library, in child
    processes: what runs, what ``support()`` says, what ``disable()`` leaves."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")])}
    seen = {}
    for order in ("first", "after"):
        proc = warm.run([sys.executable, "-c", _OTHER_PATCHER_PROGRAM, order], timeout=300, env=env)
        lines = proc.stdout.strip().splitlines()
        seen[f"imported {order}"] = json.loads(lines[-1]) if proc.returncode == 0 and lines else proc.stderr[-300:]
    return seen


# ---------------------------------------------------------------------------
# DTensor and ShardedTensor on fake process groups of 8 - 64 ranks.


def _dtensor_meshes(world: int, n_meshes: int) -> Observation:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    with fake_world(world), fresh():
        count = counter("aot_eager")
        compiled = torch.compile(lambda t: t * 2, backend=count, fullgraph=True)
        stale = 0
        placements = set()
        for _ in range(n_meshes):
            mesh = DeviceMesh.from_group(dist.new_group(list(range(world))), "cpu")
            x = distribute_tensor(torch.ones(4), mesh, [Replicate()])
            out = compiled(x)
            stale += out.device_mesh is not mesh
            placements.add(str(out.placements))
        return {"stale": stale, "placements": sorted(placements), "compilations": count.frame_count}


entry("dtensor/runtime-mesh/8-ranks")(lambda: _dtensor_meshes(8, 4))
entry("dtensor/runtime-mesh/64-ranks")(lambda: _dtensor_meshes(64, 4))


@entry("dtensor/runtime-mesh/second-program")
def _dtensor_second_program() -> Observation:
    """The program above run twice, each on its own fake process group: the
    second's observation. While the second is traced, DTensor's sharding cache
    (keyed by mesh equality) holds the first program's mesh."""
    _dtensor_meshes(8, 4)
    return _dtensor_meshes(8, 4)


def _dtensor_program(world: int, fn: Callable[[Any], Any], placement: str) -> Observation:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    with fake_world(world), fresh():
        mesh = init_device_mesh("cpu", (world,))
        count = counter("aot_eager")
        compiled = torch.compile(fn, backend=count, fullgraph=True)
        x = distribute_tensor(torch.arange(float(world * 2)), mesh, [Shard(0) if placement == "shard" else Replicate()])
        out = compiled(x)
        return {
            "out": {
                "placements": [str(p) for p in out.placements],
                "shape": list(out.shape),
                "mesh": out.device_mesh is mesh,
            },
            "compilations": count.frame_count,
        }


entry("dtensor/elementwise/16-ranks")(lambda: _dtensor_program(16, lambda t: t * 2 + 1, "shard"))


def _replicate(t: Any) -> Any:
    from torch.distributed.tensor import Replicate

    return t.redistribute(t.device_mesh, [Replicate()])


def _local_round_trip(t: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(t.to_local() * 3, t.device_mesh, t.placements)


@entry("dtensor/from-local-mesh-argument/8-ranks")
def _from_local_mesh_argument() -> Observation:
    """``DTensor.from_local(local, mesh, ...)`` with the mesh passed as an
    argument (not read from a DTensor), called with two equal meshes."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate

    with fake_world(8), fresh():
        count = counter("aot_eager")
        compiled = torch.compile(
            lambda x, mesh: DTensor.from_local(x * 2, mesh, [Replicate()]), backend=count, fullgraph=True
        )
        outs = []
        for _ in range(2):
            mesh = DeviceMesh.from_group(dist.new_group(list(range(8))), "cpu")
            out = compiled(torch.ones(2), mesh)
            outs.append({"mesh is the argument": out.device_mesh is mesh, "local": _values(out.to_local())})
        return {"outs": outs, "compilations": count.frame_count}


entry("dtensor/redistribute/8-ranks")(lambda: _dtensor_program(8, _replicate, "shard"))
entry("dtensor/to-local-from-local/32-ranks")(lambda: _dtensor_program(32, _local_round_trip, "shard"))


def _sharded_meshes(world: int, sizes: Sequence[int], fn: Callable[[Any], Any]) -> Observation:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from opaque_subclass.sharded import ShardedTensor

    with fake_world(world), fresh():
        count = counter("aot_eager")
        compiled = torch.compile(fn, backend=count, fullgraph=True)
        outs = []
        for n in sizes:
            mesh = DeviceMesh.from_group(dist.new_group(list(range(n))), "cpu")
            x = ShardedTensor.from_full(torch.arange(float(n * 2)), mesh, 0)
            out = compiled(x)
            outs.append({"shape": list(out.shape), "mesh is input's": out._mesh is mesh, "placement": out.shard_dim})
        return {"outs": outs, "compilations": count.frame_count}


entry("sharded/elementwise/8-ranks")(lambda: _sharded_meshes(8, (8, 8, 8), lambda t: t * 2))
entry("sharded/elementwise/64-ranks")(lambda: _sharded_meshes(64, (64, 64), lambda t: t * 2 + 1))
entry("sharded/redistribute/16-ranks")(lambda: _sharded_meshes(16, (16, 16), lambda t: t.redistribute(None)))


# ---------------------------------------------------------------------------
# What torch's own tests look at, as stock torch gives it with the library
# imported (#38: torch's test files run stock and with the library by
# tools/torch_tests.py; docs/compatibility.md). Error classes and first
# sentences that tests match, and the graph inputs of compiled programs, named.


class CBin(OpaqueBase):
    """A reference opaque whose attribute ``shelved`` (declared ``USE_REAL``)
    holds other opaques: one, or a list of them."""

    def __init__(self, shelved: Any) -> None:
        self.shelved = shelved


opaque_subclass.register_opaque(CBin, members={"shelved": Member.USE_REAL})


class _ListsWhatItHolds(CHand):
    """A hand-written subclass listing ``_config`` (whatever it holds) with its tensors."""

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["_data", "_config"], None

    @classmethod
    def __tensor_unflatten__(cls, inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        return cls(inner["_data"], None, inner["_config"])


def _as_torch_raises(run: Callable[[], object], sentence: str, *classes: type) -> Observation:
    """The exception ``run`` raises: its type, which of torch's ``classes`` it
    is an instance of (what ``assertRaises`` checks), and whether its message
    starts with torch's ``sentence`` (what ``assertRaisesRegex`` matches)."""
    with fresh():
        try:
            run()
        except Exception as e:
            return {
                "raised": type(e).__name__,
                "torch's classes": [c.__name__ for c in classes if isinstance(e, c)],
                "torch's sentence first": str(e).startswith(sentence),
            }
    return {"raised": None}


def _listed_in_tensor_attrs(held: object) -> Observation:
    name = type(held).__name__
    return _as_torch_raises(
        lambda: torch.compile(lambda t: t + 1, backend="eager", fullgraph=True)(
            _ListsWhatItHolds(torch.ones(2), None, held)
        ),
        f"'{name}' found in tensor attrs of _ListsWhatItHolds.__tensor_flatten__(). Only tensors and "
        "reference-type opaques are allowed in tensor attrs.",
        RuntimeError,
    )


entry("torch-parity/value-opaque-in-tensor-attrs-error")(lambda: _listed_in_tensor_attrs(CConfig(8)))
entry("torch-parity/builtin-in-tensor-attrs-error")(lambda: _listed_in_tensor_attrs(7))


@entry("torch-parity/undeclared-member-error")
def _undeclared_member_as_torch() -> Observation:
    """Compiled without ``fullgraph``, as a graph break would allow."""
    return _as_torch_raises(
        lambda: torch.compile(lambda t: t._data * t._gauge.other(), backend="eager")(
            CGaugeTensor(torch.ones(2), CGauge(3))
        ),
        "Attempted to access unregistered member on an OpaqueObject",
        RuntimeError,
        torch._dynamo.exc.UnsafeScriptObjectError,
    )


def _input_names(fn: Callable[..., Any], *args: Any) -> Observation:
    """The placeholders of the graph Dynamo builds for ``fn``, by name, in order."""
    graphs: list[list[str]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append([n.name for n in gm.graph.nodes if n.op == "placeholder"])
        return gm.forward

    with fresh():
        out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return {"inputs": graphs, "out": describe(out)}


def _one_shelved(b: CBin, x: torch.Tensor) -> torch.Tensor:
    mesh = b.shelved  # read before x is used: Dynamo makes it a graph input where the code first uses it
    y = x * 3
    return torch.ops.conformance.name_length(y, mesh)


def _each_shelved(b: CBin, x: torch.Tensor) -> torch.Tensor:
    for mesh in b.shelved:
        x = torch.ops.conformance.name_length(x, mesh)
    return x


entry("torch-parity/graph-inputs-of-an-opaque-attribute")(
    lambda: _input_names(_one_shelved, CBin(CMesh("ab")), torch.ones(2))
)
entry("torch-parity/graph-inputs-of-a-list-of-opaques-attribute")(
    lambda: _input_names(_each_shelved, CBin([CMesh("a"), CMesh("bcd")]), torch.ones(2))
)


# ---------------------------------------------------------------------------
# Upstream's own bugs (docs/compatibility.md, "Upstream's own bugs in this feature"): one entry each.


def _returned(value: object) -> str:
    """A value opaque returned by compiled code: its repr, or the type torch put in its place
    (torch's fake wrapper passes ``isinstance``, so the exact type is compared)."""
    return repr(value) if type(value) is CConfig else type(value).__name__


@entry("upstream/193190-value-opaque-beside-subclass-output")
def _value_opaque_beside_subclass_output() -> Observation:
    """pytorch/pytorch#193190: ``f(x) = (x * 2, CConfig(7))`` with ``x`` a
    subclass, compiled with inductor, then compiled again in the same process
    from AOTAutograd's and inductor's caches (Dynamo reset, inductor's loaded
    modules forgotten, one fresh cache directory). Each time: the subclass
    output, what was returned beside it, and whether the cache served it."""
    from torch._dynamo.utils import counters
    from torch._inductor.codecache import PyCodeCache
    from torch._inductor.utils import fresh_cache

    def fn(x: Any) -> Any:
        return x * 2, CConfig(7)

    seen = []
    with fresh_cache():
        for _ in range(2):
            with fresh():
                counters.clear()
                PyCodeCache.cache_clear()  # the second compilation loads the graph from the disk cache
                mesh = CMesh("a")
                try:
                    out, config = torch.compile(fn, backend="inductor", fullgraph=True)(
                        CSharded(torch.ones(2), mesh, "t")
                    )
                except Exception as e:  # the observation is the exception
                    seen.append(error(e))
                    continue
                seen.append(
                    {
                        "out": describe(out, {"input mesh": mesh}),
                        "returned": _returned(config),
                        "served from cache": counters["aot_autograd"]["autograd_cache_hit"] > 0,
                    }
                )
    return seen


@entry("upstream/176044-reference-opaque-made-while-tracing")
def _reference_opaque_made_while_tracing() -> Observation:
    """pytorch/pytorch#176044: ``x * y`` of two subclasses whose
    ``__torch_dispatch__`` passes a fresh ``Tally`` to a custom op, three
    calls, eager then compiled (tests/upstream_scenarios.py's fixtures). torch
    alone compiles the trace's one Tally in (2, 4, 6 where eager gives 2, 2,
    2); the library refuses it by name."""
    from upstream_scenarios import Tallied

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y

    def args() -> tuple[Tallied, Tallied]:
        return Tallied(torch.ones(2)), Tallied(torch.full((2,), 2.0))

    eager = [_values(fn(*args())._data) for _ in range(3)]
    with fresh():
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        try:
            outs: Any = [_values(compiled(*args())._data) for _ in range(3)]
        except Exception as e:  # the observation is the exception
            outs = error(e, "Tally", "pytorch/pytorch#176044")
        return {"eager": eager, "compiled": outs}


class CQuantizer(OpaqueBase):
    """A value opaque that is also callable (a quantizer applied to a tensor)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def factor(self) -> int:
        return self.k

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return t * self.k

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CQuantizer) and other.k == self.k

    def __hash__(self) -> int:
        return hash(self.k)

    def __fx_repr__(self) -> tuple[str, dict[str, type]]:
        return f"CQuantizer({self.k})", {"CQuantizer": CQuantizer}

    def __repr__(self) -> str:
        return f"CQuantizer({self.k})"


opaque_subclass.register_opaque(CQuantizer, kind="value", members={"factor": Member.USE_REAL})


@entry("upstream/188796-callable-value-opaque-on-intermediate")
def _callable_value_opaque_on_intermediate() -> Observation:
    """pytorch/pytorch#188796: a method of a callable value opaque (``CHand``'s
    context) read off a subclass tensor made inside the compiled region, and
    the opaque itself called on it, each with ``fullgraph=True``: one graph
    each (torch 2.11 - 2.14 alone: a graph break)."""

    def method(t: torch.Tensor) -> torch.Tensor:
        y = t + 1
        return y * y._config.factor()

    def call(t: torch.Tensor) -> torch.Tensor:
        y = t + 1
        return y._config(y)

    seen = {}
    for name, fn in (("method", method), ("call", call)):
        with fresh():
            count = counter("aot_eager")
            m = CMesh("a")
            try:
                out = torch.compile(fn, backend=count, fullgraph=True)(CHand(torch.arange(3.0), m, CQuantizer(3)))
                seen[name] = {"out": describe(out, {"input mesh": m}), "compilations": count.frame_count}
            except Exception as e:  # the observation is the exception
                seen[name] = {"error": error(e), "compilations": count.frame_count}
    return seen


@entry("upstream/175667-compiled-autograd-remaps-backward-opaques")
def _compiled_autograd_remaps_backward_opaques() -> Observation:
    """pytorch/pytorch#175667's known gap: compiled autograd must give each call's
    backward that call's opaques (the saved input's mesh, the tangent's), not the
    first call's. ``(t * t).sum()`` and ``t * 3`` with a tangent on its own mesh,
    compiled with aot_eager, backward under compiled autograd, two calls on other
    meshes: the gradients' meshes and the compiled-autograd graphs."""
    import torch._dynamo.compiled_autograd as ca

    seen: dict[str, Any] = {}
    with fresh():
        compiled = torch.compile(lambda t: (t * t).sum(), backend="aot_eager", fullgraph=True)
        backward = counter("aot_eager")
        calls = []
        for name in ("a", "b"):
            m = CMesh(name)
            x = CSharded(torch.arange(3.0), m, "t", requires_grad=True)
            out = compiled(x)
            with ca._enable(torch.compile(backend=backward)):
                out.backward()
            calls.append(describe(x.grad, {"input mesh": m}))
        seen["saved input"] = {"grads": calls, "backward compilations": backward.frame_count}
    with fresh():
        compiled = torch.compile(lambda t: t * 3, backend="aot_eager", fullgraph=True)
        backward = counter("aot_eager")
        calls = []
        for name in ("a", "b"):
            m, tm = CMesh(name), CMesh("tangent " + name)
            x = CSharded(torch.arange(3.0), m, "t", requires_grad=True)
            out = compiled(x)
            with ca._enable(torch.compile(backend=backward)):
                out.backward(CSharded(torch.ones(3), tm, "t"))
            calls.append(describe(x.grad, {"input mesh": m, "tangent mesh": tm}))
        seen["tangent"] = {"grads": calls, "backward compilations": backward.frame_count}
    return seen


@entry("upstream/193418-set-context-keys-alike")
def _set_context_keys_alike() -> Observation:
    """pytorch/pytorch#193418: ``t * 2`` of a hand-written subclass (``CHand``) whose flatten
    context is a frozenset, compiled with inductor twice in one fresh cache directory (Dynamo
    reset between), the second time for an equal frozenset that iterates in another order:
    the outputs, and whether AOTAutograd's cache served the second compilation."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache

    seen = []
    with fresh_cache():
        for order in ([8, 16], [16, 8]):
            with fresh():
                counters.clear()
                m = CMesh("a")
                out = torch.compile(lambda t: t * 2, backend="inductor", fullgraph=True)(
                    CHand(torch.arange(3.0), m, frozenset(order))
                )
                seen.append(
                    {
                        "out": describe(out, {"input mesh": m}),
                        "served from cache": counters["aot_autograd"]["autograd_cache_hit"] > 0,
                    }
                )
    return seen


#: The setting ``_untraced_scaled_sine`` reads (pytorch/pytorch#194658's entry changes it).
_UNTRACED_SCALE = [2.0]


@torch._dynamo.allow_in_graph
def _untraced_scaled_sine(t: torch.Tensor) -> torch.Tensor:
    return torch.sin(t * _UNTRACED_SCALE[0])


@entry("upstream/194658-checkpointed-untraced-function")
def _checkpointed_untraced_function() -> Observation:
    """pytorch/pytorch#194658: ``torch.utils.checkpoint`` of a function Dynamo does not trace
    (``allow_in_graph``; it multiplies by a module setting), on a ``CSharded`` input, compiled
    with inductor (forward and backward) twice in one fresh cache directory (Dynamo reset
    between), the setting 2 then 3: each compilation's output, eager's, and what AOTAutograd's
    cache did."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache

    def fn(t: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(_untraced_scaled_sine, t, use_reentrant=False)

    seen = []
    try:
        with fresh_cache():
            for scale in (2.0, 3.0):
                with fresh():
                    counters.clear()
                    _UNTRACED_SCALE[0] = scale
                    m = CMesh("a")
                    x = CSharded(torch.ones(2), m, "t", requires_grad=True)
                    out = torch.compile(fn, backend="inductor")(x)
                    out.sum().backward()
                    cache = sorted(
                        k for k, v in counters["aot_autograd"].items() if k.startswith("autograd_cache") and v
                    )
                    seen.append(
                        {
                            "out": describe(out, {"input mesh": m}),
                            "eager": describe(fn(x), {"input mesh": m}),
                            "AOTAutograd cache": cache,
                        }
                    )
    finally:
        _UNTRACED_SCALE[0] = 2.0
    return seen


@entry("upstream/183999-dtensor-built-on-a-mesh-input")
def _dtensor_built_on_a_mesh_input() -> Observation:
    """pytorch/pytorch#183999 (#184001): ``DTensor.from_local`` on a mesh passed in as an
    argument, a DTensor output, compiled with inductor (forward and backward) twice in one
    fresh cache directory (Dynamo reset between), a fake world of 2: the outputs and what
    AOTAutograd's and inductor's caches did (the bug: hashing a DTensor on torch's fake
    wrapper of the mesh raised, and the key bypassed the cache with a warning)."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_cache
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    def fn(t: torch.Tensor, mesh: Any) -> Any:
        return DTensor.from_local(t * 2, mesh, [Shard(0)]) + 1

    seen = []
    with fake_world(2), fresh_cache():
        mesh = init_device_mesh("cpu", (2,))
        for _ in range(2):
            with fresh():
                counters.clear()
                t = torch.ones(4, requires_grad=True)
                try:
                    out = torch.compile(fn, backend="inductor")(t, mesh)
                    out.to_local().sum().backward()
                except Exception as e:  # the observation is the exception
                    seen.append(error(e))
                    continue
                seen.append(
                    {
                        "out": {
                            "local": _values(out.to_local()),
                            "mesh equal to the argument": out.device_mesh == mesh,
                        },
                        "grad": _values(t.grad),
                        "caches": sorted(
                            f"{group}:{k}"
                            for group in ("aot_autograd", "inductor")
                            for k, v in counters[group].items()
                            if "cache" in k and v
                        ),
                    }
                )
    return seen


@entry("upstream/179047-nested-compile-under-outer-trace")
def _nested_compile_under_outer_trace() -> Observation:
    """pytorch/pytorch#179047 (torchtitan#2771): a compiled region that an
    outer ``make_fx``-based trace (functorch's ``aot_function``, as
    torchtitan's graph trainer) traces over, kept as an ``invoke_subgraph``
    HOP; Dynamo compiles it while the outer trace runs, when the input's mesh
    is torch's fake wrapper of it. Its guard on the mesh's type must hold for
    the wrapper and the real mesh alike (torch 2.12: guarded on the wrapper's
    type, so the trace's second pass recompiles)."""
    from functorch.compile import aot_function, nop

    with fresh(), torch._dynamo.config.patch(force_compile_during_fx_trace=True):
        count = counter("invoke_subgraph")
        inner = torch.compile(lambda t: t * 2 + 1, backend=count, fullgraph=True)
        m = CMesh("a")
        x = CSharded(torch.arange(3.0), m, "t", requires_grad=True)
        seen: dict[str, Any] = {}
        try:
            out = aot_function(lambda t: inner(t).sin(), fw_compiler=nop, bw_compiler=nop)(x)
            seen["out"] = describe(out, {"input mesh": m})
        except Exception as e:  # the observation is the exception
            seen["out"] = error(e)
        seen["compilations in the outer trace"] = count.frame_count
        # the reasons naming the opaque attribute (those on global state and the mode stack are
        # torch's own, on every release)
        seen["reasons on the mesh"] = [r for r in recompile_reasons() if "._mesh" in r]
        return seen


# ---------------------------------------------------------------------------
# Running and comparing.


def observe(names: Sequence[str] | None = None) -> dict[str, Observation]:
    out = {}
    for name in names or sorted(ENTRIES):
        out[name] = run_entry(name)
    return out


def run_entry(name: str) -> Observation:
    """One entry's observation, JSON-normalised; an unexpected exception is
    recorded as what the entry observed."""
    try:
        value = ENTRIES[name]()
    except Exception as e:
        value = {"entry raised": type(e).__name__, "message": normalise(str(e).splitlines()[0] if str(e) else "")}
    finally:
        torch._dynamo.reset()
    return json.loads(json.dumps(value))


def compare(reference: dict[str, Observation], observed: dict[str, Observation]) -> dict[str, tuple[Any, Any]]:
    """Entries whose observations differ: ``name -> (reference, observed)``."""
    return {
        name: (reference.get(name), observed.get(name))
        for name in sorted(set(reference) | set(observed))
        if reference.get(name) != observed.get(name)
    }


# ---------------------------------------------------------------------------
# Adopting a class you do not own (opaque_subclass.adopt): a PhysicsNeMo-like
# class, its DeviceMesh in a spec in its flatten context.


@dataclasses.dataclass(frozen=True)
class CVendorSpec:
    """A sharding spec holding its mesh (compared by DeviceMesh's ==: its layout)."""

    mesh: Any
    placements: tuple[int, ...]


class CVendorShard(torch.Tensor):
    """Another package's sharded tensor: the context ``(spec, requires_grad)``, a
    ``__metadata_guard__`` comparing contexts, op outputs built as the class itself."""

    @staticmethod
    def __new__(cls, local: torch.Tensor, spec: CVendorSpec, *, requires_grad: bool = False) -> Any:
        t = torch.Tensor._make_wrapper_subclass(cls, local.shape, dtype=local.dtype, requires_grad=requires_grad)
        t._local_tensor, t._spec = local, spec
        return t

    def __init__(self, local: torch.Tensor, spec: CVendorSpec, *, requires_grad: bool = False) -> None:
        pass

    def __repr__(self) -> str:
        return f"CVendorShard(placements={self._spec.placements})"

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["_local_tensor"], (self._spec, self.requires_grad)

    @classmethod
    def __tensor_unflatten__(cls, inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        spec, requires_grad = ctx
        return cls(inner["_local_tensor"], spec, requires_grad=requires_grad)

    @classmethod
    def __metadata_guard__(cls, orig: Any, other: Any) -> bool:
        return bool(orig == other)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torch.utils._pytree import tree_map_only

        spec = next(a._spec for a in args if isinstance(a, CVendorShard))
        out = func(*tree_map_only(CVendorShard, lambda t: t._local_tensor, args), **(kwargs or {}))
        return tree_map_only(torch.Tensor, lambda t: CVendorShard(t, spec), out)


def _vendor_meshes(meshes: list[Any]) -> Observation:
    """``t * 2 + 1`` compiled once and called on each mesh, then backward: which
    call's mesh each output and gradient carries (by the index of its call)."""
    count = counter("aot_eager")
    compiled = torch.compile(lambda t: t * 2 + 1, backend=count)
    outputs, grads = [], []
    for mesh in meshes:
        x = CVendorShard(torch.ones(2), CVendorSpec(mesh, (0,)), requires_grad=True)
        out = compiled(x)
        out.backward(CVendorShard(torch.ones(2), CVendorSpec(mesh, (0,))))
        outputs.append(next(i for i, m in enumerate(meshes) if m is out._spec.mesh))
        grads.append(next(i for i, m in enumerate(meshes) if m is x.grad._spec.mesh))
    return {"output meshes": outputs, "gradient meshes": grads, "compilations": count.frame_count}


@entry("adopt/physicsnemo-like/8-meshes")
def _adopt_physicsnemo_like() -> Observation:
    """Stock, then adopted (the mesh at ``[0].mesh`` made the attribute
    ``_mesh``), then undone: 8 equal meshes over 8 process groups."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    with fake_world(2):
        meshes = [DeviceMesh.from_group(dist.new_group([0, 1]), "cpu") for _ in range(8)]
        before = dict(vars(CVendorShard))
        declaration = {"_mesh": opaque_subclass.ContextOpaque("[0].mesh", DeviceMesh)}
        observed: dict[str, Any] = {}
        with fresh():
            observed["stock"] = _vendor_meshes(meshes)
        with (
            fresh(),
            opaque_subclass.adopt(
                CVendorShard, declaration, example=CVendorShard(torch.ones(2), CVendorSpec(meshes[0], (0,)))
            ),
        ):
            x = CVendorShard(torch.ones(2), CVendorSpec(meshes[0], (0,)))
            names, ctx = x.__tensor_flatten__()
            observed["adopted"] = _vendor_meshes(meshes) | {"flatten names": names, "context mesh": repr(ctx[0].mesh)}
        after = dict(vars(CVendorShard))
        observed["undone"] = {
            "class restored": after.keys() == before.keys() and all(after[k] is before[k] for k in before),
            "adoptions": len(opaque_subclass.adoptions()),
        }
        return observed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--stock", action="store_true", help="record torch without the library's patches and fixes")
    parser.add_argument("-k", dest="match", default="")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("REFERENCE", "OBSERVED"))
    args = parser.parse_args(argv)
    if args.compare:
        ref, obs = (json.loads(p.read_text())["observations"] for p in args.compare)
        diff = compare(ref, obs)
        for name, (a, b) in diff.items():
            print(f"{name}\n  reference: {json.dumps(a)}\n  observed:  {json.dumps(b)}")
        print(f"{len(diff)} of {len(set(ref) | set(obs))} entries differ")
        return 0
    if args.stock:
        opaque_subclass.disable()
    names = [n for n in sorted(ENTRIES) if args.match in n]
    observations = observe(names)
    record = {"torch": torch.__version__, "stock": args.stock, "observations": observations}
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    # Run as the module the tests import, so that class names read the same
    # (``conformance.CMesh``, not ``__main__.CMesh``) in recorded observations.
    import conformance

    raise SystemExit(conformance.main())
