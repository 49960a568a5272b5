"""The run-time API mirrors torch's private AOTAutograd helpers under names of
its own (docs/core.md section 13): no public name of the library is the name of
another object in those modules, and the table maps each of ours to torch's."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch._dynamo  # noqa: F401  # before AOTAutograd's modules: torch's own import order needs it

import opaque_subclass as osc

ROOT = Path(__file__).resolve().parent.parent

#: torch modules whose names a tracer author may meet next to ours
TORCH_MODULES = (
    "torch._functorch._aot_autograd.subclass_utils",
    "torch._functorch._aot_autograd.schemas",
    "torch._functorch._aot_autograd.subclass_parametrization",
    "torch._opaque_base",
)


def _shared_names() -> dict[str, list[object]]:
    """Our public name -> the objects torch's modules bind to it (on this torch)."""
    shared: dict[str, list[object]] = {}
    for module_name in TORCH_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:  # a module of another release (torch._opaque_base before 2.14's rename)
            continue
        for name in osc.__all__:
            value = getattr(module, name, None)
            # A name torch merely imports from elsewhere (schemas' OpaqueBase) counts once.
            if value is not None and not any(value is v for v in shared.get(name, [])):
                shared.setdefault(name, []).append(value)
    return shared


def _documented() -> dict[str, str]:
    """Name -> the "how ours differs" cell of docs/core.md's section 13 table."""
    text = (ROOT / "docs" / "core.md").read_text()
    section = text[text.index("## 13. Who the run-time API is for") : text.index("## Errors")]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("name", "---"):
            continue
        for name in re.findall(r"`(\w+)`", cells[0]):
            rows[name] = cells[2]
    return rows


def test_the_table_is_parsed():
    rows = _documented()
    assert {"describe_args", "unwrap_args", "OpaqueSlot", "OpaqueBase"} <= set(rows), rows


def test_every_row_names_a_public_object():
    missing = sorted(name for name in _documented() if name not in osc.__all__)
    assert not missing, f"docs/core.md section 13 names {missing}, which opaque_subclass does not export"


def test_no_public_name_is_a_torch_name_of_another_object():
    """Our names are our own: where torch binds one of them (a module function or
    class, or a method of AOTDispatchAutograd, whose process_runtime_tangent our
    unwrap_tangent mirrors), it binds the very same object."""
    from torch._functorch._aot_autograd.runtime_wrappers import AOTDispatchAutograd

    clashes = [name for name, values in _shared_names().items() if any(v is not getattr(osc, name) for v in values)]
    clashes += [name for name in osc.__all__ if name in vars(AOTDispatchAutograd)]
    assert not clashes, f"opaque_subclass.{clashes} carry the names of other torch objects: rename them"


@pytest.mark.parametrize("name", sorted(_shared_names()))
def test_every_name_shared_with_torch_is_documented(name):
    rows = _documented()
    assert name in rows, (
        f"opaque_subclass.{name} has the name of a torch object in {TORCH_MODULES}; add a row for it to "
        "docs/core.md section 13 saying how it differs"
    )
    ours = getattr(osc, name)
    same = [t is ours for t in _shared_names()[name]]
    if rows[name].startswith("same object"):
        assert all(same), f"docs/core.md says opaque_subclass.{name} is torch's object; it is not"
    else:
        assert not any(same), f"opaque_subclass.{name} is torch's own object; docs/core.md must say 'same object'"
