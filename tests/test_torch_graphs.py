"""#38 item 2: with the library imported, the graph torch builds for a program
torch handles on its own is the graph stock torch builds, placeholder order
included. Compared in one process with the library disabled for the stock
compilation (torch 2.12 - 2.15); on 2.11, where stock torch cannot compile it,
the library gives the newer releases' graph."""

from __future__ import annotations

import pytest
import torch

import opaque_subclass as osc
from opaque_subclass import Member, OpaqueBase
from opaque_subclass.releases import current


class Box(OpaqueBase):
    """A reference opaque a custom op takes."""

    def __init__(self) -> None:
        self.items: list[torch.Tensor] = []


class Holder(OpaqueBase):
    """A reference opaque whose attribute ``inner`` (declared ``USE_REAL``) is another."""

    def __init__(self, inner: Box) -> None:
        self.inner = inner


class Gauge(OpaqueBase):
    """A reference opaque whose attribute ``v`` (declared ``USE_REAL``) is a plain value."""

    def __init__(self, v: object) -> None:
        self.v = v


osc.register_opaque(Box)
osc.register_opaque(Holder, members={"inner": Member.USE_REAL})
osc.register_opaque(Gauge, members={"v": Member.USE_REAL})


@torch.library.custom_op("osc_graphs::put", mutates_args=())
def put(box: Box, x: torch.Tensor) -> torch.Tensor:
    box.items.append(x)
    return x + 1


@put.register_fake
def _(box, x):
    return torch.empty_like(x)


def reads_then_uses(holder, x):
    inner = holder.inner  # read first: torch makes it a graph input where the code first uses it
    y = x.sin()
    return put(inner, y)


def _placeholders(fn, *args) -> list[str]:
    seen: list[list[str]] = []

    def backend(gm, example_inputs):
        seen.append([n.name for n in gm.graph.nodes if n.op == "placeholder"])
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    torch._dynamo.reset()
    (names,) = seen
    return names


def test_an_attribute_read_before_use_keeps_torchs_placeholder_order():
    """The member-read record of a ``USE_REAL`` attribute holding an opaque
    used to realize Dynamo's lazy variable at the read, so the opaque became
    the first graph input (torch 2.13: ``(holder.inner, x)`` where stock torch
    gives ``(x, holder.inner)``)."""
    args = (Holder(Box()), torch.ones(2))
    ours = _placeholders(reads_then_uses, *args)
    assert ours[0] == "l_x_" and len(ours) == 2, ours
    if current().release == (2, 11):
        return
    osc.disable()
    try:
        stock = _placeholders(reads_then_uses, *args)
    finally:
        osc.enable()
    assert ours == stock


class Shelf(OpaqueBase):
    """A reference opaque whose attribute ``boxes`` (declared ``USE_REAL``) is a list of opaques."""

    def __init__(self, boxes: list[Box]) -> None:
        self.boxes = boxes


osc.register_opaque(Shelf, members={"boxes": Member.USE_REAL})


def fills_each_box(shelf, x):
    for box in shelf.boxes:
        x = put(box, x)
    return x


def _stock_and_ours(fn, *args) -> tuple[list[str], list[str]]:
    ours = _placeholders(fn, *args)
    osc.disable()
    try:
        stock = _placeholders(fn, *args)
    finally:
        osc.enable()
    return stock, ours


@pytest.mark.skipif(current().release == (2, 11), reason="stock torch 2.11 cannot compile opaque members")
@pytest.mark.parametrize("program", ["one attribute", "a list attribute"])
def test_an_opaque_read_from_an_attribute_keeps_torchs_input_name(program):
    """torch 2.12's Dynamo traces an attribute read of an opaque through its
    fake wrapper's ``__getattribute__`` and names the graph input after that call
    (``object_getattribute_L_holder_inner_``; 2.13 and newer: ``l_holder_inner``).
    The library replaces that method to record member reads below Dynamo; the
    replacement used to be a descriptor Dynamo did not trace, which renamed the
    input on 2.12 (``l_holder_inner``) and changed the text of graphs torch's own
    tests compare. Names equal to stock's on every release."""
    if program == "one attribute":
        stock, ours = _stock_and_ours(reads_then_uses, Holder(Box()), torch.ones(2))
    else:
        stock, ours = _stock_and_ours(fills_each_box, Shelf([Box(), Box()]), torch.ones(2))
        assert len(ours) == 3, ours
    assert ours == stock


@pytest.mark.skipif(current().release == (2, 11), reason="stock torch 2.11 cannot compile opaque members")
def test_the_recompile_reason_of_an_attribute_member_is_torchs():
    """The guard on a plain value read from an opaque's attribute fails with
    stock torch's reason text, library or not (2.12:
    ``object.__getattribute__(g, 'v') == 3``, 2.13 and newer ``g.v == 3``)."""

    def reasons() -> list[str]:
        torch._dynamo.reset()
        f = torch.compile(lambda g, x: x * g.v, backend="eager", fullgraph=True)
        f(Gauge(3), torch.ones(1))
        f(Gauge(4), torch.ones(1))
        failures = torch._dynamo.utils.guard_failures
        found = [reason for reasons in failures.values() for reason in reasons if "== 3" in reason]
        torch._dynamo.reset()
        return found

    ours = reasons()
    osc.disable()
    try:
        stock = reasons()
    finally:
        osc.enable()
    assert ours and ours == stock, (stock, ours)


@pytest.mark.parametrize(
    ("first", "second", "use"),
    [(3, 4, lambda v: v), ("s", "long", len), ((1, 2), (1, 5), lambda v: v[1])],
    ids=["int", "str", "tuple"],
)
def test_a_plain_attribute_read_is_still_guarded_where_used(first, second, use):
    """An attribute holding a plain value, read without being realized early:
    Dynamo still guards it where the code uses it, so another value is not
    served the first one's graph."""
    counts = []

    def backend(gm, example_inputs):
        counts.append(1)
        return gm.forward

    torch._dynamo.reset()
    f = torch.compile(lambda g, x: x * use(g.v), backend=backend, fullgraph=True)
    assert f(Gauge(first), torch.ones(1)).item() == use(first)
    assert f(Gauge(second), torch.ones(1)).item() == use(second)
    assert len(counts) == 2
