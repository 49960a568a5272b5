"""Members of opaques in compiled code (``register_opaque(..., members=...)``):
every value evaluated on the real object while tracing is guarded, an
undeclared member is the library's named error, and the registration options
are torch's on every release."""

from __future__ import annotations

import re

import pytest
import torch
from scenarios import compiled_member_uses, compiled_undeclared_member
from subclasses import Gauge, GaugeTensor, GroupTensor, fake_world
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import guard_failures

import opaque_subclass as osc
from opaque_subclass.releases import current


def _reasons() -> list[str]:
    return [reason for reasons in guard_failures.values() for reason in reasons]


def _counted(fn, inputs):
    """Compile ``fn`` (aot_eager, fullgraph), call it on every input; return
    the outputs' first elements and the number of compilations."""
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    return [compiled(x)._data.item() for x in inputs], counter.frame_count


# ------------------------------------------------------------------ baked values are guarded


def test_group_size_is_guarded_and_groups_of_one_size_share_a_graph():
    """The issue's first row: ``t._group.size()`` compiled for a group of 4 and
    called with a group of 2 returns 2 (torch 2.12 - 2.15 alone return 4)."""
    import torch.distributed as dist

    with fake_world(4) as world:
        pairs = [dist.new_group([0, 1]) for _ in range(2)]
        groups = [world, pairs[0], pairs[1], world]
        inputs = [GroupTensor(torch.ones(1), g) for g in groups]
        guard_failures.clear()
        outputs, compilations = _counted(lambda t: t * t._group.size(), inputs)
        assert outputs == [4.0, 2.0, 2.0, 4.0]
        # one graph per distinct size; the second group of 2 reuses the first's
        assert compilations == 2
        assert "0/0: t._group.size() == 4" in _reasons(), _reasons()


def test_plain_program_on_groups_compiles_once():
    """A program that reads nothing from its group compiles once for every
    group (the group is a graph input, not a constant)."""
    import torch.distributed as dist

    with fake_world(4) as world:
        inputs = [GroupTensor(torch.ones(1), g) for g in (world, dist.new_group([0, 1]), dist.new_group([0, 1]))]
        outputs, compilations = _counted(lambda t: t * 2, inputs)
        assert outputs == [2.0, 2.0, 2.0]
        assert compilations == 1
        out = torch.compile(lambda t: t * 2, backend="aot_eager", fullgraph=True)(inputs[1])
        assert out._group is inputs[1]._group


def test_declared_method_is_guarded():
    assert compiled_member_uses(lambda t: t * t._gauge.factor(), [Gauge(3), Gauge(5), Gauge(3)]) == [3.0, 5.0, 3.0]


def test_guard_reads_the_member_again_and_reuses_the_graph_for_equal_values():
    inputs = [GaugeTensor(torch.ones(1), Gauge(f)) for f in (3, 3, 5, 3)]
    guard_failures.clear()
    outputs, compilations = _counted(lambda t: t * t._gauge.factor(), inputs)
    assert outputs == [3.0, 3.0, 5.0, 3.0]
    assert compilations == 2
    assert any("._gauge.factor() == 3" in r for r in _reasons()), _reasons()


def test_declared_attribute_is_guarded():
    assert compiled_member_uses(lambda t: t + t._gauge.offset, [Gauge(1, 2), Gauge(1, 7)]) == [3.0, 8.0]


def test_inlined_method_is_traced_and_reads_guarded_members():
    assert compiled_member_uses(lambda t: t + t._gauge.doubled(), [Gauge(1, 2), Gauge(1, 7)]) == [5.0, 15.0]


def test_member_guard_text():
    from opaque_subclass.fixes.members import member_guard_text

    assert member_guard_text("L['t']._g", "size", (), {}, 4) == "L['t']._g.size() == 4"
    assert member_guard_text("L['t']._m", "size", (0,), {"dim": 1}, 2) == "L['t']._m.size(0, dim=1) == 2"


# ------------------------------------------------------------------ undeclared members


def _library_message(error: BaseException) -> str:
    """Our message, read from Dynamo's wrapper (it re-raises ``f"{type}: {message}"``)."""
    text = str(error)
    prefix = "OpaqueMemberError: "
    assert isinstance(error, osc.OpaqueMemberError) or text.startswith(prefix), text
    return text.removeprefix(prefix)


# Dynamo re-raises an error from tracing as its wrapper, our message first.
RAISED_AS = (osc.OpaqueMemberError, torch._dynamo.exc.InternalTorchDynamoError)


def test_undeclared_member_is_a_named_error():
    with pytest.raises(RAISED_AS) as info:
        compiled_undeclared_member()
    message = _library_message(info.value)
    assert "'other' of subclasses.Gauge" in message
    assert "L['t']._gauge.other" in message
    assert re.search(r'File ".*scenarios\.py", line \d+: .*t\._gauge\.other\(\)', message), message
    assert 'register_opaque(Gauge, members={"other": opaque_subclass.Member.USE_REAL})' in message
    assert "Fix:" in message


def test_undeclared_member_fix_runs_as_written():
    """The message's fix, run for a class like ``Gauge`` that nobody registered
    yet, makes the same compiled code work."""
    with pytest.raises(RAISED_AS) as info:
        compiled_undeclared_member()
    fix = re.search(r"Fix: .*?`([^`]+)`", _library_message(info.value)).group(1)

    class Gauge(osc.OpaqueBase):  # the same name, as the fix spells it
        def other(self) -> int:
            return 7

    scope: dict[str, object] = {"Gauge": Gauge}
    exec(fix.replace("from subclasses import Gauge; ", ""), scope)

    from subclasses import _Wrapper

    class Holder(_Wrapper):
        INNER = ("_data",)
        OPAQUES = ("_gauge",)

    torch._dynamo.reset()
    f = torch.compile(lambda t: t * t._gauge.other(), backend="aot_eager", fullgraph=True)
    assert f(Holder(torch.ones(1), Gauge()))._data.item() == 7.0


def test_missing_attribute_is_left_to_torch():
    """An attribute the object does not have is no undeclared member: the
    library adds no error of its own (torch's AttributeError semantics)."""
    from opaque_subclass.fixes.members import check_declared

    class Variable:
        value = Gauge(1)
        source = None

    check_declared(Variable(), None, "no_such_member")  # no error
    with pytest.raises(osc.OpaqueMemberError, match="an opaque made in the graph"):
        check_declared(Variable(), None, "other")


# ------------------------------------------------------------------ registration options


def test_member_accepts_torchs_enum_and_its_values():
    from torch._library.opaque_object import MemberType

    assert osc.Member is MemberType
    assert set(osc.Member.__members__) == {"USE_REAL", "INLINED"}


class _Fresh(osc.OpaqueBase):
    pass


@pytest.mark.parametrize(
    ("options", "error", "pattern"),
    [
        ({"members": ["size"]}, TypeError, r"members must map member names .* got list\. Fix: "),
        ({"members": {"size": 1}}, TypeError, r"members\['size'\] is 1 \(int\).*Fix: "),
        ({"members": {"not a name": osc.Member.USE_REAL}}, TypeError, r"must be attribute names, got 'not a name'"),
        ({"guard": 3}, TypeError, r"guard must be a function .* got int\. Fix: "),
        ({"hoist": True}, ValueError, r"hoist lifts a \*value\* opaque .* Fix: "),
        ({"reconstruct": "f"}, TypeError, r"reconstruct must be a function .* got str\. Fix: "),
    ],
)
def test_bad_options_are_named(options, error, pattern):
    with pytest.raises(error, match=pattern):
        osc.register_opaque(_Fresh, **options)
    assert not osc.is_opaque(_Fresh)


def test_guard_on_a_value_opaque_is_refused():
    from subclasses import Config

    with pytest.raises(ValueError, match=r'kind="value", guard=...\): a value opaque is guarded by its __eq__'):
        osc.register_opaque(Config, kind="value", guard=lambda c: [])


def test_a_second_class_of_one_name_is_refused():
    """torch keys opaque types by qualified name; its own refusal was a bare RuntimeError."""

    def make():
        class Twin(osc.OpaqueBase):
            pass

        return Twin

    first, second = make(), make()
    osc.register_opaque(first)
    with pytest.raises(ValueError, match=r"another class of that name is registered already .* Fix: .*`class Twin2"):
        osc.register_opaque(second)
    assert not osc.is_opaque(second)


def test_options_reach_torchs_registry_entry():
    class Versioned(osc.OpaqueBase):
        def __init__(self, version: int) -> None:
            self.version = version

    guard = lambda obj: [obj.version]  # noqa: E731
    osc.register_opaque(Versioned, members={"version": "use_real"}, guard=guard)
    info = current().registry.torch_module()._OPAQUE_TYPES[Versioned]
    assert info.members == {"version": osc.Member.USE_REAL}
    assert info.guard_fn is guard
    osc.register_opaque(Versioned, members={"version": osc.Member.USE_REAL}, guard=guard)  # the same: no-op
    osc.register_opaque(Versioned)  # keeps the entry
    with pytest.raises(ValueError, match=r"registered already \(kind reference, members \['version'\], a guard\)"):
        osc.register_opaque(Versioned, members={"version": osc.Member.INLINED})


def test_guard_option_recompiles_when_its_values_change():
    class Versioned(osc.OpaqueBase):
        def __init__(self, version: int) -> None:
            self.version = version

    osc.register_opaque(Versioned, guard=lambda obj: [obj.version])
    from subclasses import _Wrapper

    class Held(_Wrapper):
        INNER = ("_data",)
        OPAQUES = ("_v",)

    inputs = [Held(torch.ones(1), Versioned(v)) for v in (1, 1, 2)]
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    f = torch.compile(lambda t: t * 2, backend=counter, fullgraph=True)
    for x in inputs:
        assert f(x)._v is x._v
    assert counter.frame_count == 2


def test_foreign_class_takes_options():
    """A class that does not inherit OpaqueBase is entered in torch's tables
    with its options too."""

    class Foreign:
        def scale(self) -> int:
            return 2

    osc.register_opaque(Foreign, members={"scale": osc.Member.USE_REAL})
    info = current().registry.torch_module()._OPAQUE_TYPES[Foreign]
    assert info.members == {"scale": osc.Member.USE_REAL}


@pytest.mark.skipif(current().release >= (2, 12), reason="torch 2.12 and newer have reconstruct_fn")
def test_reconstruct_is_refused_where_torch_lacks_it():
    with pytest.raises(ValueError, match=r"has no reconstruct hook .* Fix: register_opaque\(_Fresh\)"):
        osc.register_opaque(_Fresh, reconstruct=lambda obj, get_proxy, tracer: None)


@pytest.mark.skipif(current().release < (2, 12), reason="torch 2.11 has no reconstruct_fn")
def test_reconstruct_reaches_torch():
    class Rebuilt(osc.OpaqueBase):
        pass

    def rebuild(obj, get_proxy, tracer):
        return None

    osc.register_opaque(Rebuilt, reconstruct=rebuild)
    assert current().registry.torch_module()._OPAQUE_TYPES[Rebuilt].reconstruct_fn is rebuild
