"""Error types and the shared wording of the project's user-facing messages.

Every message names the subclass, the attribute path (``x._inner._mesh``), the
type found, and a fix from :func:`import_fix` that runs as written (tests run it).
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

    The base of every error about users' input: ``except
    opaque_subclass.OpaqueSubclassError`` catches them all, and under
    ``torch.compile`` they reach the caller as themselves, not inside Dynamo's
    ``InternalTorchDynamoError``. Raised as such for problems in a traced or
    compiled program (a flat argument list not matching its subclass metadata);
    wrong kinds, bad values and missing attributes raise the subclasses below.
    """


class OpaqueTypeError(OpaqueSubclassError, TypeError):
    """An object of the wrong kind, given or listed by a subclass (an ``int`` among
    ``__tensor_flatten__``'s attributes, an unregistered opaque). A :class:`TypeError`."""


class OpaqueValueError(OpaqueSubclassError, ValueError):
    """A value the library cannot use (a dim out of range, an archive not matching
    its manifest). A :class:`ValueError`."""


class OpaqueAttributeError(OpaqueSubclassError, AttributeError):
    """An attribute to read is missing (listed by ``__tensor_flatten__``, absent on
    the instance). An :class:`AttributeError`."""


class OpaqueMemberError(OpaqueAttributeError):
    """Compiled code used an opaque's member not declared by ``register_opaque(cls,
    members=...)``: torch.compile cannot tell whether to evaluate (and guard) or trace it."""


def qualified_name(cls: type) -> str:
    """``module.QualName`` of a class, the way it is spelled in an import."""
    module = getattr(cls, "__module__", None) or "<unknown>"
    return f"{module}.{cls.__qualname__}"


def subject(cls: type) -> str:
    """A message's first mention of its subclass, module-qualified
    (``pkg.mod.MeshTensor``, ``__main__.MeshTensor``) to tell same-named classes
    apart; code in a fix keeps the bare name."""
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

    In the template ``call``, ``{cls}`` is the imported ``__qualname__``;
    ``opaque_subclass`` is imported. A class not importable by name (local, or in
    ``__main__``) is used as ``cls.__name__``, said to be needed in scope.
    """
    return imports_fix(call, cls=cls)


def imports_fix(call: str, **classes: type) -> str:
    """:func:`import_fix` for several classes, ``{name}`` for the one passed as ``name``."""
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
    """The fix for another package's class keeping an ``obj_type`` at ``path`` of
    its flatten context (OSC001's path after ``<context>``): adopt it as ``attr``."""
    escaped = repr(path).replace("{", "{{").replace("}", "}}")
    call = "opaque_subclass.adopt({cls}, {{" + repr(attr) + ": opaque_subclass.ContextOpaque(" + escaped + ", {obj})}})"
    return "for a class of another package, whose code you do not change, adopt it: " + imports_fix(
        call, cls=cls, obj=obj_type
    )


def submodule_expression(path: str) -> str:
    """Python naming the submodule at dotted ``path`` of ``module`` (``""``: the
    root): ``module.layer``, else ``module.get_submodule('blocks.0')``."""
    if not path:
        return "module"
    if all(part.isidentifier() for part in path.split(".")):
        return f"module.{path}"
    return f"module.get_submodule({path!r})"
