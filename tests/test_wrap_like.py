"""``OpaqueSubclass.wrap_like`` takes exactly the inner tensors, and a mistake in an
op rule reaches the user through Python operators.

torch's binary operators (``Tensor.__mul__`` and the rest) turn a ``TypeError``
raised anywhere below them, ``__torch_dispatch__`` included, into
``NotImplemented``; Python then reports only ``unsupported operand type(s) for
*: 'QTensor' and 'int'``. So ``wrap_like`` raises ``OpaqueSubclassError``, and a
``TypeError`` escaping an op rule is re-raised as one, with the original chained.
"""

from __future__ import annotations

import re

import pytest
import torch
from subclasses import Mesh

import opaque_subclass as osc
from opaque_subclass import OpaqueSubclass, OpaqueSubclassError


class QTensor(OpaqueSubclass):
    """A quantized-like tensor: values and a per-tensor scale, both inner tensors."""

    tensor_attrs = ("_data", "_scale")
    opaque_attrs = {"_mesh": Mesh}
    meta_attrs = ("_tag",)


_FORGETS_SCALE = True


@QTensor.implements(torch.ops.aten.mul.Tensor)
def _mul(func, args, kwargs):
    a, b = args
    if _FORGETS_SCALE:
        return a.wrap_like(_data=func(a._data, b))  # the mistake: _scale is missing
    return a.wrap_like(_data=func(a._data, b), _scale=a._scale)


def _q() -> QTensor:
    return QTensor(torch.arange(4.0), torch.tensor(0.5), Mesh("m"), "q")


def test_missing_inner_tensor_through_an_operator_names_subclass_names_and_fix():
    x = _q()
    with pytest.raises(OpaqueSubclassError) as info:
        x * 2
    msg = str(info.value)
    assert msg.startswith("test_wrap_like.QTensor.wrap_like() takes exactly the inner tensors"), msg
    assert "tensor_attrs ('_data', '_scale')" in msg
    assert "It got _data=torch.Tensor:" in msg and "missing '_scale'" in msg
    assert "unsupported operand" not in msg
    fix = re.search(r"Fix: [^`]*`([^`]+)`", msg).group(1)
    assert fix == "x.wrap_like(_data=x._data, _scale=x._scale)"
    # The fix runs as written, with x the instance, and keeps its opaques and metadata.
    y = eval(fix, {"x": x})
    assert type(y) is QTensor and y._mesh is x._mesh and y._tag == "q"
    assert torch.equal(y._scale, x._scale) and torch.equal(y._data, x._data)


def test_the_corrected_rule_works_through_the_operator(monkeypatch):
    monkeypatch.setattr(__import__(__name__), "_FORGETS_SCALE", False)
    x = _q()
    y = x * 2
    assert type(y) is QTensor and y._mesh is x._mesh
    assert torch.equal(y._data, torch.arange(4.0) * 2) and torch.equal(y._scale, x._scale)


@pytest.mark.parametrize(
    "tensors, problem",
    [
        ({"_data": torch.ones(4), "_scale": 2.0}, "'_scale' is float, not a tensor"),
        (
            {"_data": torch.ones(4), "_scale": torch.tensor(1.0), "_mesh": Mesh("other")},
            "'_mesh' is an opaque attribute (the result keeps the instance's)",
        ),
        (
            {"_data": torch.ones(4), "_scale": torch.tensor(1.0), "_scael": torch.ones(1)},
            "'_scael' is not an attribute of QTensor",
        ),
        ({}, "missing '_data', '_scale'"),
    ],
)
def test_wrong_names_and_types_are_named(tensors, problem):
    with pytest.raises(OpaqueSubclassError) as info:
        _q().wrap_like(**tensors)
    assert problem in str(info.value)
    assert "Fix: pass every inner tensor" in str(info.value)


def test_a_type_error_in_an_op_rule_surfaces_through_the_operator():
    class Strict(OpaqueSubclass):
        tensor_attrs = ("_data",)

    @Strict.implements(torch.ops.aten.add.Tensor)
    def _add(func, args, kwargs):
        raise TypeError("the rule's own bug")

    x = Strict(torch.ones(2))
    with pytest.raises(OpaqueSubclassError) as info:
        x + 1
    assert isinstance(info.value.__cause__, TypeError)
    msg = str(info.value)
    assert "Strict" in msg and "aten.add.Tensor" in msg and "TypeError: the rule's own bug" in msg
    assert "NotImplemented" in msg  # says why it is not left a TypeError
    # The same through a function call, which never swallowed it: one error type either way.
    with pytest.raises(OpaqueSubclassError):
        torch.add(x, 1)


def test_wrap_like_is_still_the_hot_path_for_the_default_rule():
    class Plain(OpaqueSubclass):
        tensor_attrs = ("_a", "_b")

    x = Plain(torch.ones(2), torch.zeros(2))
    y = x + 1  # the default rule calls wrap_like with every inner tensor
    assert torch.equal(y._a, torch.full((2,), 2.0)) and torch.equal(y._b, torch.ones(2))
    assert osc.OpaqueSubclassError is OpaqueSubclassError
