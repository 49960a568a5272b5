"""support(): the mode on the running torch and version detection."""

import subprocess
import sys
import textwrap

import pytest
import torch

import opaque_subclass as osc
from opaque_subclass import releases as _versions
from opaque_subclass.releases import CUSTOM_CLASS_API, OPAQUE_OBJECT_API, parse_release, release_support
from opaque_subclass.testing import warm


def test_mode_matches_running_torch():
    info = osc.support()
    assert info.torch_version == torch.__version__
    release = parse_release(torch.__version__)
    if release >= (2, 12):
        assert info.mode == "native" and info.patched == ()
    elif release == (2, 11):
        assert info.mode == "backport" and info.fixes == ()
    else:
        assert info.mode == "unsupported"


@pytest.mark.parametrize(
    "version, mode, api, patches, fixes",
    [
        ("2.10.1", "unsupported", None, 0, 0),
        ("2.11.0+cu130", "backport", OPAQUE_OBJECT_API, 63, 0),
        ("2.12.0", "native", OPAQUE_OBJECT_API, 0, 30),
        ("2.13.0+cpu", "native", OPAQUE_OBJECT_API, 0, 26),
        ("2.14.1+cu130", "native", CUSTOM_CLASS_API, 0, 27),
        ("2.15.0", "native", CUSTOM_CLASS_API, 0, 24),
        ("1.13.0", "unsupported", None, 0, 0),
        ("garbage", "unsupported", None, 0, 0),
    ],
)
def test_version_table(monkeypatch, version, mode, api, patches, fixes):
    monkeypatch.setattr(_versions, "_has_native_opaque_attrs", lambda: True)
    row = release_support(version)
    assert (row.mode, row.registry, len(row.patches), len(row.fixes)) == (mode, api, patches, fixes)


def test_every_row_of_the_table_names_a_replacement_that_loads():
    """Each patch or fix row names its factory as ``module:function`` (the
    table is data): every one imports, is a ``make_`` factory with a docstring
    that names the torch function it replaces, and no release lists a target twice."""
    for row in _versions.RELEASES.values():
        targets = [p.target for p in (*row.patches, *row.fixes)]
        assert len(targets) == len(set(targets)), row.label
        for p in (*row.patches, *row.fixes):
            assert isinstance(p.make, str) and p.make.startswith("opaque_subclass."), p
            factory = p.factory()
            assert factory.__name__.startswith("make_"), p.make
            assert p.target.rsplit(".", 1)[-1] in p.doc, (p.make, p.target)


def test_supported_torch_is_derived_from_the_table():
    assert osc.SUPPORTED_TORCH == {
        (2, 11): "backport",
        (2, 12): "native",
        (2, 13): "native",
        (2, 14): "native",
        (2, 15): "native",
    }


def test_listed_native_release_without_the_feature_is_unsupported(monkeypatch):
    monkeypatch.setattr(_versions, "_has_native_opaque_attrs", lambda: False)
    assert release_support("2.14.0").mode == "unsupported"


def test_newer_release_is_native_when_torch_has_the_feature(monkeypatch):
    monkeypatch.setattr(_versions, "_has_native_opaque_attrs", lambda: False)
    assert release_support("2.16.0").mode == "unsupported"
    monkeypatch.setattr(_versions, "_has_native_opaque_attrs", lambda: True)
    row = release_support("2.16.0")
    assert row.mode == "native" and not row.tested and row.fixes == ()
    # the registry API of a newer release is the one its torch has
    assert row.registry is (CUSTOM_CLASS_API if CUSTOM_CLASS_API.is_available() else OPAQUE_OBJECT_API)


def test_fixes_are_listed_and_removed_by_disable():
    row = _versions.current()
    if not row.fixes:
        assert osc.support().fixes == ()
        return
    from opaque_subclass import activation

    fix_set = activation.FIXES
    assert fix_set is not None and fix_set.patches == row.fixes
    assert osc.support().fixes == tuple(p.target for p in fix_set.patches)
    try:
        assert osc.disable().fixes == () and not fix_set.enabled
    finally:
        assert osc.enable().fixes == tuple(p.target for p in fix_set.patches)


def test_import_twice_changes_nothing():
    code = (
        "import importlib, opaque_subclass as a; s1 = a.support(); "
        "import opaque_subclass as b; assert a is b and b.support() == s1; print(s1.mode)"
    )
    out = warm.run([sys.executable, "-c", code], timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("native", "backport")


def test_cli_exits_zero_and_reports():
    # --no-demo: the demo has its own tests (tests/test_demo.py, tests/test_torchrun.py), and every
    # nox leg starts with the whole `python -m opaque_subclass`, demo included
    out = warm.run([sys.executable, "-m", "opaque_subclass", "--no-demo"], timeout=300)  # forked, tests/conftest.py
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"torch           {torch.__version__}" in out.stdout
    assert f"mode            {osc.support().mode}" in out.stdout
    assert f"fixes           {len(osc.support().fixes)} torch function(s)" in out.stdout
    for name in osc.support().patched + osc.support().fixes:
        assert f"  - {name}\n" in out.stdout
    assert "0 failed" in out.stdout
    for check in (
        "compile: forward",
        "compile: backward",
        "compile: shared-opaque guard",
        "lint: group in a flatten context",
    ):
        assert f"[PASS] {check}" in out.stdout


def test_torch_210_gets_a_clear_refusal_without_importing_missing_modules():
    """torch 2.10 lacks torch._opaque_base (and 2.14's torch._custom_class_base):
    simulated here by hiding both modules and reporting version 2.10.0. Importing
    the library, defining an opaque class and running the CLI must not touch
    them; the CLI says why, what is supported and the fix, and exits 1."""
    code = textwrap.dedent(
        """
        import importlib.abc, sys, warnings
        MISSING = {"torch._opaque_base", "torch._custom_class_base"}

        class Hide(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name in MISSING:
                    raise ModuleNotFoundError(f"No module named {name!r}")
                return None

        import torch  # torch >= 2.11 imports them itself: hidden from here on

        sys.meta_path.insert(0, Hide())
        for name in MISSING:
            sys.modules.pop(name, None)
        torch.__version__ = "2.10.0"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import opaque_subclass as osc
        assert osc.support().mode == "unsupported", osc.support()
        assert any("torch 2.10.0 is not supported" in str(w.message) for w in caught), caught

        class Group(osc.OpaqueBase):  # the stand-in base class: defining still works
            pass

        try:
            osc.register_opaque(Group)
        except RuntimeError as e:
            assert "Fix: python -m pip install 'torch>=2.11'" in str(e), e
        else:
            raise AssertionError("register_opaque worked on an unsupported torch")
        from opaque_subclass.cli import main
        sys.exit(main(["--no-demo"]))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "mode            unsupported" in out.stdout
    assert "torch 2.10 is not supported: no opaque base class" in out.stdout
    assert "supported torch releases: 2.11 (backport), 2.12 (native)" in out.stdout
    assert "Fix: python -m pip install 'torch>=2.11'" in out.stdout
    assert "checks:" not in out.stdout
