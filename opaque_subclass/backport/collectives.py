"""Collectives on a process group held as an opaque attribute (torch 2.11).

Compiled code that passes a subclass's ``ProcessGroup`` (a registered
reference opaque, a graph input) to ``torch.distributed._functional_collectives``
or to ``torch.distributed.all_reduce`` (which Dynamo rewrites to the functional
form) runs torch's Python code on it while tracing. That code asks two
questions of the group that torch 2.11 answers wrongly for an opaque:

* ``isinstance(group, ProcessGroup)`` (``_resolve_group_name``): Dynamo sees
  torch's fake wrapper of the opaque (``FakeScriptObject``), not the group, so
  the answer is ``False`` and the collective raises ``ValueError: Unsupported
  group type``. torch 2.12+ gives its own opaque classes a metaclass whose
  ``__instancecheck__`` looks through the wrapper (``ProcessGroup`` and
  ``DeviceMesh`` derive from ``OpaqueBase`` there); torch 2.11's classes cannot
  be given one, so the answer is given where Dynamo evaluates ``isinstance``.
* ``group or dist.group.WORLD`` (``all_reduce_inplace``): truthiness looks up
  ``__bool__`` and ``__len__``, which a group neither declares nor has; torch
  2.11 stops with ``Attempted to access unregistered member on an
  OpaqueObject``, torch 2.12+ answers "no such attribute" and Python's default
  (an object is true) follows.

With both, the collective reads ``group.group_name`` (a declared member, read
on the real group and guarded by Dynamo) and the graph calls
``_c10d_functional`` with that name: one compilation per group name, as on
torch 2.12 - 2.15.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opaque_subclass.core.checks import source_name
from opaque_subclass.core.errors import import_fix, qualified_name
from opaque_subclass.core.registry import is_torch_own_opaque_type, opaque_kind, real_object
from opaque_subclass.fixes import members

__all__ = ["make_call_isinstance", "make_var_getattr"]


def _real_reference_opaque(variable: Any) -> object | None:
    """The real object behind a Dynamo variable wrapping torch's fake wrapper of
    a registered reference opaque; ``None`` for any other variable."""
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

    Without it, ``isinstance(obj, cls)`` in compiled code, ``obj`` being a
    registered ``ProcessGroup`` or ``DeviceMesh`` (classes that torch 2.11 does
    not derive from ``OpaqueBase``), tests torch's fake wrapper and is
    ``False``: ``funcol.all_reduce(x, "sum", t._group)`` fails with
    ``Unsupported: Observed exception ... ValueError: Unsupported group type``.
    With it, the test is made on the real object, as the metaclass of torch
    2.12+'s ``ProcessGroup`` and ``DeviceMesh`` does (pytorch/pytorch#176457 and
    its follow-ups made them opaque types deriving from ``OpaqueBase``). Other
    classes without ``OpaqueBase`` keep torch's answer, as on every release
    (docs/backport.md, limit (a)). The object is a graph
    input of a fixed type, so the answer holds for every call the graph serves.
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

    Without it, ``group or dist.group.WORLD`` in compiled code (torch's
    ``all_reduce_inplace``, reached by ``dist.all_reduce(x, group=t._group)``)
    fails with ``UnsafeScriptObjectError: Attempted to access unregistered
    member on an OpaqueObject ... '__bool__'``, and an undeclared member read
    is torch's error rather than the library's ``OpaqueMemberError``. With it,
    ``__bool__`` and ``__len__`` of an opaque that neither declares nor has them
    are "no such attribute" (Dynamo then treats the object as true, as Python
    does), as on torch 2.12+ (pytorch/pytorch#176457 and its follow-ups); an
    undeclared member is the library's named error.

    The same holds for a *value* opaque (a subclass's flatten context holding
    one, ``x._ctx.bits``): torch 2.11 reads an attribute of a value opaque in
    compiled code only when its registration declares it, and fails with
    ``InternalTorchDynamoError: UnsafeScriptObjectError`` otherwise; torch
    2.12+ reads it as a constant. With it, an undeclared member of a value
    opaque is the library's ``OpaqueMemberError`` naming the declaration that
    makes it compile on 2.11 (``Member.USE_REAL``: the value is compiled in, and
    the value opaque's equality guard covers it).
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
    """Raise the library's error when compiled code reads a member of a value
    opaque that its registration does not declare (torch 2.11 refuses it with
    an internal error; a missing attribute and protocols stay torch's)."""
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
    cls = type(real)
    where = f"at {source_name(variable.source)}.{name}, " if variable.source is not None else ""
    fix = import_fix(
        cls,
        f'opaque_subclass.register_opaque({{cls}}, kind="value", members={{{{"{name}": opaque_subclass.Member.USE_REAL}}}})',
    )
    raise members.undeclared_member_error()(
        f"{members.TORCH_SENTENCE}: compiled code reads {name!r} of the value opaque {qualified_name(cls)} "
        f"({where}{members.user_line(tx)}), a member its registration does not declare. torch 2.11 "
        f"compiles a member of a value opaque only when it is declared (torch 2.12+ reads it as a constant). "
        f"Fix: declare it where the class is registered (the first registration), {fix} (USE_REAL reads it "
        f"while tracing; the value opaque's equality guard covers it)."
    )
