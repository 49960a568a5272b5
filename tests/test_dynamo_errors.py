"""The library's errors reach the caller of a compiled function as themselves
(issue #24), on every supported torch.

Stock Dynamo re-raises an exception it does not know as
``InternalTorchDynamoError: TypeError: ...`` (reads as a torch bug, escapes
``except TypeError``), and one raised while it or the backend runs the user's
operations on fake tensors as ``TorchRuntimeError`` or
``BackendCompilerFailed``. The fix of ``torch._dynamo.convert_frame._compile``
(``opaque_subclass/fixes/dynamo_errors.py``) raises the library's error
instead, and leaves every other exception, graph breaks and
``suppress_errors`` as torch has them.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import torch
import torch._dynamo.convert_frame as convert_frame
from subclasses import Mesh, MeshTensor, PlainPair
from torch._dynamo.exc import InternalTorchDynamoError, TorchRuntimeError, Unsupported
from torch._subclasses.functional_tensor import FunctionalTensor

import opaque_subclass as osc
from opaque_subclass import OpaqueSubclass

TARGET = "torch._dynamo.convert_frame._compile"
HERE = os.path.basename(__file__)

#: The library's message for an ``int`` listed by ``MeshTensor.__tensor_flatten__``
#: under ``torch.compile`` of ``lambda t: ...``: the same on every release.
BAD_ATTRIBUTE = (
    "'int' found in tensor attrs of MeshTensor.__tensor_flatten__(). Only tensors and reference-type opaques are "
    "allowed in tensor attrs. subclasses.MeshTensor.__tensor_flatten__() lists attribute '_mesh' (path "
    "\"L['t']._mesh\"), which holds int. Fix: move '_mesh' into the flatten context (second return value of "
    "__tensor_flatten__) and read it back in __tensor_unflatten__."
)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _bad_attribute() -> MeshTensor:
    x = MeshTensor(torch.ones(2), Mesh("bad"))
    x._mesh = 3  # an int where an opaque is listed
    return x


class Tagged(OpaqueSubclass):
    tensor_attrs = ("_data",)
    opaque_attrs = {"_mesh": Mesh}
    meta_attrs = ("_tag",)


class _RaisesOurs(PlainPair):
    """``aten.mul`` raises the library's error, wherever it runs (eager, Dynamo's
    fake propagation, AOTAutograd's trace)."""

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.mul.Tensor:
            raise osc.OpaqueValueError("_RaisesOurs: mul is refused. Fix: add instead.")
        return super().__torch_dispatch__(func, types, args, kwargs)


class _RaisesOursInBackend(PlainPair):
    """``aten.mul`` raises the library's error only while AOTAutograd traces it
    (its inner tensors are functional tensors then): Dynamo's fake propagation passes."""

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.mul.Tensor and any(
            isinstance(a, cls) and isinstance(a.a, FunctionalTensor) for a in args
        ):
            raise osc.OpaqueValueError("_RaisesOursInBackend: mul is refused while tracing. Fix: add instead.")
        return super().__torch_dispatch__(func, types, args, kwargs)


class _RaisesTheirs(PlainPair):
    """``aten.mul`` raises a plain ``LookupError`` (the user's, not the library's)."""

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.mul.Tensor:
            raise LookupError("the user's own failure")
        return super().__torch_dispatch__(func, types, args, kwargs)


class _FlattenFails(MeshTensor):
    """``__tensor_flatten__`` raises a plain ``ZeroDivisionError``: Dynamo wraps it."""

    def __tensor_flatten__(self) -> Any:
        raise ZeroDivisionError("the user's own flatten failure")


def _pair(cls: type) -> torch.Tensor:
    return cls(torch.ones(2), torch.zeros(2))


#: Exceptions carry notes from Python 3.11 on.
NOTES = sys.version_info >= (3, 11)


def _notes(error: BaseException) -> str:
    return "\n".join(getattr(error, "__notes__", ()))


def test_the_fix_is_installed_and_listed():
    info = osc.support()
    assert TARGET in info.patched + info.fixes, info
    assert convert_frame._compile.__module__ == "opaque_subclass.fixes.dynamo_errors"


def test_library_error_types_keep_the_builtin_ones():
    assert issubclass(osc.OpaqueTypeError, TypeError) and issubclass(osc.OpaqueTypeError, osc.OpaqueSubclassError)
    assert issubclass(osc.OpaqueValueError, ValueError) and issubclass(osc.OpaqueValueError, osc.OpaqueSubclassError)
    assert issubclass(osc.OpaqueSubclassError, RuntimeError)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_bad_attribute_reaches_the_user_as_the_librarys_type_error(backend):
    """The issue's case: found while Dynamo builds the argument's variable."""
    f = torch.compile(lambda t: t + 1, backend=backend, fullgraph=True)
    with pytest.raises(osc.OpaqueTypeError) as info:
        f(_bad_attribute())
    e = info.value
    assert isinstance(e, TypeError) and isinstance(e, osc.OpaqueSubclassError)
    assert not isinstance(e, torch._dynamo.exc.TorchDynamoException)
    msg = str(e)
    # subclass, path, type found and fix; the same on every release
    assert msg.startswith(BAD_ATTRIBUTE + "\n"), msg
    # torch's context stays: the user's frame Dynamo was tracing
    assert "from user code:" in msg and HERE in msg, msg
    # its traceback ends where the library raised it, not in Dynamo's wrapper
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert tb.tb_frame.f_code.co_filename.startswith(os.path.dirname(osc.__file__)), tb.tb_frame.f_code


def test_except_type_error_still_catches_it():
    f = torch.compile(lambda t: t + 1, backend="aot_eager", fullgraph=True)
    try:
        f(_bad_attribute())
    except TypeError as e:
        caught: BaseException = e
    else:
        raise AssertionError("nothing raised")
    assert type(caught) is osc.OpaqueTypeError


def test_a_library_error_in_dispatch_while_dynamo_traces_is_raised_as_itself():
    """The default op rule of an ``OpaqueSubclass`` refuses two different meshes,
    in eager and when Dynamo runs the op on fake tensors (stock torch: a
    ``TorchRuntimeError`` naming ours only inside its text)."""
    f = torch.compile(lambda a, b: a + b, backend="aot_eager", fullgraph=True)
    x, y = Tagged(torch.ones(1), Mesh("a"), "t"), Tagged(torch.ones(1), Mesh("b"), "t")
    with pytest.raises(osc.OpaqueSubclassError) as eager:
        x + y
    torch._dynamo.reset()
    with pytest.raises(osc.OpaqueSubclassError) as info:
        f(x, y)
    e = info.value
    assert type(e) is type(eager.value) is osc.OpaqueSubclassError
    assert str(e) == str(eager.value), str(e)
    assert "whose '_mesh' are different subclasses.Mesh objects" in str(e) and "Fix:" in str(e)
    # the user's frame Dynamo was tracing, from torch's wrapper, as a note
    if NOTES:
        assert "torch.compile raised it while tracing this user code:" in _notes(e) and HERE in _notes(e), _notes(e)
    assert e.__context__ is None or not isinstance(e.__context__, torch._dynamo.exc.TorchDynamoException)


def test_a_library_error_while_the_backend_traces_is_raised_as_itself():
    """Raised while AOTAutograd traces (stock torch: ``BackendCompilerFailed``)."""
    f = torch.compile(lambda t: torch.mul(t, 2), backend="aot_eager", fullgraph=True)
    with pytest.raises(osc.OpaqueValueError, match=r"^_RaisesOursInBackend: mul is refused while tracing") as info:
        f(_pair(_RaisesOursInBackend))
    assert isinstance(info.value, ValueError)
    # torch's context stays: fx names the graph node and the user's line it came from
    assert "While executing %mul" in str(info.value) and HERE in str(info.value), str(info.value)


def test_a_library_error_in_dispatch_is_raised_once_without_fullgraph():
    """Without ``fullgraph`` the error is no graph break: it is raised as itself."""
    f = torch.compile(lambda t: torch.mul(t, 2) + 1, backend="aot_eager")
    with pytest.raises(osc.OpaqueValueError) as info:
        f(_pair(_RaisesOurs))
    assert str(info.value) == "_RaisesOurs: mul is refused. Fix: add instead.", str(info.value)
    if NOTES:
        assert HERE in _notes(info.value), _notes(info.value)


def test_other_errors_keep_torchs_wrappers():
    """Not the library's: exactly as stock torch raises them."""
    f = torch.compile(lambda t: t * 2, backend="aot_eager", fullgraph=True)
    with pytest.raises(InternalTorchDynamoError, match=r"^ZeroDivisionError: the user's own flatten failure") as info:
        f(_FlattenFails(torch.ones(2), Mesh("m")))
    assert type(info.value) is InternalTorchDynamoError

    torch._dynamo.reset()
    g = torch.compile(lambda t: torch.mul(t, 2), backend="aot_eager", fullgraph=True)
    with pytest.raises(TorchRuntimeError, match="the user's own failure") as wrapped:
        g(_pair(_RaisesTheirs))
    assert type(wrapped.value) is TorchRuntimeError


def test_graph_breaks_are_unchanged():
    def broken(t):
        t = t + 1
        torch._dynamo.graph_break()
        return t * 2

    with pytest.raises(Unsupported) as info:
        torch.compile(broken, backend="aot_eager", fullgraph=True)(torch.ones(2))
    assert type(info.value) is Unsupported
    torch._dynamo.reset()
    assert torch.equal(torch.compile(broken, backend="aot_eager")(torch.ones(2)), torch.full((2,), 4.0))


def test_suppress_errors_still_falls_back_to_eager():
    """``suppress_errors`` suppresses the library's error exactly as it suppressed
    Dynamo's wrapper: the frame runs eagerly (where nothing checks the attribute)."""
    f = torch.compile(lambda t: t + 1, backend="aot_eager")
    with torch._dynamo.config.patch(suppress_errors=True):
        out = f(_bad_attribute())
    assert type(out) is MeshTensor and out._mesh == 3 and torch.equal(out._data, torch.full((2,), 2.0))


def test_disable_removes_the_fix():
    """After ``disable()`` torch's own ``_compile`` is back and wraps the
    library's error as stock torch does; ``enable()`` installs the fix again."""
    try:
        osc.disable()
        torch._dynamo.reset()
        assert convert_frame._compile.__module__ == "torch._dynamo.convert_frame"
        assert TARGET not in osc.support().patched + osc.support().fixes
        f = torch.compile(lambda t: torch.mul(t, 2), backend="aot_eager", fullgraph=True)
        with pytest.raises(TorchRuntimeError) as info:
            f(_pair(_RaisesOurs))
        assert "_RaisesOurs: mul is refused" in str(info.value)
    finally:
        osc.enable()
        torch._dynamo.reset()
    assert convert_frame._compile.__module__ == "opaque_subclass.fixes.dynamo_errors"
    f = torch.compile(lambda t: torch.mul(t, 2), backend="aot_eager", fullgraph=True)
    with pytest.raises(osc.OpaqueValueError):
        f(_pair(_RaisesOurs))
