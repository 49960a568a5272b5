"""support(): the mode on the running torch and version detection."""

import subprocess
import sys

import pytest
import torch

import opaque_subclass as osc
from opaque_subclass import mode as support_mod


def test_mode_matches_running_torch():
    info = osc.support()
    assert info.torch_version == torch.__version__
    release = support_mod._release(torch.__version__)
    if release >= (2, 12):
        assert info.mode == "native" and info.patched == ()
    elif release == (2, 11):
        assert info.mode == "backport"
    else:
        assert info.mode == "unsupported"


@pytest.mark.parametrize(
    "version, expected",
    [("2.11.0+cu130", "backport"), ("2.10.1", "unsupported"), ("1.13.0", "unsupported"), ("garbage", "unsupported")],
)
def test_detect(monkeypatch, version, expected):
    monkeypatch.setattr(torch, "__version__", version)
    assert support_mod._detect() == expected


def test_newer_torch_without_native_support_is_unsupported(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.14.0")
    monkeypatch.setattr(support_mod, "_has_native_opaque_attrs", lambda: False)
    assert support_mod._detect() == "unsupported"
    monkeypatch.setattr(support_mod, "_has_native_opaque_attrs", lambda: True)
    assert support_mod._detect() == "native"


def test_import_twice_changes_nothing():
    code = (
        "import importlib, opaque_subclass as a; s1 = a.support(); "
        "import opaque_subclass as b; assert a is b and b.support() == s1; print(s1.mode)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("native", "backport")


def test_cli_exits_zero_and_reports():
    out = subprocess.run([sys.executable, "-m", "opaque_subclass"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"torch           {torch.__version__}" in out.stdout
    assert f"mode            {osc.support().mode}" in out.stdout
    assert "0 failed" in out.stdout
    for check in ("compile: forward", "compile: backward", "compile: shared-opaque guard"):
        assert f"[PASS] {check}" in out.stdout
