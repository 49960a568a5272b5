"""#38 item 1: where the library raises in place of an error torch raises, its
exception is of torch's class and its message starts with torch's sentence, so
that code (and torch's own tests) matching torch's text still match; the
library's path, type and fix follow. One test per replaced message, on every
leg; on 2.12 - 2.15 each is compared with what stock torch raises for the same
program in the same process (the library disabled for that call)."""

from __future__ import annotations

import re

import pytest
import torch
from subclasses import Config, Gauge, GaugeTensor, MeshTensor

import opaque_subclass as osc
from opaque_subclass.releases import current


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _raised(fn) -> BaseException:
    with pytest.raises(Exception) as info:
        fn()
    return info.value


def _stock(fn) -> BaseException | None:
    """What torch raises for ``fn`` with the library disabled (torch 2.12+;
    ``None`` on 2.11, where torch has no such check)."""
    if current().release == (2, 11):
        return None
    torch._dynamo.reset()
    osc.disable()
    try:
        return _raised(fn)
    finally:
        osc.enable()
        torch._dynamo.reset()


def _first_line(error: BaseException) -> str:
    """torch's sentence: the first line of the innermost error Dynamo wrapped
    (``InternalTorchDynamoError`` re-raises as ``"<type>: <message>"``)."""
    inner = error
    while inner.__cause__ is not None:
        inner = inner.__cause__
    line = str(inner).strip().splitlines()[0]
    return re.sub(r"^\w+: ", "", line) if isinstance(inner, torch._dynamo.exc.InternalTorchDynamoError) else line


_TENSOR_ATTRS = "Only tensors and reference-type opaques are allowed in tensor attrs."


@pytest.mark.parametrize(("value", "name"), [(Config(8), "Config"), (3, "int")], ids=["value-opaque", "builtin"])
def test_a_non_tensor_in_tensor_attrs_keeps_torchs_runtime_error_and_sentence(value, name):
    def run():
        torch.compile(lambda t: t + 1, backend="eager", fullgraph=True)(MeshTensor(torch.ones(2), value))

    ours = _raised(run)
    assert isinstance(ours, RuntimeError) and isinstance(ours, osc.OpaqueTypeError)
    sentence = f"'{name}' found in tensor attrs of MeshTensor.__tensor_flatten__(). {_TENSOR_ATTRS}"
    assert str(ours).startswith(sentence), str(ours)
    assert "(path \"L['t']._mesh\")" in str(ours) and "Fix:" in str(ours)
    assert re.search(_TENSOR_ATTRS, str(ours))  # how torch's own tests match it
    stock = _stock(run)
    if stock is not None and name == "int":
        # for a builtin torch fails an internal assert of AOTAutograd's subclass walk (no designed error,
        # and none under python -O); the library raises the error torch designed for this case instead
        assert isinstance(stock, AssertionError), stock
        assert re.fullmatch(r"expected Tensor or (OpaqueBase|CustomClassBase), got <class 'int'>", _first_line(stock))
    elif stock is not None:
        assert isinstance(stock, RuntimeError)
        assert str(ours).startswith(_first_line(stock)), (_first_line(stock), str(ours))


def test_an_undeclared_member_keeps_torchs_error_class_and_sentence():
    """torch raises ``UnsafeScriptObjectError`` (Dynamo's, a ``RuntimeError``)
    for a member the registration does not declare; the library's
    ``OpaqueMemberError`` is one, with torch's sentence first, also without
    ``fullgraph`` (as torch's own test compiles it)."""

    def run():
        torch.compile(lambda t: t._data * t._gauge.other(), backend="eager")(GaugeTensor(torch.ones(2), Gauge(3)))

    ours = _raised(run)
    assert isinstance(ours, osc.OpaqueMemberError)
    assert isinstance(ours, torch._dynamo.exc.UnsafeScriptObjectError) and isinstance(ours, RuntimeError)
    assert str(ours).startswith("Attempted to access unregistered member on an OpaqueObject: "), str(ours)
    assert "'other' of subclasses.Gauge" in str(ours) and "Fix:" in str(ours)
    stock = _stock(run)
    if stock is not None:
        assert _first_line(stock).startswith("Attempted to access unregistered member on an OpaqueObject")
