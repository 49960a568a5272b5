"""register_opaque / is_opaque / opaque_kind on every supported torch."""

import enum
import logging
import subprocess
import sys

import pytest
import torch
from subclasses import Config, ForeignHandle, Mesh
from torch._library import opaque_object

import opaque_subclass as osc
from opaque_subclass import OpaqueBase
from opaque_subclass.releases import CUSTOM_CLASS_API, OPAQUE_OBJECT_API, current, parse_release

API = current().registry
RELEASE = parse_release(torch.__version__)


def _torch_typ(cls):
    """torch's own kind string for a registered class, in the running release's names."""
    return opaque_object._OPAQUE_TYPES[cls].opaque_typ


def test_registered_kinds():
    assert osc.opaque_kind(Mesh()) == "reference" and osc.is_opaque(Mesh)
    assert osc.opaque_kind(Config(1)) == "value"
    assert osc.opaque_kind(ForeignHandle()) == "reference"
    assert osc.opaque_kind(torch.ones(1)) is None and not osc.is_opaque(3)


def test_torch_sees_our_registrations():
    # In the running release's own names: "reference"/"value" up to torch 2.13,
    # "symbolic"/"constant" from torch 2.14.
    assert _torch_typ(Mesh) == API.kinds["reference"]
    assert _torch_typ(ForeignHandle) == API.kinds["reference"]
    assert _torch_typ(Config) == API.kinds["value"]
    for cls in (Mesh, ForeignHandle, Config):
        assert torch._C._is_opaque_type_registered(f"{cls.__module__}.{cls.__qualname__}")


def test_registry_api_matches_release():
    expected = CUSTOM_CLASS_API if RELEASE >= (2, 14) else OPAQUE_OBJECT_API
    assert API is expected
    assert OpaqueBase is API.base_class()
    assert type(OpaqueBase) is API.base_metaclass()
    assert callable(getattr(opaque_object, API.register))


@pytest.mark.parametrize("alias, kind", [("symbolic", "reference"), ("constant", "value")])
def test_torch_214_kind_names_are_aliases_on_every_release(alias, kind):
    class AliasedRef(OpaqueBase):
        pass

    class AliasedValue(OpaqueBase):
        def __eq__(self, other):
            return type(other) is AliasedValue

        def __hash__(self):
            return 0

        def __fx_repr__(self):
            return "AliasedValue()", {"AliasedValue": AliasedValue}

    Aliased = AliasedRef if kind == "reference" else AliasedValue

    osc.register_opaque(Aliased, kind=alias)
    assert osc.opaque_kind(Aliased()) == kind  # always the library's names
    osc.register_opaque(Aliased, kind=kind)  # the same kind under its other name: a no-op
    assert _torch_typ(Aliased) == API.kinds[kind]


def test_registering_never_logs_torch_deprecations(caplog):
    class Quiet(OpaqueBase):
        pass

    class QuietForeign:
        pass

    with caplog.at_level(logging.DEBUG, logger="torch"):
        osc.register_opaque(Quiet)
        osc.register_opaque(QuietForeign)
        assert osc.opaque_kind(Quiet()) == "reference" and osc.is_opaque(QuietForeign)
        osc.register_opaque(Quiet, kind="symbolic")
    assert not [r for r in caplog.records if "deprecated" in r.getMessage()], caplog.text


def test_import_never_logs_torch_deprecations():
    code = (
        "import opaque_subclass as osc\n"
        "class M(osc.OpaqueBase): pass\n"
        "osc.register_opaque(M)\n"
        "import opaque_subclass.cli.selfcheck\n"
        "print(osc.opaque_kind(M()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "reference"
    assert "deprecated" not in out.stderr, out.stderr


def test_subclass_of_registered_class_is_opaque():
    class SubMesh(Mesh):
        pass

    assert osc.opaque_kind(SubMesh()) == "reference"


def test_register_twice_same_kind_is_noop():
    class Once(OpaqueBase):
        pass

    osc.register_opaque(Once)
    osc.register_opaque(Once)
    assert osc.opaque_kind(Once) == "reference"


def test_register_other_kind_is_refused():
    with pytest.raises(
        ValueError, match='already registered as a reference opaque.*register_opaque\\(Mesh, kind="reference"\\)'
    ):
        osc.register_opaque(Mesh, kind="value")


def test_class_not_inheriting_opaque_base():
    class Handle:
        pass

    osc.register_opaque(Handle)
    assert osc.opaque_kind(Handle()) == "reference"
    assert torch._C._is_opaque_type_registered(f"{Handle.__module__}.{Handle.__qualname__}")


def test_tolerates_registration_made_by_torch():
    class TorchFirst(OpaqueBase):
        pass

    API.register_in_torch(TorchFirst, "reference")  # torch's own function, its own names
    osc.register_opaque(TorchFirst)  # no error
    with pytest.raises(ValueError, match="already registered"):
        osc.register_opaque(TorchFirst, kind="value")


@pytest.mark.parametrize(
    "bad, exc, pattern",
    [
        (int, TypeError, "builtins and tensors"),
        (torch.Tensor, TypeError, "builtins and tensors"),
        (Mesh(), TypeError, "expects a class, got an instance of subclasses.Mesh"),
    ],
)
def test_bad_classes(bad, exc, pattern):
    with pytest.raises(exc, match=pattern):
        osc.register_opaque(bad)


def test_bad_kind():
    class K(OpaqueBase):
        pass

    with pytest.raises(ValueError, match='kind must be "reference" or "value"') as info:
        osc.register_opaque(K, kind="ref")
    assert 'K, kind="reference")' in str(info.value) and '"symbolic" and "constant"' in str(info.value)


def test_value_type_protocol_is_checked_with_fix():
    class NoEq(OpaqueBase):
        pass

    with pytest.raises(TypeError) as info:
        osc.register_opaque(NoEq, kind="value")
    msg = str(info.value)
    assert "test_registry" in msg and "NoEq" in msg and "__eq__" in msg and "__fx_repr__" in msg
    assert 'register_opaque(NoEq, kind="reference")' in msg


def test_enum_value_type():
    class Color(enum.Enum):
        RED = 1

    osc.register_opaque(Color, kind="value")
    assert osc.opaque_kind(Color.RED) == "value"


def test_pytree_node_refused():
    from torch.utils import _pytree as pytree

    class Node:
        pass

    pytree.register_pytree_node(Node, lambda n: ([], None), lambda c, x: Node())
    with pytest.raises(TypeError, match="pytree node"):
        osc.register_opaque(Node)


def test_enum_registration_by_torch_matches_the_version_table():
    """torch >= 2.12 registers enum.Enum itself as a value opaque; 2.11 does not
    (a documented difference: see docs/compatibility.md)."""

    class Fresh(enum.Enum):
        A = 1

    documented = any("enum.Enum" in d.text for d in current().differences)
    if RELEASE >= (2, 12):
        assert osc.opaque_kind(Fresh.A) == "value" and not documented
    else:
        assert osc.opaque_kind(Fresh.A) is None and documented
        osc.register_opaque(Fresh, kind="value")
        assert osc.opaque_kind(Fresh.A) == "value"


@pytest.mark.parametrize("cls", [torch.dtype, torch.device, torch.layout, torch.Size, torch.nn.Linear])
def test_torchs_own_types_are_refused(cls):
    """Registering torch.dtype used to succeed, after which every compiled
    x.to(torch.float64) in the process failed, irreversibly."""
    with pytest.raises(TypeError, match="torch.compile handles") as info:
        osc.register_opaque(cls)
    assert "Fix: keep such a value in the flatten context" in str(info.value)
    assert not osc.is_opaque(cls)
    f = torch.compile(lambda x: x.to(torch.float64) * 2, backend="aot_eager", fullgraph=True)
    assert f(torch.ones(2)).dtype == torch.float64


def test_namedtuple_is_refused_as_a_pytree_node():
    import collections

    Pair = collections.namedtuple("Pair", "a b")
    with pytest.raises(TypeError, match="pytree node"):
        osc.register_opaque(Pair)


def test_subclass_of_registered_class_keeps_its_kind_whatever_was_looked_up():
    """The kind of a subclass follows its registered base, whether or not
    opaque_kind was asked about it first."""

    class Fresh(OpaqueBase):
        pass

    class SubA(Fresh):
        pass

    class SubB(Fresh):
        pass

    osc.register_opaque(Fresh)
    assert osc.opaque_kind(SubA) == "reference"  # looked up first (cached)
    for sub in (SubA, SubB):  # SubB never looked up
        with pytest.raises(ValueError, match="already registered as a reference opaque"):
            osc.register_opaque(sub, kind="value")
        osc.register_opaque(sub, kind="reference")
        assert osc.opaque_kind(sub) == "reference"
