"""tools/torch_tests.py (#38 item 3): runs a torch test file stock and with the
library, and names the tests that fail only with the library. Checked on a
stand-in test file written here (torch's own files stay outside the project):
one test that fails whenever the library is imported, one it fixes, one that
fails either way, one that passes either way."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_TOOL = Path(__file__).resolve().parents[1] / "tools" / "torch_tests.py"

_STAND_IN = """
import sys
import unittest


class TestStandIn(unittest.TestCase):
    def test_breaks_with_the_library(self):
        if "opaque_subclass" in sys.modules:
            self.fail("a changed behaviour")

    def test_fixed_by_the_library(self):
        self.assertIn("opaque_subclass", sys.modules)

    def test_fails_either_way(self):
        self.assertEqual(1, 2)

    def test_passes(self):
        self.assertTrue(True)
"""


def _tool():
    spec = importlib.util.spec_from_file_location("torch_tests_tool", _TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_tool_names_the_tests_that_fail_only_with_the_library(tmp_path, capsys):
    test_file = tmp_path / "test_stand_in.py"
    test_file.write_text(_STAND_IN)
    out = tmp_path / "out.json"
    status = _tool().main([str(test_file), "--python", sys.executable, "--json", str(out), "--timeout", "300"])
    printed = capsys.readouterr().out
    assert status == 1, printed
    report = json.loads(out.read_text())
    (result,) = report["files"].values()
    assert result["only_with_library"] == ["TestStandIn.test_breaks_with_the_library"]
    assert result["fixed_by_library"] == ["TestStandIn.test_fixed_by_the_library"]
    assert result["failing_both"] == ["TestStandIn.test_fails_either_way"]
    assert result["stock"]["TestStandIn.test_passes"]["result"] == "passed"
    assert "4 tests; failed: stock 2, with the library 2; failing only with the library: 1;" in printed
    assert result["failing_differently"] == []
    assert "a changed behaviour" in printed  # the failure's first line, with the test's name


def test_a_file_that_does_not_collect_is_a_problem_not_a_pass(tmp_path, capsys):
    test_file = tmp_path / "test_broken.py"
    test_file.write_text("import a_module_that_does_not_exist\n")
    status = _tool().main([str(test_file), "--python", sys.executable, "--timeout", "300"])
    printed = capsys.readouterr().out
    assert status == 2, printed
    assert "stock run: exit" in printed and "library run: exit" in printed


@pytest.mark.parametrize("argv", [["--help"]])
def test_the_tool_has_its_usage(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        _tool().main(argv)
    assert stop.value.code == 0
    assert "torch's own tests" in capsys.readouterr().out.replace("\n", " ")


def test_failures_that_differ_only_in_object_addresses_are_alike():
    tool = _tool()
    stock = tool.Run("stock", {"T.a": tool.Outcome("failed", "AssertionError: <Counter object at 0x7f7d41e41550>")})
    same = tool.Run("library", {"T.a": tool.Outcome("failed", "AssertionError: <Counter object at 0x7fcaac444a90>")})
    other = tool.Run("library", {"T.a": tool.Outcome("failed", "AssertionError: <Queue object at 0x7fcaac444a90>")})
    assert tool.compare(stock, same)["failing_differently"] == []
    assert tool.compare(stock, other)["failing_differently"] == ["T.a"]
