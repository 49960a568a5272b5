"""The patch machinery: fingerprinted, all-or-nothing, exactly reversible.

A :class:`Patch` names a torch function (or method), the fingerprint of its
source, and a factory building the replacement from the original.
:class:`PatchSet` applies a list of them:

* every target is resolved and fingerprinted first; one mismatch refuses the
  whole set (nothing is patched);
* a function imported by name elsewhere (``from .x import f``) is replaced in
  every torch module holding the same object;
* :meth:`PatchSet.disable` puts the very originals back; both are idempotent;
* a target whose module is not imported yet is fingerprinted from its source
  file (parsed, not run) and patched when torch imports it (a ``sys.meta_path``
  hook), so ``import opaque_subclass`` imports no Dynamo, AOTAutograd, inductor
  or export;
* a target another package replaced first is built over when that function
  wraps torch's original (``__wrapped__`` or closure, recorded fingerprint) and
  the factory is marked :func:`composes`; otherwise it is *blocked*: a set of
  independent fixes applies the others and names it, a one-feature set is
  refused. :meth:`PatchSet.disable` leaves a patch installed over ours
  afterwards in place, ours beneath it (:attr:`PatchSet.held`);
* parsing is most of the import cost (0.55 s of 0.66 s on torch 2.11), so a
  release row may record each read file's digest (:func:`record_sources`): all
  files unchanged (hashed), the recorded fingerprints are used; one changed,
  every fingerprint is parsed the exact way.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.abc
import importlib.util
import inspect
import logging
import os
import sys
import textwrap
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

__all__ = [
    "OtherPatch",
    "Patch",
    "PatchRefused",
    "PatchSet",
    "attribute_fingerprint",
    "composes",
    "file_digest",
    "fingerprint",
    "record_sources",
]

log = logging.getLogger(__name__)


def fingerprint(obj: Any) -> str:
    """A short hash of an object's source text (dedented), stable across Python versions."""
    source = textwrap.dedent(inspect.getsource(obj))
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def _inherited_text(attr: str, class_source: str) -> str:
    return hashlib.sha256(f"{attr} inherited from a builtin by:\n{class_source}".encode()).hexdigest()[:16]


def _builtin_inherited(owner: Any, attr: str) -> bool:
    """Whether the class ``owner`` takes ``attr`` from a builtin type (``type``,
    ``object``): no Python class of its MRO defines it (a metaclass's ``__call__``)."""
    if not isinstance(owner, type):
        return False
    for klass in owner.__mro__:
        if attr in vars(klass):
            return klass.__module__ == "builtins"
    return False


def attribute_fingerprint(owner: Any, attr: str) -> str:
    """:func:`fingerprint` of ``owner.attr``; for one inherited from a builtin
    type (no source), a fingerprint of the class's source saying so."""
    if _builtin_inherited(owner, attr):
        return _inherited_text(attr, textwrap.dedent(inspect.getsource(owner)))
    return fingerprint(_function(_raw(owner, attr)))


_F = TypeVar("_F", bound=Callable[..., Any])


def composes(factory: _F) -> _F:
    """Mark a factory whose replacement calls ``original`` for all it does not
    change, copying none of torch's body, so it can be built over another
    package's replacement that wraps torch's original (see :class:`PatchSet`).
    Calls it does change do not reach the other package's function."""
    factory.composes = True  # type: ignore[attr-defined]  # a marker read by Patch.composes
    return factory


@dataclass(frozen=True)
class OtherPatch:
    """Another package's replacement of a torch function one of our patches targets.

    Attributes
    ----------
    target
        The torch function's qualified name.
    function
        The other package's function there (``module.qualname``).
    package
        Its top-level package (``physicsnemo``).
    wraps_original
        Whether its ``__wrapped__`` or closure holds a function with the patch's fingerprint.
    """

    target: str
    function: str
    package: str
    wraps_original: bool

    def __str__(self) -> str:
        return f"{self.target} (replaced by {self.package}: {self.function})"


def _is_ours_or_torchs(module: str) -> bool:
    return module.split(".")[0] in ("torch", "opaque_subclass", "_opaque_subclass_pickle")


def _wrapped_functions(fn: Any, depth: int = 3) -> Iterator[Any]:
    """Functions ``fn`` wraps (``__wrapped__`` chain, closure), ``depth`` levels down."""
    todo, seen = [(fn, 0)], {id(fn)}
    while todo:
        obj, level = todo.pop()
        inner = [getattr(obj, "__wrapped__", None)]
        inner += [_cell_contents(c) for c in getattr(obj, "__closure__", None) or ()]
        for value in inner:
            value = _function(value)
            if callable(value) and id(value) not in seen:
                seen.add(id(value))
                yield value
                if level + 1 < depth:
                    todo.append((value, level + 1))


def _cell_contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _foreign_module(current: Any) -> str | None:
    """The module of ``current``'s function when neither torch's nor ours, else ``None``."""
    module = getattr(_function(current), "__module__", None)
    if not isinstance(module, str) or _is_ours_or_torchs(module):
        return None
    return module


def other_patch(target: str, current: Any, expected: str) -> OtherPatch | None:
    """The other package's replacement at ``target``; ``None`` if torch's or ours."""
    module = _foreign_module(current)
    if module is None:
        return None
    fn = _function(current)
    wraps = False
    for inner in _wrapped_functions(fn):
        inner_module = getattr(inner, "__module__", None)
        if isinstance(inner_module, str) and inner_module.split(".")[0] == "torch":
            with suppress(OSError, TypeError):
                if fingerprint(inner) == expected:
                    wraps = True
                    break
    name = getattr(fn, "__qualname__", type(fn).__qualname__)
    return OtherPatch(target, f"{module}.{name}", module.split(".")[0], wraps)


@dataclass(frozen=True)
class Patch:
    """One replaced torch function.

    Attributes
    ----------
    target
        Qualified name: ``"torch._subclasses.fake_tensor.is_fake"``, or a method
        ``"torch.fx.experimental.symbolic_shapes.ShapeEnv.produce_guards_verbose"``.
    fingerprint
        :func:`fingerprint` of the original the replacement was written against.
    make
        The factory ``make(original) -> replacement``, or ``"package.module:function"``
        (as the data-only tables in :mod:`opaque_subclass.releases` name it;
        imported on enable). Its docstring says what the patch does.
    depends_on
        ``(qualified name, fingerprint)`` of torch functions the replacement
        relies on without replacing (e.g. a caller of the target); checked like
        the target.
    scope
        ``"everywhere"`` (default): replaced in every torch module holding it;
        ``"here"``: only the name ``target`` is rebound.
    caches
        Qualified names of torch caches keeping the target from first use:
        ``functools`` caches (Dynamo's type dispatch keeps
        ``VariableBuilder.wrap_tensor``) or dicts (Dynamo's builtin handlers keep
        ``BuiltinVariable.call_isinstance`` bound). Cleared on install, suspend
        and removal, else ``disable()`` would leave the replacement running.
    """

    target: str
    fingerprint: str
    make: Callable[[Callable[..., Any]], Callable[..., Any]] | str
    depends_on: tuple[tuple[str, str], ...] = ()
    scope: Literal["everywhere", "here"] = "everywhere"
    caches: tuple[str, ...] = ()

    def factory(self) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """The replacement's factory (imported when :attr:`make` names it)."""
        if not isinstance(self.make, str):
            return self.make
        module, _, name = self.make.partition(":")
        found = getattr(importlib.import_module(module), name)
        if not callable(found):
            raise _not_callable(self.make)
        return found  # type: ignore[no-any-return]  # a factory by convention

    @property
    def fingerprinted(self) -> tuple[tuple[str, str], ...]:
        """``(qualified name, fingerprint)`` of the target, then of ``depends_on``."""
        return ((self.target, self.fingerprint), *self.depends_on)

    @property
    def doc(self) -> str:
        return inspect.getdoc(self.factory()) or ""

    @property
    def composes(self) -> bool:
        """Whether the factory is marked :func:`composes`."""
        return bool(getattr(self.factory(), "composes", False))


class PatchRefused(RuntimeError):
    """The running torch does not match the patches: nothing was patched.

    ``others``: targets another package replaced in a way a one-feature set
    cannot live with; ``build``: problems of the torch build itself (empty: the
    other package is the cause).
    """

    def __init__(self, message: str, others: dict[str, OtherPatch] | None = None, build: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.others = dict(others or {})
        self.build = build


def _resolve(target: str) -> tuple[Any, str, Any]:
    """``(owner, attribute, current value)`` for a qualified name."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        for name in parts[cut:-1]:
            owner = getattr(owner, name)
        return owner, parts[-1], getattr(owner, parts[-1])
    raise _no_module_prefix(target)


def _torch_root() -> str | None:
    """The directory of the ``torch`` package, found without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(spec.submodule_search_locations))


def _module_file(module_name: str) -> str | None:
    """The source file of a torch module, found without importing anything."""
    parts = module_name.split(".")
    root = _torch_root() if parts[0] == "torch" else None
    if root is None:
        return None
    base = os.path.join(root, *parts[1:])
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _locate(target: str) -> tuple[str, tuple[str, ...]] | None:
    """``(module name, attribute path)`` from the files alone; ``None`` if no prefix is a torch source file."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        if _module_file(module_name) is not None:
            return module_name, tuple(parts[cut:])
    return None


def _definitions(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements of a module or class body, looking into ``if``/``try``/``with`` blocks."""
    for node in body:
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            yield from _definitions(node.body)
            yield from _definitions(getattr(node, "orelse", []))
            for handler in getattr(node, "handlers", []):
                yield from _definitions(handler.body)
            yield from _definitions(getattr(node, "finalbody", []))
        else:
            yield node


@functools.lru_cache(maxsize=16)
def _parsed(file: str) -> tuple[str, ast.Module]:
    with open(file, encoding="utf-8") as f:
        text = f.read()
    return text, ast.parse(text)


def _imported_from(module_name: str, file: str, body: list[ast.stmt], name: str) -> str | None:
    """The module of the ``from ... import`` that last binds ``name`` in ``body``, if any."""
    source: str | None = None
    for node in _definitions(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            source = None
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            for alias in node.names:
                if (alias.asname or alias.name) == name and alias.name == name:
                    if node.level == 0:
                        source = node.module
                    else:
                        package = module_name if file.endswith("__init__.py") else module_name.rpartition(".")[0]
                        for _ in range(node.level - 1):
                            package = package.rpartition(".")[0]
                        source = f"{package}.{node.module}"
    return source


def source_fingerprint(module_name: str, path: tuple[str, ...], read: list[str] | None = None) -> str | None:
    """:func:`fingerprint` of definition ``path`` (``("Class", "method")``) parsed
    from ``module_name``'s file (as ``inspect.getsource`` would give); ``None``
    if not found. Files read are appended to ``read``."""
    file = _module_file(module_name)
    if file is None:
        return None
    if read is not None:
        read.append(file)
    text, tree = _parsed(file)
    body: list[ast.stmt] = tree.body
    if len(path) == 1:
        imported = _imported_from(module_name, file, body, path[0])
        if imported is not None:  # ``from .x import f``: f's definition in x
            return source_fingerprint(imported, path, read)
    node: ast.stmt | None = None
    for depth, name in enumerate(path):
        found = [
            n
            for n in _definitions(body)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name
        ]
        if not found:
            if depth == len(path) - 1 and _takes_from_builtins(node, name):
                return _inherited_text(name, _node_source(text, node))  # type: ignore[arg-type]  # a ClassDef
            return None
        node = found[-1]  # the last definition is the one the module keeps
        body = node.body
    if node is None or node.end_lineno is None:
        return None
    return hashlib.sha256(_node_source(text, node).encode()).hexdigest()[:16]


def _node_source(text: str, node: ast.stmt) -> str:
    """The dedented source of a ``def``/``class`` statement, decorators included."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])  # type: ignore[attr-defined]  # def/class nodes have decorator_list
    lines = text.splitlines(keepends=True)[first - 1 : node.end_lineno]
    return textwrap.dedent("".join(lines))


def _takes_from_builtins(node: ast.stmt | None, name: str) -> bool:
    """:func:`_builtin_inherited` from source: class ``node`` does not define
    dunder ``name`` and its bases are only ``type``/``object``."""
    if not isinstance(node, ast.ClassDef) or not (name.startswith("__") and name.endswith("__")):
        return False
    for statement in _definitions(node.body):
        targets = statement.targets if isinstance(statement, ast.Assign) else [getattr(statement, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return False  # ``__call__ = something`` in the class body
    return all(isinstance(b, ast.Name) and b.id in ("type", "object") for b in node.bases)


def file_digest(file: str) -> str:
    """A short hash of a file's bytes (what :func:`record_sources` records)."""
    with open(file, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def record_sources(patches: Iterable[Patch]) -> tuple[tuple[str, str], ...]:
    """A release row's ``sources``: ``("<fingerprints>", digest)`` (a record is
    trusted only by its own set), then ``(path relative to torch, digest)`` of
    each file the fingerprints of ``patches`` are parsed from. Each parsed
    fingerprint must equal the recorded one, so only a checked torch is recorded."""
    patches = tuple(patches)
    root = _torch_root()
    if root is None:
        raise PatchRefused("torch is not installed")
    read: list[str] = []
    for p in patches:
        for target, expected in p.fingerprinted:
            located = _locate(target)
            if located is None:
                continue  # not a torch source file: always checked on the live object
            found = source_fingerprint(*located, read=read)
            if found != expected:
                raise _not_recorded(target, found, expected)
    files = sorted({os.path.relpath(f, root) for f in read})
    return ((_FINGERPRINTS, _fingerprints_digest(patches)), *((f, file_digest(os.path.join(root, f))) for f in files))


#: The entry of a record that stands for the fingerprints it was recorded with.
_FINGERPRINTS = "<fingerprints>"


def _fingerprints_digest(patches: Iterable[Patch]) -> str:
    """A short hash of every (target, fingerprint) pair of ``patches``, dependencies included."""
    pairs = [f"{t} {f}" for p in patches for t, f in p.fingerprinted]
    return hashlib.sha256("\n".join(pairs).encode()).hexdigest()[:16]


def _unchanged_files(sources: tuple[tuple[str, str], ...], patches: Iterable[Patch]) -> frozenset[str]:
    """The recorded files (absolute) when made for these fingerprints and all
    unchanged; else empty (all or none: a redirect may lead to a changed one)."""
    root = _torch_root()
    recorded = dict(sources)
    if root is None or recorded.pop(_FINGERPRINTS, None) != _fingerprints_digest(patches):
        return frozenset()
    files = {os.path.join(root, f): digest for f, digest in recorded.items()}
    try:
        if files and all(file_digest(f) == digest for f, digest in files.items()):
            return frozenset(files)
    except OSError:
        pass
    return frozenset()


def _raw(owner: Any, attr: str) -> Any:
    """The attribute as stored (a method's function; a ``staticmethod``/``classmethod`` object)."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if attr in vars(klass):
                return vars(klass)[attr]
    return getattr(owner, attr)


def _function(raw: Any) -> Any:
    """The function inside a stored attribute (unwraps static/class methods)."""
    return raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw


def _cache(name: str) -> Any:
    """The ``functools`` cache or torch-filled dict named ``name``."""
    cached = _function(_raw(*_resolve(name)[:2]))
    if not isinstance(cached, dict) and not callable(getattr(cached, "cache_clear", None)):
        raise _not_a_cache(name)
    return cached


def _clear_caches(patch: Patch) -> None:
    for name in patch.caches:
        cached = _cache(name)
        if isinstance(cached, dict):
            cached.clear()
        else:
            cached.cache_clear()


@dataclass
class _Applied:
    patch: Patch
    original: Any
    replacement: Any
    places: list[tuple[Any, str]] = field(default_factory=list)  # (namespace or _ClassAttr, key)


class PatchSet:
    """An ordered list of patches applied and removed as one unit.

    ``independent``: a blocked patch (see the module's notes) is left out and
    the others applied; otherwise (a backport: one feature) it refuses the set.
    """

    def __init__(
        self,
        patches: Iterable[Patch],
        sources: tuple[tuple[str, str], ...] = (),
        on_removed: Callable[[str], None] | None = None,
        independent: bool = False,
    ) -> None:
        self.patches: tuple[Patch, ...] = tuple(patches)
        self.independent = independent
        #: Targets another package replaced before the set was enabled, by target:
        #: ``composed`` got our replacement built over theirs; ``blocked`` were left out.
        self.composed: dict[str, OtherPatch] = {}
        self.blocked: dict[str, OtherPatch] = {}
        #: Targets where another package installed its replacement over ours after
        #: we did: :meth:`disable` left theirs, and ours beneath it, in place.
        self.held: dict[str, OtherPatch] = {}
        self._held_records: dict[str, _Applied] = {}  # ours beneath another package's, by target
        #: :func:`record_sources` of these patches on the torch they were written for.
        self.sources = sources
        #: Called with :attr:`removed` once the set has removed itself (on the
        #: thread whose import failed to patch, under the set's lock).
        self._on_removed = on_removed
        self._applied: list[_Applied] = []
        self._deferred: dict[str, list[Patch]] = {}  # module name -> patches applied on its import
        self._lock = threading.RLock()
        #: Why the set was removed after it was enabled (a patch waiting for its
        #: module failed to apply on that import); ``None`` otherwise.
        self.removed: str | None = None
        seen: set[str] = set()
        for p in self.patches:
            if p.target in seen:
                raise _listed_twice(p.target)
            seen.add(p.target)

    @property
    def enabled(self) -> bool:
        return bool(self._applied or self._deferred)

    @property
    def targets(self) -> tuple[str, ...]:
        """Targets of an enabled set, in order, applied or waiting (not blocked)."""
        if not self.enabled:
            return ()
        return tuple(p.target for p in self.patches if p.target not in self.blocked)

    @property
    def waiting(self) -> tuple[str, ...]:
        """Targets whose module torch has not imported yet (applied on its import)."""
        return tuple(p.target for patches in self._deferred.values() for p in patches)

    @staticmethod
    def _fingerprint_of(
        target: str, recorded: str | None = None, unchanged: frozenset[str] = frozenset()
    ) -> tuple[str | None, str | None, Any]:
        """``(fingerprint, module, current)`` of ``target``: from its source file
        if the module is not imported (``module`` names it, ``current`` is
        ``None``; ``recorded`` is used if the file is among ``unchanged``), else
        from the object (``module`` ``None``; fingerprint ``None`` if sourceless)."""
        located = _locate(target)
        if located is not None and located[0] not in sys.modules:
            if recorded is not None and _module_file(located[0]) in unchanged:
                return recorded, located[0], None
            found = source_fingerprint(*located)
            if found is not None:
                return found, located[0], None
        owner, attr, _ = _resolve(target)
        current = _function(_raw(owner, attr))
        try:
            return attribute_fingerprint(owner, attr), None, current
        except (OSError, TypeError):
            if _foreign_module(current) is None:
                raise
            return None, None, current  # another package's function without source

    def _examine(self) -> tuple[list[str], dict[str, str], dict[str, OtherPatch], dict[str, OtherPatch]]:
        """``(problems, waits, composed, blocked)``: what refuses the set, the
        module each waiting target waits for, and targets other packages replaced."""
        problems = []
        waits: dict[str, str] = {}
        composed: dict[str, OtherPatch] = {}
        blocked: dict[str, OtherPatch] = {}
        unchanged = _unchanged_files(self.sources, self.patches)  # the files the recorded fingerprints were read from
        for p in self.patches:
            for target, expected in p.fingerprinted:
                label = target if target == p.target else _relied_on(target, p.target)
                try:
                    found, module, current = self._fingerprint_of(target, expected, unchanged)
                except (ImportError, AttributeError, OSError, TypeError, SyntaxError) as e:
                    problems.append(_unresolved(label, e))
                    continue
                if found != expected:
                    other = other_patch(target, current, expected) if current is not None else None
                    if other is None:
                        problems.append(_fingerprint_differs(label, found, expected))
                    elif target == p.target and other.wraps_original and p.composes:
                        composed[p.target] = other
                    else:
                        blocked[p.target] = other
                elif module is not None and target == p.target:
                    waits[target] = module
            try:
                p.factory()
            except (ImportError, AttributeError, TypeError) as e:
                problems.append(_unloadable(p.target, p.make, e))
            for name in p.caches:
                if p.target in waits:
                    continue  # checked when its module is imported, before the patch applies
                try:
                    _cache(name)
                except (ImportError, AttributeError, TypeError) as e:
                    problems.append(_unresolved(_cache_of(name, p.target), e))
        return problems, waits, composed, blocked

    def blocked_text(self, blocked: dict[str, OtherPatch] | None = None) -> str:
        """Why each blocked target (default :attr:`blocked`) is blocked, and the fix."""
        return _blocked_text(self.blocked if blocked is None else blocked)

    def check(self) -> list[str]:
        """Problems that would refuse the set (a blocked target only if not independent)."""
        problems, _, _, blocked = self._examine()
        return [*problems, self.blocked_text(blocked)] if blocked and not self.independent else problems

    def enable(self) -> tuple[str, ...]:
        """Check all, then apply those whose module is imported and defer the
        rest to its import; or apply none (:class:`PatchRefused`)."""
        with self._lock:
            if self.enabled:
                return self.targets
            self._forget_lost_held()
            problems, waits, composed, blocked = self._examine()
            if blocked and not self.independent:
                text = "; ".join([*problems, self.blocked_text(blocked)])
                raise PatchRefused(text, others=blocked, build=tuple(problems))
            if problems:
                raise PatchRefused("; ".join(problems), build=tuple(problems))
            self.removed = None
            # ours still runs beneath another package's at a held target: it is applied already
            applied: list[_Applied] = list(self._held_records.values())
            for target in self._held_records:
                composed.pop(target, None)
            self.composed, self.blocked, self.held, self._held_records = composed, blocked, {}, {}
            deferred: dict[str, list[Patch]] = {}
            now = []
            for p in self.patches:
                if p.target in blocked or any(a.patch is p for a in applied):
                    continue
                if p.target in waits:
                    deferred.setdefault(waits[p.target], []).append(p)
                else:
                    now.append(p)
            try:
                # where torch's modules hold each original by name: one pass over them for all patches
                holding = _torch_globals_holding(_raw(*_resolve(p.target)[:2]) for p in now if p.scope == "everywhere")
                for p in now:
                    applied.append(self._apply(p, holding))
            except BaseException:
                self._uninstall(applied)
                raise
            self._applied = applied
            self._deferred = deferred
            if deferred:
                _ImportHook.add(self)
            # A module imported between _examine and the hook (by a factory or another thread) was
            # never seen by it: patch now. One still initializing (enable() inside its import) stays
            # waiting and is never patched (a limit: no torch module imports this library).
            for name in list(deferred):
                module = sys.modules.get(name)
                if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
                    self._module_imported(name)
            log.debug(
                "applied %d patches, %d wait for their module's import", len(applied), sum(map(len, deferred.values()))
            )
            return self.targets

    def _forget_lost_held(self) -> None:
        """Drop held records whose replacement no longer runs at its target (applied afresh)."""
        for target, record in list(self._held_records.items()):
            ours = _function(record.replacement)
            with suppress(ImportError, AttributeError):
                current = _function(_raw(*_resolve(target)[:2]))
                if current is ours or any(f is ours for f in _wrapped_functions(current, depth=4)):
                    continue
            del self._held_records[target]

    def _apply(self, p: Patch, holding: _Holding | None = None) -> _Applied:
        owner, attr, _ = _resolve(p.target)
        original = _raw(owner, attr)
        function = p.factory()(_function(original))
        # a static/class method is stored wrapped again, like the original
        replacement: object = (
            type(original)(function) if isinstance(original, (staticmethod, classmethod)) else function
        )
        record = _Applied(p, original, replacement)
        try:
            self._install(record, owner, attr, holding)
            _clear_caches(p)
        except BaseException:
            self._uninstall([record])
            raise
        return record

    def _module_imported(self, module_name: str) -> None:
        """Called by the import hook once ``module_name`` has run: apply its patches."""
        with self._lock:
            patches = self._deferred.pop(module_name, None)
            if not patches:
                return
            try:
                for p in patches:
                    if attribute_fingerprint(*_resolve(p.target)[:2]) != p.fingerprint:
                        raise _definition_differs(p.target)
                    self._applied.append(self._apply(p))
            except BaseException as e:  # never leave a half-patched torch behind
                self._disable_locked()
                self.removed = _import_failed(module_name, e)
                warnings.warn(_removed_warning(self.removed), RuntimeWarning, stacklevel=2)
                if self._on_removed is not None:
                    self._on_removed(self.removed)
            if not self._deferred:
                _ImportHook.discard(self)

    def _disable_locked(self) -> None:
        _ImportHook.discard(self)
        self._deferred = {}
        self.held = self._uninstall(self._applied)
        self._held_records = {a.patch.target: a for a in self._applied if a.patch.target in self.held}
        self._applied = []

    def disable(self) -> None:
        """Restore every original and drop the waiting patches; no-op when disabled."""
        with self._lock:
            self._disable_locked()

    def apply_now(self, target: str) -> None:
        """Import ``target``'s module now if its patch is waiting for it (tests)."""
        located = _locate(target)
        if located is not None and located[0] in self._deferred:
            importlib.import_module(located[0])

    @contextmanager
    def suspended(self, target: str) -> Iterator[None]:
        """Temporarily restore one patched target (for tests showing a patch is needed)."""
        self.apply_now(target)
        with self._lock:
            record = next((a for a in self._applied if a.patch.target == target), None)
            if record is None:
                raise _not_patched(target)
            places = list(record.places)
            if record.patch.scope == "everywhere" and not isinstance(record.replacement, (staticmethod, classmethod)):
                # torch modules imported after the patch took the replacement by name
                places += _torch_globals_holding([record.replacement])[id(record.replacement)]
            for d, k in places:
                d[k] = record.original
            _clear_caches(record.patch)
        try:
            yield
        finally:
            with self._lock:
                for d, k in places:
                    d[k] = record.replacement
                _clear_caches(record.patch)

    @staticmethod
    def _install(record: _Applied, owner: Any, attr: str, holding: _Holding | None = None) -> None:
        if isinstance(owner, type):
            record.places.append((_ClassAttr(owner), attr))
            setattr(owner, attr, record.replacement)
            return
        if record.patch.scope == "here":
            record.places.append((vars(owner), attr))
            vars(owner)[attr] = record.replacement
            return
        if holding is None or id(record.original) not in holding:
            holding = _torch_globals_holding([record.original])
        for namespace, key in holding[id(record.original)]:
            namespace[key] = record.replacement
            record.places.append((namespace, key))
        if not record.places:
            raise _original_not_found(record.patch.target)

    @staticmethod
    def _uninstall(applied: list[_Applied]) -> dict[str, OtherPatch]:
        """Put originals back where ours still are; return targets another package
        has since covered (left: removing ours would remove theirs)."""
        held: dict[str, OtherPatch] = {}
        everywhere = [
            r
            for r in applied
            if r.patch.scope == "everywhere" and not isinstance(r.replacement, (staticmethod, classmethod))
        ]
        holding = _torch_globals_holding(r.replacement for r in everywhere)  # one pass for all
        for record in reversed(applied):
            kept = []
            for d, k in record.places:
                current = d.get(k)
                other = None
                if current is not record.replacement and current is not record.original:
                    other = other_patch(record.patch.target, current, record.patch.fingerprint)
                if other is None:
                    d[k] = record.original
                else:  # another package's, over ours: both stay
                    held[record.patch.target] = other
                    kept.append((d, k))
            record.places[:] = kept
            if id(record.replacement) in holding:
                # modules imported meanwhile took the replacement by name: restore those too
                for namespace, key in holding[id(record.replacement)]:
                    if namespace.get(key) is record.replacement:
                        namespace[key] = record.original
            with suppress(ImportError, AttributeError, TypeError):  # checked when applied
                _clear_caches(record.patch)
        return held


class _ImportHook(importlib.abc.MetaPathFinder):
    """The ``sys.meta_path`` finder for sets with waiting patches: the module is
    found and loaded as usual, then the waiting sets patch it."""

    sets: list[PatchSet] = []  # the sets with patches waiting, in enabling order
    lock = threading.Lock()

    @classmethod
    def add(cls, patch_set: PatchSet) -> None:
        with cls.lock:
            if patch_set not in cls.sets:
                cls.sets.append(patch_set)
            if not any(isinstance(f, cls) for f in sys.meta_path):
                sys.meta_path.insert(0, cls())

    @classmethod
    def discard(cls, patch_set: PatchSet) -> None:
        with cls.lock:
            if patch_set in cls.sets:
                cls.sets.remove(patch_set)
            if not cls.sets:
                sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, cls)]

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        waiting = [ps for ps in list(self.sets) if name in ps._deferred]
        if not waiting:
            return None
        for finder in list(sys.meta_path):
            if isinstance(finder, _ImportHook) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader, waiting)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    """The module's own loader, then the patches; afterwards the module keeps
    its own loader (``inspect``, ``linecache`` and pickling see no trace)."""

    def __init__(self, loader: Any, sets: list[PatchSet]) -> None:
        self.loader = loader
        self.sets = sets

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        for patch_set in self.sets:
            patch_set._module_imported(module.__name__)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


#: Per object (by ``id``, the object kept alive by the caller), the ``(namespace, key)`` of every
#: torch module global that is it.
_Holding = dict[int, list[tuple[dict[str, Any], str]]]


def _torch_globals_holding(objs: Iterable[Any]) -> _Holding:
    """Where torch's modules hold each of ``objs`` as a global, in one pass over them all
    (a pass reads some 2,500 module namespaces: per patch, it was most of enable/disable)."""
    wanted = {id(o): o for o in objs}
    found: _Holding = {i: [] for i in wanted}
    if not wanted:
        return found
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "torch" or name.startswith("torch.")):
            continue
        namespace = getattr(module, "__dict__", None)
        if not namespace:
            continue
        for key, value in list(namespace.items()):
            i = id(value)
            if i in wanted and wanted[i] is value:
                found[i].append((namespace, key))
    return found


class _ClassAttr:
    """Item assignment onto a class attribute (``vars(cls)`` is read-only);
    putting back an inherited original deletes the class's own entry instead."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.owned = set(vars(cls))

    def get(self, key: str) -> Any:
        return vars(self.cls).get(key)

    def __setitem__(self, key: str, value: Any) -> None:
        inherited = key not in self.owned
        if inherited and any(value is vars(k).get(key) for k in self.cls.__mro__[1:]):
            if key in vars(self.cls):
                delattr(self.cls, key)
            return
        setattr(self.cls, key, value)


# ---------------------------------------------------------------------- messages
# The errors and problems of this module, one constructor per situation (layer 0:
# nothing of the library's own messages is imported here).


def _not_callable(make: object) -> TypeError:
    return TypeError(f"{make} is not callable")


def _no_module_prefix(target: str) -> ImportError:
    return ImportError(f"cannot import any module prefix of {target!r}")


def _fingerprint_differs(label: str, found: str | None, expected: str) -> str:
    return f"{label}: source fingerprint {found}, expected {expected}"


def _not_recorded(target: str, found: str | None, expected: str) -> PatchRefused:
    return PatchRefused(_fingerprint_differs(target, found, expected) + "; nothing recorded")


def _not_a_cache(name: str) -> TypeError:
    return TypeError(f"{name} is not a functools cache (nor a dict)")


def _listed_twice(target: str) -> AssertionError:
    return AssertionError(f"patch target {target} listed twice")


def _relied_on(target: str, patched: str) -> str:
    return f"{target} (relied on by the patch of {patched})"


def _cache_of(name: str, patched: str) -> str:
    return f"{name} (a cache of {patched})"


def _unresolved(label: str, error: Exception) -> str:
    return f"{label}: cannot be resolved ({error})"


def _unloadable(target: str, make: object, error: Exception) -> str:
    return f"{target}: the replacement {make!r} cannot be loaded ({error})"


def _why_blocked(target: str, other: OtherPatch) -> str:
    if other.target != target:
        return f"the patch of {target} relies on that function, and another package changed it"
    if not other.wraps_original:
        return (
            "it does not call the torch function this patch was written against (no function with "
            "its fingerprint is its __wrapped__ or in its closure), so a patch built over it could "
            "not be checked"
        )
    # wraps torch's original, so the patch is blocked because it does not compose (else it was composed)
    return "this patch rewrites torch's function rather than wrapping it, so it cannot be built over another's"


def _blocked_text(blocked: dict[str, OtherPatch]) -> str:
    parts = [f"{other} before opaque_subclass: {_why_blocked(t, other)}" for t, other in blocked.items()]
    packages = sorted({o.package for o in blocked.values()})
    fix = f"import opaque_subclass before {', '.join(packages)} (that package's patch is then built over ours)"
    return "; ".join(parts) + ". Fix: " + fix


def _definition_differs(target: str) -> PatchRefused:
    return PatchRefused(f"{target}: the imported definition differs from its source file")


def _import_failed(module_name: str, error: BaseException) -> str:
    return f"patching {module_name} on import failed ({type(error).__name__}: {error})"


def _removed_warning(removed: str) -> str:
    return (
        f"opaque_subclass: {removed}; every patch of the set is removed and torch runs stock. Fix: install the "
        "official torch release the patches were written for."
    )


def _not_patched(target: str) -> KeyError:
    return KeyError(f"{target} is not patched")


def _original_not_found(target: str) -> AssertionError:
    return AssertionError(f"{target}: original not found in any torch module")
