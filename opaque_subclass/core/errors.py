"""Error types and the shared wording of the project's user-facing messages.

Every message built here names four things: the subclass, the attribute path
(for example ``x._inner._mesh``), the type that was found, and a fix that runs
as written. The fixes are produced by :func:`import_fix`, so a test can execute
them verbatim.
"""

from __future__ import annotations

__all__ = [
    "OpaqueAttributeError",
    "OpaqueMemberError",
    "OpaqueSubclassError",
    "OpaqueTypeError",
    "OpaqueValueError",
    "adopt_fix",
    "describe_type",
    "import_fix",
    "imports_fix",
    "qualified_name",
    "subject",
    "submodule_expression",
]


class OpaqueSubclassError(RuntimeError):
    """A rule of opaque-attribute subclasses was broken while tracing or running.

    The base of every error the library raises about its users' input, so
    ``except opaque_subclass.OpaqueSubclassError`` catches them all, and under
    ``torch.compile`` one of them reaches the caller as itself rather than
    inside Dynamo's ``InternalTorchDynamoError``. Raised as such for problems
    discovered in a traced or compiled program (for example a flat argument
    list whose length does not match the subclass metadata it is being wrapped
    with). Wrong kinds of objects raise :class:`OpaqueTypeError` (a
    :class:`TypeError`), bad values :class:`OpaqueValueError` (a
    :class:`ValueError`) and missing attributes :class:`OpaqueAttributeError`
    (an :class:`AttributeError`) instead.
    """


class OpaqueTypeError(OpaqueSubclassError, TypeError):
    """An object of the wrong kind was given to the library or listed by a
    subclass (for example an ``int`` among the attributes a
    ``__tensor_flatten__`` returns, or an unregistered class where an opaque is
    expected). A :class:`TypeError`, so ``except TypeError`` keeps catching it."""


class OpaqueValueError(OpaqueSubclassError, ValueError):
    """An object of the right kind with a value the library cannot use (for
    example a dim out of range, or an archive whose contents do not match its
    manifest). A :class:`ValueError`, so ``except ValueError`` keeps catching
    it."""


class OpaqueAttributeError(OpaqueSubclassError, AttributeError):
    """An attribute the library was told to read is missing (for example a name
    that ``__tensor_flatten__`` lists but the instance does not have). An
    :class:`AttributeError`, so ``except AttributeError`` keeps catching it."""


class OpaqueMemberError(OpaqueAttributeError):
    """Compiled code used a member (attribute, property or method) of an opaque
    that the opaque's registration does not declare (``register_opaque(cls,
    members=...)``): torch.compile cannot tell whether to evaluate it on the
    real object (and guard the value) or trace it."""


def qualified_name(cls: type) -> str:
    """``module.QualName`` of a class, the way it is spelled in an import."""
    module = getattr(cls, "__module__", None) or "<unknown>"
    return f"{module}.{cls.__qualname__}"


def subject(cls: type) -> str:
    """How a message names the subclass it is about: module-qualified
    (``pkg.mod.MeshTensor``, ``__main__.MeshTensor`` for a script's class), so a
    message about one of several classes of the same name says which. Used for
    the first mention; code in a fix keeps the bare name the user types."""
    try:
        return qualified_name(cls)
    except Exception:  # an error message must never crash
        return repr(cls)


def describe_type(obj: object) -> str:
    """Short, data-free description of an object's type for error messages."""
    cls = type(obj)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return qualified_name(cls)


def import_fix(cls: type, call: str) -> str:
    """A runnable snippet, in backticks, that imports ``cls`` and then executes ``call``.

    ``call`` is a template: ``{cls}`` is replaced by the name the class has after
    the import (its ``__qualname__``), and it may use the name
    ``opaque_subclass``. Classes that cannot be imported by name (defined in a
    function or in ``__main__``) get a snippet that uses ``cls.__name__`` and
    assumes the class is in scope, which is said after the snippet.
    """
    return imports_fix(call, cls=cls)


def imports_fix(call: str, **classes: type) -> str:
    """:func:`import_fix` for several classes: ``call``'s ``{name}`` is the name
    the class passed as ``name`` has after the snippet's imports."""
    imports: list[str] = []
    names: dict[str, str] = {}
    in_scope: list[str] = []
    for key, klass in classes.items():
        module, qualname = klass.__module__, klass.__qualname__
        if "<locals>" in qualname or module in ("__main__", "builtins"):
            names[key] = klass.__name__
            in_scope.append(klass.__name__)
        else:
            imports.append(f"from {module} import {qualname.split('.', 1)[0]}")
            names[key] = qualname
    code = "; ".join(["import opaque_subclass", *dict.fromkeys(imports), call.format(**names)])
    return f"`{code}`" + (f" (with {', '.join(in_scope)} in scope)" if in_scope else "")


def adopt_fix(cls: type, attr: str, path: str, obj_type: type) -> str:
    """The fix for a class of another package that keeps an object of
    ``obj_type`` at ``path`` of its flatten context (the path as lint OSC001
    writes it after ``<context>``): adopt it, the object listed as ``attr``."""
    escaped = repr(path).replace("{", "{{").replace("}", "}}")
    call = "opaque_subclass.adopt({cls}, {{" + repr(attr) + ": opaque_subclass.ContextOpaque(" + escaped + ", {obj})}})"
    return "for a class of another package, whose code you do not change, adopt it: " + imports_fix(
        call, cls=cls, obj=obj_type
    )


def submodule_expression(path: str) -> str:
    """Python, for a fix, naming the submodule at dotted ``path`` (``""`` for
    the root) of a module named ``module``: ``module.layer``, or
    ``module.get_submodule('blocks.0')`` when a part is not an identifier."""
    if not path:
        return "module"
    if all(part.isidentifier() for part in path.split(".")):
        return f"module.{path}"
    return f"module.get_submodule({path!r})"
