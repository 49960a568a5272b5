"""Collectives on a process group held as an opaque attribute (torch 2.11).

Passing a subclass's registered ``ProcessGroup`` (a graph input) to
``torch.distributed._functional_collectives`` or ``torch.distributed.all_reduce``
in compiled code runs torch's Python code on it, which torch 2.11 answers
wrongly for an opaque twice:

* ``isinstance(group, ProcessGroup)`` (``_resolve_group_name``) sees the
  ``FakeScriptObject``: ``ValueError: Unsupported group type``. torch 2.12+'s
  ``OpaqueBase`` metaclass looks through the wrapper; 2.11's classes cannot
  get one, so the answer is given where Dynamo evaluates ``isinstance``.
* ``group or dist.group.WORLD`` (``all_reduce_inplace``) looks up ``__bool__``
  and ``__len__``: 2.11 stops with ``Attempted to access unregistered member on
  an OpaqueObject``; 2.12+ answers "no such attribute" (the object is true).

With both, the graph calls ``_c10d_functional`` with the guarded
``group.group_name``: one compilation per group name, as on torch 2.12 - 2.15.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opaque_subclass.backport import messages
from opaque_subclass.core.checks import source_name
from opaque_subclass.core.registry import is_torch_own_opaque_type, opaque_kind, real_object
from opaque_subclass.fixes import members

__all__ = ["make_call_isinstance", "make_var_getattr"]


def _real_reference_opaque(variable: Any) -> object | None:
    """The real reference opaque behind a Dynamo variable of its fake wrapper, else ``None``."""
    from torch._dynamo.variables.script_object import (  # type: ignore[attr-defined]  # torch 2.11's name; mypy reads torch 2.14+, which renamed it
        TorchScriptObjectVariable,
    )

    if not isinstance(variable, TorchScriptObjectVariable):
        return None
    value = getattr(variable, "value", None)
    if value is None:
        return None
    real = real_object(value)
    if real is value or opaque_kind(type(real)) != "reference":
        return None
    return real


def make_call_isinstance(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.variables.builtin.BuiltinVariable.call_isinstance``
    (torch 2.11).

    Without it, ``isinstance`` of a registered ``ProcessGroup`` or ``DeviceMesh``
    (not ``OpaqueBase`` on 2.11) tests the fake wrapper and is ``False``:
    ``funcol.all_reduce(x, "sum", t._group)`` fails with ``Unsupported: Observed
    exception ... ValueError: Unsupported group type``. With it, the real object
    is tested, as torch 2.12+'s metaclass does (pytorch/pytorch#176457 and
    follow-ups); other non-``OpaqueBase`` classes keep torch's answer
    (docs/backport.md, limit (a)). A graph input's type is fixed, so the answer
    holds for every call.
    """

    def call_isinstance(self: Any, tx: Any, arg: Any, isinstance_type_var: Any) -> Any:
        real = _real_reference_opaque(arg)
        if real is None or not is_torch_own_opaque_type(type(real)):
            return original(self, tx, arg, isinstance_type_var)
        from torch._dynamo.variables import ConstantVariable  # not at patch time: torch imports this module then

        try:
            classes = isinstance_type_var.as_python_constant()
            answer = isinstance(real, classes)
        except (NotImplementedError, TypeError):  # not a constant type: torch's own handling
            return original(self, tx, arg, isinstance_type_var)
        return ConstantVariable.create(answer)

    return call_isinstance


def make_var_getattr(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.variables.script_object.TorchScriptObjectVariable.var_getattr``
    (torch 2.11): the member check of the native releases
    (:func:`opaque_subclass.fixes.members.make_getattr`) and Python's
    truthiness of an opaque.

    Without it, ``group or dist.group.WORLD`` (``all_reduce_inplace``, reached
    by ``dist.all_reduce(x, group=t._group)``) fails with
    ``UnsafeScriptObjectError: Attempted to access unregistered member on an
    OpaqueObject ... '__bool__'``, and undeclared members get torch's error.
    With it, absent ``__bool__``/``__len__`` are "no such attribute" (the
    object is true), as on torch 2.12+ (pytorch/pytorch#176457 and follow-ups),
    and an undeclared member is ``OpaqueMemberError``.

    Likewise for a *value* opaque (``x._ctx.bits``): 2.11 reads only declared
    members (else ``InternalTorchDynamoError: UnsafeScriptObjectError``), 2.12+
    any as a constant; with it, the error names the ``Member.USE_REAL``
    declaration that compiles on 2.11 (covered by the equality guard).
    """
    checked = members.make_getattr(original)

    def var_getattr(self: Any, tx: Any, name: str) -> Any:
        _check_value_member_declared(self, tx, name)
        members.check_subclass_made_opaque(self, tx, name)
        if name in ("__bool__", "__len__"):
            from torch._dynamo.exc import raise_observed_exception
            from torch._library.opaque_object import get_member_type

            real = _real_reference_opaque(self)
            if real is not None and get_member_type(type(real), name) is None and not hasattr(real, name):
                raise_observed_exception(AttributeError, tx)
        return checked(self, tx, name)

    return var_getattr


def _check_value_member_declared(variable: Any, tx: Any, name: str) -> None:
    """Raise when compiled code reads an existing, undeclared member of a value opaque (2.11)."""
    from torch._dynamo.variables.script_object import (  # type: ignore[attr-defined]  # torch 2.11's name; mypy reads torch 2.14+, which renamed it
        TorchScriptObjectVariable,
    )
    from torch._library.opaque_object import get_member_type

    if name.startswith("__") or not isinstance(variable, TorchScriptObjectVariable):
        return
    value = getattr(variable, "value", None)
    real = None if value is None else real_object(value)
    if real is None or opaque_kind(real) != "value" or get_member_type(type(real), name) is not None:
        return
    if not hasattr(real, name):
        return
    source = source_name(variable.source) if variable.source is not None else None
    raise messages.value_member_undeclared(type(real), name, source, members.user_line(tx))
