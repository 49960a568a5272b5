"""Both packages ship their annotations (PEP 561): a ``py.typed`` marker in each,
declared as package data in ``pyproject.toml`` so that a wheel carries it too.
Without the marker, mypy ignores the library's annotations in a user's project.
"""

from __future__ import annotations

import ast
import importlib.resources
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("opaque_subclass", "compile_passes")


def _package_data() -> dict[str, list[str]]:
    """``[tool.setuptools.package-data]`` of the checkout's ``pyproject.toml``."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    try:
        if sys.version_info >= (3, 11):
            import tomllib
        else:
            import tomli as tomllib
    except ImportError:  # Python 3.10 without tomli: read the one table by hand
        table = re.search(r"^\[tool\.setuptools\.package-data\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
        assert table is not None, "pyproject.toml has no [tool.setuptools.package-data] table"
        entries = re.findall(r"^(\w+)\s*=\s*(\[.*?\])", table.group(1), re.M)
        return {key: ast.literal_eval(value) for key, value in entries}
    return tomllib.loads(text)["tool"]["setuptools"].get("package-data", {})


@pytest.mark.parametrize("package", PACKAGES)
def test_py_typed_marker_is_in_the_package(package: str) -> None:
    marker = importlib.resources.files(package) / "py.typed"
    assert marker.is_file(), f"{package} has no py.typed marker (PEP 561); create {package}/py.typed (empty)"


@pytest.mark.parametrize("package", PACKAGES)
def test_pyproject_declares_py_typed_as_package_data(package: str) -> None:
    data = _package_data()
    assert "py.typed" in data.get(package, []), (
        f"[tool.setuptools.package-data] in pyproject.toml does not list py.typed for {package} "
        f'(found {data!r}); a wheel would leave the marker out. Fix: {package} = ["py.typed"]'
    )


def test_the_fallback_reader_agrees_with_tomllib(monkeypatch: pytest.MonkeyPatch) -> None:
    # the hand reader used on Python 3.10 without tomli gives what tomllib gives
    expected = _package_data()
    monkeypatch.setitem(sys.modules, "tomllib", None)
    monkeypatch.setitem(sys.modules, "tomli", None)
    assert _package_data() == expected
