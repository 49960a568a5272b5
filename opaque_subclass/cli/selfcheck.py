"""Live checks of the library on the running torch, used by ``python -m opaque_subclass``.

Each check builds real objects, runs the public API and compares results; a
check returns normally on success and raises on failure.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.utils._pytree import tree_map_only

from opaque_subclass import (
    OpaqueBase,
    SubclassLayout,
    describe_args,
    flatten_subclass,
    opaque_alias_pattern,
    register_opaque,
    unflatten_subclass,
    unwrap_args,
    wrap_args,
)

__all__ = ["CHECKS", "CheckResult", "run_checks"]


class _Group(OpaqueBase):
    """Stands in for a process group / device mesh: compared by identity only."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"_Group({self.name!r})"


class _GroupTensor(torch.Tensor):
    """A wrapper subclass holding one tensor and one opaque group."""

    _data: torch.Tensor
    _group: _Group

    @staticmethod
    def __new__(cls, data: torch.Tensor, group: _Group) -> _GroupTensor:
        r = torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device=data.device)
        r._data = data
        r._group = group
        return r

    def __repr__(self) -> str:  # type: ignore[override]  # Tensor's takes tensor_contents=, the data this never shows
        return f"_GroupTensor(shape={tuple(self.shape)}, group={self._group.name!r})"

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["_data", "_group"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, Any], ctx: None, size: Any, stride: Any) -> _GroupTensor:
        return _GroupTensor(inner["_data"], inner["_group"])

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]  # Tensor declares its disabled default as a plain function
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        group = next(a._group for a in args if isinstance(a, _GroupTensor))
        out = func(*tree_map_only(_GroupTensor, lambda t: t._data, args), **(kwargs or {}))
        return tree_map_only(torch.Tensor, lambda t: _GroupTensor(t, group), out)


def _setup() -> None:
    register_opaque(_Group)


def check_round_trip() -> str:
    g = _Group("a")
    inner = _GroupTensor(torch.arange(4.0), _Group("inner"))
    x = _GroupTensor(inner, g)
    leaves, spec = flatten_subclass(x)
    if len(leaves) != 3 or leaves[2] is not g:
        raise AssertionError(f"unexpected leaves {leaves!r}")
    y = unflatten_subclass(leaves, spec)
    # x's and y's _data are _GroupTensor objects themselves (the nested level)
    if type(y) is not _GroupTensor or y._group is not g or cast(_GroupTensor, y._data)._group is not inner._group:
        raise AssertionError("opaques did not come back as the same objects")
    if not torch.equal(cast(_GroupTensor, y._data)._data, cast(_GroupTensor, x._data)._data):
        raise AssertionError("tensor leaf changed in the round trip")
    return "nested subclass, 3 leaves, opaques kept by identity"


def check_runtime_wrap_unwrap() -> str:
    shared = _Group("shared")
    args = [torch.ones(2), _GroupTensor(torch.zeros(3), shared), _GroupTensor(torch.ones(3), shared), shared]
    metas = describe_args(args)
    flat = unwrap_args(args, is_joint_structure=False, subclass_metas=metas)
    runtime = [m.runtime_safe() if isinstance(m, SubclassLayout) else m for m in metas]
    out = wrap_args(flat, subclass_metas=runtime, is_runtime=True)
    if len(flat) != 6 or out[1]._group is not shared or out[3] is not shared:
        raise AssertionError("wrap(unwrap(args)) did not rebuild the arguments")
    pattern = opaque_alias_pattern(flat)
    if pattern.shared != ((2, 4, 5),):
        raise AssertionError(f"alias pattern {pattern} does not show the shared group")
    other = opaque_alias_pattern(
        unwrap_args(
            [args[0], args[1], _GroupTensor(torch.ones(3), _Group("b")), shared],
            is_joint_structure=False,
        )
    )
    if other == pattern:
        raise AssertionError("alias patterns of different sharing compare equal")
    return "6 flat slots, shared opaque detected, distinct sharing distinguished"


def check_error_message() -> str:
    class NotRegistered:
        pass

    bad = _GroupTensor(torch.ones(1), _Group("x"))
    bad._group = NotRegistered()  # type: ignore[assignment]  # deliberately wrong for the check
    try:
        flatten_subclass(bad)
    except TypeError as e:
        msg = str(e)
        for needed in ("_GroupTensor", "x._group", "NotRegistered", "register_opaque"):
            if needed not in msg:
                raise AssertionError(f"error message lacks {needed!r}: {msg}") from None
        return "unregistered opaque named with subclass, path, type and fix"
    raise AssertionError("an unregistered object in __tensor_flatten__ was accepted")


def _compile(fn: Callable[..., Any]) -> tuple[Callable[..., Any], Any]:
    import torch._dynamo
    import torch._dynamo.testing

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    return torch.compile(fn, backend=counter, fullgraph=True), counter


def check_compile_forward() -> str:
    f, counter = _compile(lambda x: x * 2 + 1)
    for i in range(5):
        group = _Group(f"fw{i}")
        out = f(_GroupTensor(torch.full((3,), float(i)), group))
        if type(out) is not _GroupTensor or out._group is not group:
            raise AssertionError(f"call {i}: the output does not carry the call's own opaque")
        if not torch.equal(out._data, torch.full((3,), 2.0 * i + 1)):
            raise AssertionError(f"call {i}: wrong values")
    if counter.frame_count != 1:
        raise AssertionError(f"{counter.frame_count} compilations for 5 opaques, expected 1")
    return "5 calls with 5 opaques, 1 compilation, each output carries its call's opaque"


def check_compile_backward() -> str:
    f, counter = _compile(lambda x: (x * x).sum())
    for i in range(2):
        group = _Group(f"bw{i}")
        x = _GroupTensor(torch.arange(3.0) + i, group)
        x.requires_grad_(True)
        f(x).backward()
        grad = x.grad
        if type(grad) is not _GroupTensor or grad._group is not group:
            raise AssertionError(f"call {i}: x.grad does not carry the input's opaque")
        if not torch.equal(grad._data, 2 * (torch.arange(3.0) + i)):
            raise AssertionError(f"call {i}: wrong gradient values")
    if counter.frame_count != 1:
        raise AssertionError(f"{counter.frame_count} compilations, expected 1")
    return "x.grad carries the runtime opaque, cached graph reused"


def check_shared_opaque_guard() -> str:
    f, counter = _compile(lambda x, y: (x + y, y * 2))
    shared = _Group("shared")
    f(_GroupTensor(torch.ones(2), shared), _GroupTensor(torch.ones(2), shared))
    a, b = _Group("a"), _Group("b")
    out = f(_GroupTensor(torch.ones(2), a), _GroupTensor(torch.ones(2), b))
    if out[0]._group is not a or out[1]._group is not b:
        raise AssertionError("after sharing broke, outputs carry the wrong opaques")
    again = _Group("again")
    f(_GroupTensor(torch.ones(2), again), _GroupTensor(torch.ones(2), again))
    if counter.frame_count != 2:
        raise AssertionError(f"{counter.frame_count} compilations, expected 2 (shared, then not shared)")
    return "breaking the sharing recompiled once; sharing again reused the first graph"


class _ContextGroupTensor(_GroupTensor):
    """The pre-2.12 way: the group kept in the flatten context, not an attribute."""

    def __tensor_flatten__(self) -> tuple[list[str], Any]:  # the context differs on purpose
        return ["_data"], (self._group,)

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, Any], ctx: Any, size: Any, stride: Any) -> _ContextGroupTensor:
        return _ContextGroupTensor(inner["_data"], ctx[0])


def check_context_lint() -> str:
    # compile_passes stands on this package; the CLI, above both, imports it on use only.
    import compile_passes

    x = _ContextGroupTensor(torch.ones(2), _Group("ctx"))
    codes = [(f.code, f.path) for f in compile_passes.lint_contexts(x, "x")]
    if codes != [("OSC001", "x.<context>[0]")]:
        raise AssertionError(f"expected one OSC001 finding at x.<context>[0], got {codes}")
    # Compiled, the input is refused where Dynamo meets it: the group is never
    # equal to the deep copy torch's guard would compare it with.
    report = compile_passes.explain(lambda x: x * 2, x)
    if len(report.errors) != 1 or "_ContextGroupTensor.__tensor_flatten__()" not in report.errors[0]:
        raise AssertionError(f"expected the library's error naming the subclass, got {report.errors}")
    clean = compile_passes.explain(lambda x: x * 2, _GroupTensor(torch.ones(2), _Group("attr")))
    if clean.findings or clean.errors:
        raise AssertionError(f"a group held as an attribute was reported: {clean.findings} {clean.errors}")
    return (
        "a group kept in the flatten context is reported (OSC001 at x.<context>[0]) and refused by "
        "torch.compile with a named error; held as an attribute, nothing"
    )


CHECKS: dict[str, Callable[[], str]] = {
    "round trip": check_round_trip,
    "run-time wrap/unwrap": check_runtime_wrap_unwrap,
    "error message": check_error_message,
    "compile: forward": check_compile_forward,
    "compile: backward": check_compile_backward,
    "compile: shared-opaque guard": check_shared_opaque_guard,
    "lint: group in a flatten context": check_context_lint,
}


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str
    seconds: float


def run_checks() -> list[CheckResult]:
    """Run every check in :data:`CHECKS`; never raises."""
    _setup()
    results = []
    for name, fn in CHECKS.items():
        t0 = time.perf_counter()
        try:
            detail, ok = fn(), True
        except Exception:
            detail, ok = traceback.format_exc(limit=4).strip(), False
        results.append(CheckResult(name, ok, detail, time.perf_counter() - t0))
    return results
