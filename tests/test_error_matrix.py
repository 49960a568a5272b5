"""Bad inputs x routes: every cell gets the library's named error (issue #13).

A *case* is one bad subclass input: an attribute listed by ``__tensor_flatten__``
that holds something other than a tensor or a registered reference opaque (an
unregistered class, a builtin, one of torch's own objects, a value opaque), a
malformed ``__tensor_flatten__`` result (names as a set, a duplicate, a missing
attribute, ...) or a ``__tensor_unflatten__`` that rebuilds something else (the
inner tensor, another type, another dtype or shape), at the outer level or at a
nested inner level. A *route* is one way the input reaches the library:

* ``api`` - ``opaque_subclass.flatten_subclass`` then ``unflatten_subclass``;
* ``aot_eager`` / ``inductor`` - ``torch.compile(lambda t: t * 2, fullgraph=True)``
  with that backend (``torch._dynamo.reset()`` first);
* ``export`` - non-strict ``torch.export.export`` of a module doubling its input;
* ``parametrize`` - ``unwrap_subclass_parameters`` on a module holding the
  input as a parameter, then reading the parameter back.

Each cell asserts that the error the user sees is the library's: raised inside
``opaque_subclass`` with the case's error type (``TypeError``, ``ValueError``,
``AttributeError`` or ``OpaqueSubclassError``), reached either directly or through
Dynamo's wrappers (``InternalTorchDynamoError``, ``BackendCompilerFailed``) via
``__cause__``, never a bare ``AttributeError``/``AssertionError``/``KeyError`` from
inside torch, and that its message names (a) the subclass, (b) the attribute path
as the route spells it (``'x._mesh'``, ``"L['t']._data._mesh"``, ``'input._nope'``),
(c) the type found and (d) a ``Fix:``.

Cells where the library does not give a named error today are
``xfail(strict=True)`` with what happens instead (reason ``#13: ...``), so each
gap is documented and a fix turns them into failures to remove the mark.

Which cells run depends on the torch release (``opaque_subclass.releases``):
the full matrix on the oldest supported release (2.11, backport mode) and on the
newest in the table (2.15) or anything newer; a representative subset of cases
(:data:`SUBSET`: every route, every error class and kind of bad input) on the
releases between (2.12, 2.13, 2.14), to keep those legs quick. Every cell fails
while Dynamo or export first meets the input, before any graph is compiled, so an
``inductor`` cell costs what an ``aot_eager`` one does (the full matrix, about 360
cells, runs in about 2 s of test time).

``outcome`` classifies one cell without asserting (``named``, ``crash``, ``other``
or ``silent``); ``tally`` runs it on every cell of the full matrix, whatever the
release (``PYTHONPATH=.:tests python tests/test_error_matrix.py`` prints the counts).
"""

from __future__ import annotations

import builtins
import dataclasses
import math
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo
from subclasses import (
    Config,
    Mesh,
    MeshTensor,
    MultiOpaque,
    NotRegistered,
    PlainPair,
    ReturnsPlain,
    ShardSpec,
    Stream,
)

import opaque_subclass as osc
from opaque_subclass import releases as _versions
from opaque_subclass.core.walk import ValueOpaqueListedError

# ------------------------------------------------------------------ bad objects


class UnregisteredOpaque(osc.OpaqueBase):
    """Inherits the opaque base class but was never registered."""


class EqThing:
    """Unregistered, compares by value (like a config object)."""

    def __init__(self, v: int = 1) -> None:
        self.v = v

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EqThing) and other.v == self.v

    def __hash__(self) -> int:
        return hash(self.v)


def _function() -> None:
    pass


def _generator() -> Any:
    yield 1


M = __name__  # module of the classes defined here, as the messages spell it


def _tensor() -> torch.Tensor:
    return torch.ones(2)


def _with(value: Any, attr: str = "_mesh") -> MeshTensor:
    x = MeshTensor(_tensor(), Mesh())
    setattr(x, attr, value)
    return x


def _multi(value: Any) -> MultiOpaque:
    x = MultiOpaque(_tensor(), _tensor(), Mesh(), Stream())
    x._stream = value
    return x


def _outer(inner: torch.Tensor) -> MeshTensor:
    return MeshTensor(inner, Mesh("outer"))


# ------------------------------------------------------- malformed subclasses


class _Names(MeshTensor):
    """``__tensor_flatten__`` returns ``NAMES(self)`` as its attribute names."""

    NAMES: Any = None

    def __tensor_flatten__(self) -> tuple[Any, Any]:
        return type(self).NAMES(self), self._ctx


def _names_cls(label: str, names: Callable[[Any], Any]) -> type:
    return type(f"Names_{label}", (_Names,), {"NAMES": staticmethod(names)})


class _Flatten(MeshTensor):
    """``__tensor_flatten__`` returns ``RESULT(self)`` whole."""

    RESULT: Any = None

    def __tensor_flatten__(self) -> Any:
        return type(self).RESULT(self)


def _flatten_cls(label: str, result: Callable[[Any], Any]) -> type:
    return type(f"Flatten_{label}", (_Flatten,), {"RESULT": staticmethod(result)})


class _Unflatten(MeshTensor):
    """``__tensor_unflatten__`` returns ``REBUILD(cls, inner, ctx)``."""

    REBUILD: Any = None

    @classmethod
    def __tensor_unflatten__(cls, inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        return cls.REBUILD(cls, inner, ctx)


def _unflatten_cls(label: str, rebuild: Callable[[type, dict[str, Any], Any], Any]) -> type:
    return type(f"Unflatten_{label}", (_Unflatten,), {"REBUILD": staticmethod(rebuild)})


NamesNone = _names_cls("None", lambda t: None)
NamesSet = _names_cls("set", lambda t: {"_data", "_mesh"})
NamesFrozenset = _names_cls("frozenset", lambda t: frozenset(["_data", "_mesh"]))
NamesGenerator = _names_cls("generator", lambda t: (n for n in ("_data", "_mesh")))
NamesDict = _names_cls("dict", lambda t: {"_data": 0, "_mesh": 1})
NamesStr = _names_cls("str", lambda t: "_data")
NamesDup = _names_cls("dup", lambda t: ["_data", "_data", "_mesh"])
NamesDupOpaque = _names_cls("dup_opaque", lambda t: ("_data", "_mesh", "_mesh"))
NamesInt = _names_cls("int", lambda t: ["_data", 1])
NamesBytes = _names_cls("bytes", lambda t: [b"_data", "_mesh"])
NamesMissing = _names_cls("missing", lambda t: ["_data", "_nope"])
NamesCtx = _names_cls("ctx", lambda t: ["_data", "_mesh", "_ctx"])


class NamesEmpty(MeshTensor):
    """Lists no attribute at all; ``__tensor_unflatten__`` agrees (builds from the
    size), so the only fault is a level without a tensor."""

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return [], None

    @classmethod
    def __tensor_unflatten__(cls, inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        return cls(torch.ones(size), Mesh(), outer=torch.ones(size))


class NamesOpaqueOnly(MeshTensor):
    """Lists its opaque but no tensor; ``__tensor_unflatten__`` agrees."""

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        return ["_mesh"], None

    @classmethod
    def __tensor_unflatten__(cls, inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> Any:
        return cls(torch.ones(size), inner["_mesh"], outer=torch.ones(size))


FlattenList = _flatten_cls("list", lambda t: ["_data", "_mesh"])
FlattenNone = _flatten_cls("None", lambda t: None)
FlattenTriple = _flatten_cls("triple", lambda t: (["_data", "_mesh"], None, None))

UnflattenPlain = ReturnsPlain  # returns the inner tensor (fixture)
UnflattenParent = _unflatten_cls("parent", lambda cls, i, c: MeshTensor(i["_data"], i["_mesh"], ctx=c))
UnflattenPair = _unflatten_cls("pair", lambda cls, i, c: PlainPair(i["_data"], i["_data"]))
UnflattenNone = _unflatten_cls("None", lambda cls, i, c: None)
UnflattenDict = _unflatten_cls("dict", lambda cls, i, c: i)
UnflattenDtype = _unflatten_cls("dtype", lambda cls, i, c: cls(i["_data"].double(), i["_mesh"], ctx=c))
UnflattenShape = _unflatten_cls("shape", lambda cls, i, c: cls(i["_data"][:1], i["_mesh"], ctx=c))


def _of(cls: type) -> Callable[[], torch.Tensor]:
    return lambda: cls(_tensor(), Mesh())


def _nested_of(cls: type) -> Callable[[], torch.Tensor]:
    return lambda: _outer(cls(_tensor(), Mesh()))


# -------------------------------------------------------------------- cases


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[], torch.Tensor]
    cls: str  # the subclass the message must name, module-qualified (``subclasses.MeshTensor``)
    path: str  # attribute path below the input ("" for the input's level itself)
    found: tuple[str, ...]  # the type found, as the message may spell it (any one)
    error: type[BaseException] | tuple[type[BaseException], ...] = TypeError
    excluded: tuple[str, ...] = ()  # routes that cannot take this input (said where the case is)


def _attr(id: str, value: Callable[[], Any], found: str) -> Case:
    return Case(id, lambda: _with(value()), "subclasses.MeshTensor", "._mesh", (found,))


def _nested_attr(id: str, value: Callable[[], Any], found: str) -> Case:
    return Case(f"nested-{id}", lambda: _outer(_with(value())), "subclasses.MeshTensor", "._data._mesh", (found,))


# The inner tensor returned: a Parameter on the parametrize route (its leaves are).
_INNER = ("returned torch.Tensor", "returned torch.nn.parameter.Parameter")

CASES = [
    # unregistered objects
    _attr("unregistered", NotRegistered, "subclasses.NotRegistered"),
    _attr("opaquebase-unregistered", UnregisteredOpaque, f"{M}.UnregisteredOpaque"),
    _attr("eq-class", EqThing, f"{M}.EqThing"),
    _attr("frozen-dataclass", lambda: ShardSpec(Mesh(), 0), "subclasses.ShardSpec"),
    _attr("object", object, "holds object"),
    # builtins
    _attr("int", lambda: 3, "holds int"),
    _attr("float", lambda: 1.5, "holds float"),
    _attr("bool", lambda: True, "holds bool"),
    _attr("complex", lambda: 1j, "holds complex"),
    _attr("str", lambda: "mesh", "holds str"),
    _attr("bytes", lambda: b"mesh", "holds bytes"),
    _attr("list", lambda: [Mesh()], "holds list"),
    _attr("tuple", lambda: (Mesh(),), "holds tuple"),
    _attr("dict", lambda: {"mesh": Mesh()}, "holds dict"),
    _attr("set", lambda: {1}, "holds set"),
    _attr("frozenset", lambda: frozenset([1]), "holds frozenset"),
    _attr("range", lambda: range(2), "holds range"),
    _attr("None", lambda: None, "holds NoneType"),
    _attr("function", lambda: _function, "holds function"),
    _attr("lambda", lambda: lambda: 0, "holds function"),
    _attr("builtin-function", lambda: len, "holds builtin_function_or_method"),
    _attr("bound-method", lambda: Mesh().__repr__, "holds method"),
    _attr("generator-object", _generator, "holds generator"),
    _attr("module-object", lambda: math, "holds module"),
    _attr("class-object", lambda: NotRegistered, "holds type"),
    # torch's own objects
    _attr("dtype", lambda: torch.float32, "torch.dtype"),
    _attr("device", lambda: torch.device("cpu"), "torch.device"),
    _attr("size", lambda: torch.Size([2]), "torch.Size"),
    _attr("layout", lambda: torch.strided, "torch.layout"),
    _attr("memory-format", lambda: torch.contiguous_format, "torch.memory_format"),
    _attr("nn-module", lambda: torch.nn.Linear(1, 1), "torch.nn.modules.linear.Linear"),
    # torch registers torch.Generator as a reference opaque itself from 2.13 on: a
    # valid attribute there, so the case exists only where it is not registered
    *(
        [_attr("generator", torch.Generator, "torch._C.Generator")]
        if osc.opaque_kind(torch.Generator()) is None
        else []
    ),
    _attr("stream", lambda: torch.Stream(device="cpu"), "torch.Stream"),
    # a registered value opaque (a constant: belongs in the context)
    _attr("value-opaque", lambda: Config(3), "subclasses.Config"),
    # a non-tensor where a tensor is listed, and a bad second opaque. Not on the
    # parametrize route: torch.nn.Parameter(x) runs x.detach() through the
    # subclass's own __torch_dispatch__, which fails on the non-tensor
    # (aten::detach() "Expected a value of type 'Tensor'") before the library is called
    Case(
        "tensor-slot-int",
        lambda: _with(3, "_data"),
        "subclasses.MeshTensor",
        "._data",
        ("holds int",),
        excluded=("parametrize",),
    ),
    Case(
        "tensor-slot-None",
        lambda: _with(None, "_data"),
        "subclasses.MeshTensor",
        "._data",
        ("holds NoneType",),
        excluded=("parametrize",),
    ),
    Case("second-opaque-int", lambda: _multi(7), "subclasses.MultiOpaque", "._stream", ("holds int",)),
    # the same at a nested inner level
    _nested_attr("unregistered", NotRegistered, "subclasses.NotRegistered"),
    _nested_attr("int", lambda: 3, "holds int"),
    _nested_attr("None", lambda: None, "holds NoneType"),
    _nested_attr("lambda", lambda: lambda: 0, "holds function"),
    _nested_attr("dtype", lambda: torch.float32, "torch.dtype"),
    _nested_attr("value-opaque", lambda: Config(3), "subclasses.Config"),
    Case(
        "nested-second-opaque", lambda: _outer(_multi("s")), "subclasses.MultiOpaque", "._data._stream", ("holds str",)
    ),
    # malformed attribute names
    Case("names-None", _of(NamesNone), f"{M}.Names_None", "", ("names None",)),
    Case("names-set", _of(NamesSet), f"{M}.Names_set", "", ("as set",)),
    Case("names-frozenset", _of(NamesFrozenset), f"{M}.Names_frozenset", "", ("as frozenset",)),
    Case("names-generator", _of(NamesGenerator), f"{M}.Names_generator", "", ("as generator",)),
    Case("names-dict", _of(NamesDict), f"{M}.Names_dict", "", ("as dict",)),
    Case("names-str", _of(NamesStr), f"{M}.Names_str", "", ("names '_data'",)),
    Case("names-duplicate", _of(NamesDup), f"{M}.Names_dup", "", ("['_data'] more than once",)),
    Case("names-duplicate-opaque", _of(NamesDupOpaque), f"{M}.Names_dup_opaque", "", ("['_mesh'] more than once",)),
    Case("names-int", _of(NamesInt), f"{M}.Names_int", "", ("['_data', 1]",)),
    Case("names-bytes", _of(NamesBytes), f"{M}.Names_bytes", "", ("[b'_data', '_mesh']",)),
    Case("names-missing", _of(NamesMissing), f"{M}.Names_missing", "._nope", ("no such attribute",), AttributeError),
    # a level without a tensor (torch needs one per level to fake it): a TypeError (docs/errors.md)
    Case("names-empty", _of(NamesEmpty), f"{M}.NamesEmpty", "", ("[]",), TypeError),
    Case("names-opaque-only", _of(NamesOpaqueOnly), f"{M}.NamesOpaqueOnly", "", ("['_mesh']",), TypeError),
    Case("names-ctx", _of(NamesCtx), f"{M}.Names_ctx", "._ctx", ("holds NoneType",)),
    Case("nested-names-set", _nested_of(NamesSet), f"{M}.Names_set", "._data", ("as set",)),
    Case(
        "nested-names-missing",
        _nested_of(NamesMissing),
        f"{M}.Names_missing",
        "._data._nope",
        ("no such attribute",),
        AttributeError,
    ),
    # malformed flatten results
    Case("flatten-list", _of(FlattenList), f"{M}.Flatten_list", "", ("returned list",)),
    Case("flatten-None", _of(FlattenNone), f"{M}.Flatten_None", "", ("returned NoneType",)),
    Case("flatten-triple", _of(FlattenTriple), f"{M}.Flatten_triple", "", ("returned tuple",)),
    # __tensor_unflatten__ rebuilding something else
    Case("unflatten-plain", _of(UnflattenPlain), "subclasses.ReturnsPlain", "", _INNER),
    Case("unflatten-parent", _of(UnflattenParent), f"{M}.Unflatten_parent", "", ("returned subclasses.MeshTensor",)),
    Case("unflatten-other", _of(UnflattenPair), f"{M}.Unflatten_pair", "", ("returned subclasses.PlainPair",)),
    Case("unflatten-None", _of(UnflattenNone), f"{M}.Unflatten_None", "", ("returned NoneType",)),
    Case("unflatten-dict", _of(UnflattenDict), f"{M}.Unflatten_dict", "", ("returned dict",)),
    Case("unflatten-dtype", _of(UnflattenDtype), f"{M}.Unflatten_dtype", "", ("dtype torch.float64",)),
    Case("unflatten-shape", _of(UnflattenShape), f"{M}.Unflatten_shape", "", ("shape torch.Size([1])",)),
    Case("nested-unflatten-plain", _nested_of(UnflattenPlain), "subclasses.ReturnsPlain", "._data", _INNER),
    Case(
        "nested-unflatten-dtype", _nested_of(UnflattenDtype), f"{M}.Unflatten_dtype", "._data", ("dtype torch.float64",)
    ),
    Case(
        "nested-unflatten-shape",
        _nested_of(UnflattenShape),
        f"{M}.Unflatten_shape",
        "._data",
        ("shape torch.Size([1])",),
    ),
]

# A representative subset for the releases between the oldest and the newest:
# every route, every error class (TypeError, the value-opaque TypeError subclass,
# AttributeError) and every kind of bad input, outer and nested.
SUBSET = {
    "unregistered",
    "int",
    "None",
    "dtype",
    "value-opaque",
    "nested-unregistered",
    "nested-value-opaque",
    "names-set",
    "names-duplicate",
    "names-missing",
    "nested-names-missing",
    "names-opaque-only",
    "flatten-list",
    "unflatten-plain",
    "unflatten-dtype",
    "nested-unflatten-plain",
}

# ------------------------------------------------------------------- routes


class _Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class _Holder(torch.nn.Module):
    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(w, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x


def _api(x: torch.Tensor) -> None:
    leaves, spec = osc.flatten_subclass(x)
    osc.unflatten_subclass(leaves, spec)


def _compile(backend: str) -> Callable[[torch.Tensor], None]:
    def run(x: torch.Tensor) -> None:
        torch._dynamo.reset()
        torch.compile(lambda t: t * 2, backend=backend, fullgraph=True)(x)

    return run


def _export(x: torch.Tensor) -> None:
    torch.export.export(_Double(), (x,), strict=False)


def _parametrize(x: torch.Tensor) -> None:
    osc.unwrap_subclass_parameters(_Holder(x)).w  # noqa: B018  # reading it rebuilds the subclass


ROUTES: dict[str, Callable[[torch.Tensor], None]] = {
    "api": _api,
    "aot_eager": _compile("aot_eager"),
    "inductor": _compile("inductor"),
    "export": _export,
    "parametrize": _parametrize,
}

# How each route names its input in paths: the library's default ``x``;
# Dynamo's sources (the lambda's argument ``t``, the module's ``x``); export's
# first walk over its inputs (``input``: it has not named the arguments yet).
ROOTS = {
    "api": ("x",),
    "aot_eager": ("L['t']",),
    "inductor": ("L['t']",),
    "export": ("L['x']", "input"),
    "parametrize": ("x",),
}

# Exceptions Dynamo wraps a failure in; the user still reads ours in them.
WRAPPERS: tuple[type[BaseException], ...] = (
    torch._dynamo.exc.InternalTorchDynamoError,
    torch._dynamo.exc.BackendCompilerFailed,
)
# The error types the library raises, by the name a wrapper's message starts with.
_ERRORS = {
    c.__qualname__: c for c in (TypeError, ValueError, AttributeError, osc.OpaqueSubclassError, ValueOpaqueListedError)
}
_LIBRARY = os.path.dirname(os.path.abspath(osc.__file__))


def _unwrap(top: BaseException) -> tuple[type[BaseException], str, BaseException]:
    """The error under Dynamo's wrappers: its type, its message, and the exception
    whose traceback ends where it was raised."""
    e = top
    while isinstance(e, WRAPPERS):
        if e.__cause__ is not None:
            e = e.__cause__
            continue
        # InternalTorchDynamoError: Dynamo re-raises f"{type(e).__qualname__}: {e}"
        # with the original traceback, from None.
        name, _, rest = str(e).partition(": ")
        found = _ERRORS.get(name, getattr(builtins, name, None))
        if isinstance(found, type) and issubclass(found, BaseException):
            return found, rest, e
        return type(e), str(e), e
    return type(e), str(e), e


def _raised_at(e: BaseException) -> str:
    """``file:line`` of the frame that raised ``e`` (relative to site-packages or the repo)."""
    tb = e.__traceback__
    if tb is None:
        return "?"
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{os.path.abspath(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"


def outcome(case: Case, route: str) -> tuple[str, str]:
    """Run one cell: ``("named", msg)`` when the user gets the library's named
    error, else ``("silent", "")``, ``("crash", msg)`` (a bare ``AssertionError``,
    ``KeyError`` or ``IndexError``, or an ``AttributeError``/``RuntimeError``
    raised outside the library) or ``("other", msg)`` (the library's error
    missing a part, or another error raised outside the library), saying where
    it was raised or what is missing."""
    try:
        ROUTES[route](case.make())
    except Exception as top:
        error, msg, e = _unwrap(top)
        text = f"{error.__qualname__}: {msg}"
        where = _raised_at(e)
        ours = where.startswith(_LIBRARY)
        short = where.split("site-packages/")[-1].replace(os.path.dirname(_LIBRARY) + "/", "")
        if issubclass(error, (AssertionError, KeyError, IndexError)) or (
            not ours and issubclass(error, (AttributeError, RuntimeError))
        ):
            return "crash", f"raised at {short}: {text}"
        if not ours:
            return "other", f"raised at {short}: {text}"
        paths = [repr(root + case.path) for root in ROOTS[route]]
        missing = [
            what
            for what, ok in (
                (f"error type {case.error}", issubclass(error, case.error)),
                (f"subclass {case.cls}", case.cls in msg),
                (f"path {' or '.join(paths)}", any(p in msg for p in paths)),
                (f"type found {case.found}", any(f in msg for f in case.found)),
                ("Fix:", "Fix:" in msg),
            )
            if not ok
        ]
        if missing:
            return "other", f"missing {missing}: {text}"
        return "named", msg
    return "silent", ""


# -------------------------------------------------------------------- gaps

# (case id, route) -> what happens today instead of the named error. Empty: every
# cell of the matrix gets the named error on every release 2.11 to 2.15. A gap
# found later is listed here (it runs as a strict xfail) until it is fixed.
GAPS: dict[tuple[str, str], str] = {}


def _release() -> tuple[int, int]:
    return _versions.current().release


_FULL = _release() in (_versions.OLDEST_SUPPORTED, _versions.NEWEST) or _release() > _versions.NEWEST


def _cells() -> list[Any]:
    cells = []
    for case in CASES:
        if not _FULL and case.id not in SUBSET:
            continue
        for route in ROUTES:
            if route in case.excluded:
                continue
            reason = GAPS.get((case.id, route))
            marks = [pytest.mark.xfail(strict=True, reason=f"#13: {reason}")] if reason else []
            cells.append(pytest.param(case, route, id=f"{case.id}-{route}", marks=marks))
    return cells


@pytest.mark.parametrize("case, route", _cells())
def test_bad_input_gets_the_named_error(case: Case, route: str) -> None:
    kind, text = outcome(case, route)
    assert kind == "named", f"{case.id} via {route}: {kind}: {text[:2000]}"


def test_matrix_is_large_enough() -> None:
    assert len(CASES) >= 60 and len({c.id for c in CASES}) == len(CASES)
    assert SUBSET <= {c.id for c in CASES}


def test_cases_name_their_subclass_module_qualified() -> None:
    """``Case.cls`` is the qualified name (``module.QualName``) of a subclass the
    input holds, so the matrix checks that messages name the subclass qualified."""
    from opaque_subclass.core.errors import qualified_name

    for case in CASES:
        x: Any = case.make()
        held = set()
        while isinstance(x, torch.Tensor) and type(x) is not torch.Tensor:
            held.add(qualified_name(type(x)))
            x = x.__dict__.get("_data")
        assert case.cls in held, f"{case.id}: {case.cls} is not one of {sorted(held)}"


def tally() -> dict[str, int]:
    """Every cell of the full matrix on this torch, by outcome (``named``,
    ``crash``, ``other``, ``silent``), printing each cell that is not named."""
    counts = {"named": 0, "crash": 0, "other": 0, "silent": 0}
    for case in CASES:
        for route in ROUTES:
            if route in case.excluded:
                continue
            kind, text = outcome(case, route)
            counts[kind] += 1
            if kind != "named":
                print(f"{case.id} via {route}: {kind}: {text[:300]}")
    return counts


if __name__ == "__main__":  # PYTHONPATH=.:tests python tests/test_error_matrix.py
    counts = tally()
    print(f"torch {torch.__version__}: {len(CASES)} cases, {sum(counts.values())} cells:", counts)
