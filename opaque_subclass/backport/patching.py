"""The patch machinery: fingerprinted, all-or-nothing, exactly reversible.

A :class:`Patch` names one torch function (or method) by its qualified name,
the fingerprint of the original's source, and a factory that builds the
replacement from the original. :class:`PatchSet` applies a list of patches:

* before anything is touched, every target is resolved and every fingerprint
  checked; one mismatch refuses the whole set (nothing is patched) and the
  mismatches are reported;
* a function imported by name into other torch modules (``from .x import f``)
  is replaced in every module that holds the same object, found by identity;
* :meth:`PatchSet.disable` puts the very original objects back in every place
  it replaced them; enabling and disabling are idempotent.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import logging
import sys
import textwrap
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Patch", "PatchSet", "PatchRefused", "fingerprint"]

log = logging.getLogger(__name__)


def fingerprint(obj: Any) -> str:
    """A short hash of an object's source text (dedented), stable across Python versions."""
    source = textwrap.dedent(inspect.getsource(obj))
    return hashlib.sha256(source.encode()).hexdigest()[:16]


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
        ``make(original) -> replacement``. Its docstring says what the patch does.
    depends_on
        ``(qualified name, fingerprint)`` of torch functions the replacement
        relies on without replacing them (a caller whose use of the target's
        result the replacement is written for). They are checked like the
        target: a changed source refuses the whole set.
    scope
        ``"everywhere"`` (the default): the function is replaced in every torch
        module that holds it. ``"here"``: only the name given by ``target`` is
        rebound (one module's import of a function defined elsewhere), so every
        other module keeps torch's function.
    """

    target: str
    fingerprint: str
    make: Callable[[Callable[..., Any]], Callable[..., Any]]
    depends_on: tuple[tuple[str, str], ...] = ()
    scope: Literal["everywhere", "here"] = "everywhere"

    @property
    def doc(self) -> str:
        return inspect.getdoc(self.make) or ""


class PatchRefused(RuntimeError):
    """The running torch does not match the patches: nothing was patched."""


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
    raise ImportError(f"cannot import any module prefix of {target!r}")


def _raw(owner: Any, attr: str) -> Any:
    """The attribute as stored (a function for methods, not a bound method;
    the ``staticmethod``/``classmethod`` object for those)."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if attr in vars(klass):
                return vars(klass)[attr]
    return getattr(owner, attr)


def _function(raw: Any) -> Any:
    """The function inside a stored attribute (unwraps static/class methods)."""
    return raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw


@dataclass
class _Applied:
    patch: Patch
    original: Any
    replacement: Any
    places: list[tuple[Any, str]] = field(default_factory=list)  # (namespace or _ClassAttr, key)


class PatchSet:
    """An ordered list of patches applied and removed as one unit."""

    def __init__(self, patches: Iterable[Patch], *, preload: Iterable[str] = ()) -> None:
        self.patches: tuple[Patch, ...] = tuple(patches)
        self.preload: tuple[str, ...] = tuple(preload)
        self._applied: list[_Applied] = []
        self._lock = threading.RLock()
        seen: set[str] = set()
        for p in self.patches:
            if p.target in seen:
                raise AssertionError(f"patch target {p.target} listed twice")
            seen.add(p.target)

    @property
    def enabled(self) -> bool:
        return bool(self._applied)

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(a.patch.target for a in self._applied)

    def check(self) -> list[str]:
        """Problems that would refuse the set: unresolvable targets, changed sources."""
        for module in self.preload:
            importlib.import_module(module)
        problems = []
        for p in self.patches:
            for target, expected in ((p.target, p.fingerprint), *p.depends_on):
                label = target if target == p.target else f"{target} (relied on by the patch of {p.target})"
                try:
                    owner, attr, _ = _resolve(target)
                    found = fingerprint(_function(_raw(owner, attr)))
                except (ImportError, AttributeError, OSError, TypeError) as e:
                    problems.append(f"{label}: cannot be resolved ({e})")
                    continue
                if found != expected:
                    problems.append(f"{label}: source fingerprint {found}, expected {expected}")
        return problems

    def enable(self) -> tuple[str, ...]:
        """Apply every patch, or none (raising :class:`PatchRefused`)."""
        with self._lock:
            if self._applied:
                return self.targets
            problems = self.check()
            if problems:
                raise PatchRefused("; ".join(problems))
            applied: list[_Applied] = []
            try:
                for p in self.patches:
                    owner, attr, _ = _resolve(p.target)
                    original = _raw(owner, attr)
                    replacement = p.make(_function(original))
                    if isinstance(original, (staticmethod, classmethod)):
                        replacement = type(original)(replacement)
                    record = _Applied(p, original, replacement)
                    applied.append(record)
                    self._install(record, owner, attr)
            except BaseException:
                self._uninstall(applied)
                raise
            self._applied = applied
            log.debug("applied %d patches", len(applied))
            return self.targets

    def disable(self) -> None:
        """Restore every original object; a no-op when not enabled."""
        with self._lock:
            self._uninstall(self._applied)
            self._applied = []

    @contextmanager
    def suspended(self, target: str) -> Iterator[None]:
        """Temporarily restore one patched target (for tests showing a patch is needed)."""
        with self._lock:
            record = next((a for a in self._applied if a.patch.target == target), None)
            if record is None:
                raise KeyError(f"{target} is not patched")
            for d, k in record.places:
                d[k] = record.original
        try:
            yield
        finally:
            with self._lock:
                for d, k in record.places:
                    d[k] = record.replacement

    @staticmethod
    def _install(record: _Applied, owner: Any, attr: str) -> None:
        if isinstance(owner, type):
            record.places.append((_ClassAttr(owner), attr))
            setattr(owner, attr, record.replacement)
            return
        if record.patch.scope == "here":
            record.places.append((vars(owner), attr))
            vars(owner)[attr] = record.replacement
            return
        for _, namespace, key in _torch_namespaces_holding(record.original):
            namespace[key] = record.replacement
            record.places.append((namespace, key))
        if not record.places:
            raise AssertionError(f"{record.patch.target}: original not found in any torch module")

    @staticmethod
    def _uninstall(applied: list[_Applied]) -> None:
        for record in reversed(applied):
            for d, k in record.places:
                d[k] = record.original
            record.places.clear()
            if record.patch.scope == "everywhere" and not isinstance(record.replacement, (staticmethod, classmethod)):
                # torch modules imported while the patch was on took the
                # replacement by name (``from .x import f``): restore those too.
                for _, namespace, key in _torch_namespaces_holding(record.replacement):
                    namespace[key] = record.original


def _torch_namespaces_holding(obj: Any) -> list[tuple[str, dict[str, Any], str]]:
    """``(module name, namespace, key)`` of every torch module global that is ``obj``."""
    found = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "torch" or name.startswith("torch.")):
            continue
        namespace = getattr(module, "__dict__", None)
        if not namespace:
            continue
        for key, value in list(namespace.items()):
            if value is obj:
                found.append((name, namespace, key))
    return found


class _ClassAttr:
    """Item assignment onto a class attribute (``vars(cls)`` is read-only).

    Assigning the original back when the class did not define the attribute
    itself (it was inherited) deletes the class's own entry instead, so the
    class is left exactly as found.
    """

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.owned = set(vars(cls))

    def __setitem__(self, key: str, value: Any) -> None:
        inherited = key not in self.owned
        if inherited and any(value is vars(k).get(key) for k in self.cls.__mro__[1:]):
            if key in vars(self.cls):
                delattr(self.cls, key)
            return
        setattr(self.cls, key, value)
