"""The package layout is the architecture (docs/architecture.md): every import
points down the layer picture, no module imports itself back through others,
and nothing on a per-call path imports inside a function.

Read from the source with ``ast``: nothing is imported or executed.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("opaque_subclass", "compile_passes")

#: Layers, lowest first. A module may import its own layer's modules and any
#: lower layer's, never a higher one's. Keys are module-name prefixes; the
#: longest matching prefix decides.
LAYERS: dict[str, int] = {
    "opaque_subclass.patching": 0,
    "opaque_subclass.releases": 0,
    "opaque_subclass.mode": 0,
    "opaque_subclass.gate": 0,
    "opaque_subclass._version": 0,
    "opaque_subclass.core": 1,
    "opaque_subclass.authoring": 2,
    "opaque_subclass.adoption": 2,
    "opaque_subclass.modules": 2,
    "opaque_subclass.backport": 2,
    "opaque_subclass.fixes": 2,
    "opaque_subclass.export": 2,
    "opaque_subclass.testing": 3,
    "opaque_subclass.sharded": 3,
    "opaque_subclass.dtensor": 3,
    "opaque_subclass.dtensor_ops": 3,
    "opaque_subclass.activation": 3,
    "opaque_subclass": 4,  # the package itself: the public API
    "opaque_subclass.cli": 5,
    "opaque_subclass.__main__": 5,
    "compile_passes": 6,
}

_LIBRARY = (
    "opaque_subclass.core",
    "opaque_subclass.authoring",
    "opaque_subclass.adoption",
    "opaque_subclass.modules",
    "opaque_subclass.backport",
    "opaque_subclass.fixes",
    "opaque_subclass.export",
    "opaque_subclass.activation",
    "opaque_subclass.mode",
)

#: Who may import whom across concerns of one layer (beyond the layer rule).
#: The release table is data (it names replacements, never imports them) and
#: the patch machinery knows nothing of the library; the core stays free of
#: torch-version code; the patches (backport, fixes) and the features of
#: layer 2 are independent of each other.
FORBIDDEN = {
    "opaque_subclass.patching": (*_LIBRARY, "opaque_subclass.releases"),
    "opaque_subclass.releases": _LIBRARY,
    # the version check runs before anything release-specific (tests/test_gate.py)
    "opaque_subclass.gate": tuple(p for p in _LIBRARY if p != "opaque_subclass.mode"),
    "opaque_subclass.core": (
        "opaque_subclass.backport",
        "opaque_subclass.fixes",
        "opaque_subclass.activation",
        "opaque_subclass.export",
        "opaque_subclass.patching",
    ),
    "opaque_subclass.authoring": (
        "opaque_subclass.backport",
        "opaque_subclass.fixes",
        "opaque_subclass.modules",
        "opaque_subclass.export",
        "opaque_subclass.adoption",
    ),
    "opaque_subclass.adoption": (
        "opaque_subclass.backport",
        "opaque_subclass.fixes",
        "opaque_subclass.authoring",
        "opaque_subclass.modules",
        "opaque_subclass.export",
    ),
    "opaque_subclass.modules": (
        "opaque_subclass.backport",
        "opaque_subclass.fixes",
        "opaque_subclass.authoring",
        "opaque_subclass.export",
        "opaque_subclass.adoption",
    ),
    "opaque_subclass.export": (
        "opaque_subclass.backport",
        "opaque_subclass.fixes",
        "opaque_subclass.authoring",
        "opaque_subclass.modules",
        "opaque_subclass.adoption",
    ),
    "opaque_subclass.backport": (
        "opaque_subclass.authoring",
        "opaque_subclass.modules",
        "opaque_subclass.export",
        "opaque_subclass.adoption",
    ),
    "opaque_subclass.fixes": (
        "opaque_subclass.authoring",
        "opaque_subclass.modules",
        "opaque_subclass.export",
        "opaque_subclass.backport",
        "opaque_subclass.adoption",
    ),
}

#: Packages whose code runs per compiled call or per dispatched op: no
#: function-level imports of the library there.
HOT = ("opaque_subclass.core", "opaque_subclass.authoring", "opaque_subclass.adoption", "opaque_subclass.modules")

#: The function-level imports of the library that remain, and why each is lazy.
LAZY_OK = {
    # torch.export is heavy and not imported by `import opaque_subclass`; the
    # 2.11 archive patch needs export's name class only when a program is saved.
    ("opaque_subclass.backport.archive", "opaque_subclass.export.archive"),
    # the CLI imports its sections when they run (the demo needs torch.distributed)
    ("opaque_subclass.cli", "opaque_subclass.cli.selfcheck"),
    ("opaque_subclass.cli", "opaque_subclass"),
    ("opaque_subclass.cli", "opaque_subclass.releases"),
    ("opaque_subclass.cli", "opaque_subclass.cli.demo"),
    # the self-check's lint check runs compile_passes, which stands on top of the library
    ("opaque_subclass.cli.selfcheck", "compile_passes"),
    # the demo's module is imported by the CLI in processes without torch.distributed;
    # its rank bodies import the sharded tensor and the library in the worker process
    ("opaque_subclass.cli.demo", "opaque_subclass.sharded.plan"),
    ("opaque_subclass.cli.demo", "opaque_subclass.sharded.tensor"),
    ("opaque_subclass.cli.demo", "opaque_subclass"),
    # importing the sharded tensor defines no custom op: the collective ops are defined by the
    # import of their module, on their first use (tests/test_import.py)
    ("opaque_subclass.sharded.collectives", "opaque_subclass.sharded.collective_ops"),
    # likewise for the ops share_compiles puts in place of DTensor's collectives
    ("opaque_subclass.dtensor", "opaque_subclass.dtensor_ops"),
}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _target(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, bool]]:
    """``(imported module, inside a function)`` for each import of the library in ``module``."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def in_function(node: ast.AST) -> bool:
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return True
        return False

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _target(module, path.name == "__init__.py", node)
            # `from pkg import sub` imports the submodule pkg.sub when there is one
            names = [f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PACKAGES and name != module:
                # a name inside a module resolves to that module
                while name not in MODULES and "." in name:
                    name = name.rsplit(".", 1)[0]
                out.append((name, in_function(node)))
    return out


def _layer(module: str) -> tuple[str, int]:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return best, LAYERS[best]


def test_every_module_has_a_layer():
    assert len(MODULES) > 40
    for module in MODULES:
        assert _layer(module)[1] >= 0


def _violations(edges: dict[str, list[tuple[str, bool]]]) -> list[str]:
    wrong = []
    for module, targets in edges.items():
        own_key, own = _layer(module)
        for target, _lazy in targets:
            if (module, target) in LAZY_OK:
                continue
            key, layer = _layer(target)
            if layer > own:
                wrong.append(f"{module} (layer {own}, {own_key}) imports {target} (layer {layer}, {key})")
            for prefix, banned in FORBIDDEN.items():
                if module.startswith(prefix) and target.startswith(banned):
                    wrong.append(f"{module} imports {target}: {prefix} must not import {banned}")
    return wrong


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    cycles: list[list[str]] = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        stack.append(m)
        for t in graph.get(m, []):
            if state.get(t) == 1:
                cycles.append([*stack[stack.index(t) :], t])
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    return cycles


def test_imports_point_down_the_layers():
    wrong = _violations({m: _imports(m) for m in MODULES})
    assert wrong == [], "\n".join(wrong)


def test_no_import_cycles():
    graph = {m: sorted({t for t, lazy in _imports(m) if not lazy}) for m in MODULES}
    cycles = _cycles(graph)
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


def test_no_function_level_imports_on_hot_paths():
    lazy = [(m, t) for m in MODULES for t, is_lazy in _imports(m) if is_lazy]
    hot = [f"{m} imports {t} inside a function" for m, t in lazy if m.startswith(HOT)]
    assert hot == [], "\n".join(hot)
    unexplained = [f"{m} imports {t} inside a function" for m, t in lazy if (m, t) not in LAZY_OK]
    assert unexplained == [], "\n".join(unexplained) + "\n(add it to LAZY_OK with the reason, or import at the top)"


#: The module globals rebound after import (``global`` statements), each with why it is not state
#: of the activation value or the recorder (core/recorder.py).
GLOBALS_OK = {
    ("opaque_subclass.activation", "_STATE"): "the activation value, swapped whole under one lock",
}


def _rebound_globals(source: str) -> set[str]:
    return {name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Global) for name in node.names}


def test_no_module_global_is_rebound_but_the_listed():
    found = {(m, name) for m, path in MODULES.items() for name in _rebound_globals(path.read_text())}
    assert found - set(GLOBALS_OK) == set(), "add the reason to GLOBALS_OK, or keep the state in the recorder"
    assert set(GLOBALS_OK) - found == set(), "GLOBALS_OK lists a global no longer rebound: drop it"


def _string_lines(source: str) -> tuple[int, int]:
    """(lines, lines holding nothing but string literals: docstrings, messages) of ``source``."""
    strings: set[int] = set()
    code: set[int] = set()
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    f_string = {getattr(tokenize, n, -1) for n in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END")}
    depth = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in skip:
            continue
        depth += tok.type == getattr(tokenize, "FSTRING_START", -1)
        lines = range(tok.start[0], tok.end[0] + 1)
        if tok.type == tokenize.STRING or tok.type in f_string or depth:
            strings.update(lines)
        elif not (tok.type == tokenize.OP and tok.string in "(),+%"):
            code.update(lines)
        depth -= tok.type == getattr(tokenize, "FSTRING_END", -1)
    return len(source.splitlines()), len(strings - code)


#: The most of the library's lines that may be prose (docstrings and messages): logic first.
STRING_SHARE_MAX = 0.30


def test_prose_stays_under_its_share_of_the_library():
    counts = [_string_lines(path.read_text()) for path in MODULES.values()]
    lines, strings = sum(c[0] for c in counts), sum(c[1] for c in counts)
    assert strings / lines < STRING_SHARE_MAX, f"{strings} of {lines} lines are strings ({strings / lines:.1%})"


def test_the_checks_can_fail():
    assert _string_lines('x = 1\n"""doc\nmore"""\ny = f"a{x}"\nraise E(\n    "m"\n    f"n {x}"\n)\n') == (8, 4)
    assert _rebound_globals("def f():\n    global X\n    X = 1\n") == {"X"}
    # an upward import, a forbidden one and a cycle, in synthetic graphs
    assert _violations({"opaque_subclass.core.walk": [("opaque_subclass.authoring.base", False)]})
    assert _violations({"opaque_subclass.core.walk": [("opaque_subclass.backport.fake", False)]})
    assert _violations({"opaque_subclass.backport.fake": [("opaque_subclass.export.archive", False)]})
    assert not _violations({"opaque_subclass.backport.fake": [("opaque_subclass.core.walk", False)]})
    assert _violations({"opaque_subclass.releases.v2_13": [("opaque_subclass.fixes.members", False)]})
    assert _violations({"opaque_subclass.patching": [("opaque_subclass.core.walk", False)]})
    assert _violations({"opaque_subclass.fixes.members": [("opaque_subclass.backport.dynamo", False)]})
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"]}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": ["b"], "b": ["c"], "c": []}) == []
    # relative imports resolve like Python resolves them
    node = ast.parse("from ..backport import patching").body[0]
    assert isinstance(node, ast.ImportFrom)
    assert _target("opaque_subclass.core.walk", False, node) == "opaque_subclass.backport"
    assert _target("opaque_subclass.core", True, node) == "opaque_subclass.backport"


def test_docs_layer_table_matches():
    import re

    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = dict(re.findall(r"^\| `([\w.]+)` \| (\d) \|$", text, re.M))
    assert {k: int(v) for k, v in rows.items()} == LAYERS
