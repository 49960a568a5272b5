"""The library's errors reach the caller of a compiled function as themselves
(torch 2.11 - 2.15).

Dynamo compiles a frame in ``torch._dynamo.convert_frame._compile``, which
re-raises most exceptions it does not know as ``InternalTorchDynamoError`` with
the message ``f"{type(e).__qualname__}: {e}"``, ``from None`` (the original is
left as ``__context__`` only). An error the library raises while Dynamo
builds its variables (a subclass input that lists an ``int``) therefore
reached the user as ``InternalTorchDynamoError: TypeError: ...``, which reads
as a torch bug and is not caught by ``except TypeError``. An error of ours
raised while Dynamo or the backend runs the user's operations on fake tensors
(inside a subclass's ``__torch_dispatch__``) reached the user inside
``TorchRuntimeError`` or ``BackendCompilerFailed`` the same way.

The replacement calls torch's ``_compile`` unchanged and looks only at what
it raises. When that is one of Dynamo's wrappers whose chain of wrapped
exceptions leads to an instance of
:class:`~opaque_subclass.core.errors.OpaqueSubclassError`, the library's error
is raised instead; any other exception (torch's own, the user's, a graph
break) propagates exactly as torch raised it.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from opaque_subclass.core.errors import OpaqueSubclassError
from opaque_subclass.patching import composes

__all__ = ["make_compile", "ours_under"]

#: How many wrappers deep the library's error is looked for (torch 2.15 puts
#: five exceptions between ``TorchRuntimeError`` and an error raised in
#: ``__torch_dispatch__``).
_MAX_DEPTH = 12

_NOTE = "torch.compile raised it while tracing this user code:\n"

#: How Dynamo's ``run_node`` (``torch._dynamo.utils``) starts the message of the
#: ``RuntimeError`` it raises from an exception of an operation it ran on fake
#: tensors (torch 2.11 - 2.15).
_RUN_NODE = "Dynamo failed to run FX node with fake tensors: "


def _wrapped(error: BaseException) -> BaseException | None:
    """The exception torch wrapped in ``error``, when ``error`` is a wrapper.

    Dynamo's wrappers (every ``TorchDynamoException``: ``InternalTorchDynamoError``,
    ``TorchRuntimeError``, ``Unsupported``, ``ObservedException``...) name the
    wrapped exception as ``__cause__`` or, when raised ``from None``, leave it as
    ``__context__``; ``BackendCompilerFailed`` also keeps it as
    ``inner_exception``. A plain ``RuntimeError`` is a wrapper only when it is
    Dynamo's ``run_node`` wrapper (``RuntimeError("Dynamo failed to run FX node
    with fake tensors: ...") from e``): any other, the user's own included, is
    a failure of its own.
    """
    from torch._dynamo.exc import InternalTorchDynamoError, TorchDynamoException

    if isinstance(error, InternalTorchDynamoError) and error.__cause__ is None:
        # _compile's re-raise reads f"{type(e).__qualname__}: {e}"; another one
        # raised while handling an exception is torch's own failure
        context = error.__context__
        if context is not None and str(error).startswith(f"{type(context).__qualname__}: "):
            return context
        return None
    if isinstance(error, TorchDynamoException):
        inner = getattr(error, "inner_exception", None)
        if isinstance(inner, BaseException):
            return inner
        return error.__cause__ if error.__cause__ is not None else error.__context__
    if type(error) is RuntimeError and str(error).startswith(_RUN_NODE):
        return error.__cause__
    return None


def ours_under(error: BaseException) -> OpaqueSubclassError | None:
    """The library's error that ``error`` (one of Dynamo's wrappers) wraps, or ``None``.

    Follows wrapped exceptions (:func:`_wrapped`) from ``error`` down; the first
    one that is not a wrapper decides: the library's error is returned, anything
    else (torch's own error, the user's) gives ``None``.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    for _ in range(_MAX_DEPTH):
        if current is None or id(current) in seen:
            return None
        if isinstance(current, OpaqueSubclassError):
            return current
        seen.add(id(current))
        current = _wrapped(current)
    return None


def _note_user_code(ours: BaseException, wrapper: BaseException) -> None:
    """Keep the user's frames Dynamo attached to ``wrapper`` (the
    ``from user code:`` part of its message) as a note on ``ours`` (Python
    3.11+).

    ``_compile`` appends them to the message of the exception that reached it:
    the library's own error when Dynamo re-raised it as ``InternalTorchDynamoError``
    (nothing to add then), the wrapper's (``TorchRuntimeError``,
    ``BackendCompilerFailed``) otherwise.
    """
    from torch._dynamo.exc import InternalTorchDynamoError

    if isinstance(wrapper, InternalTorchDynamoError):
        return
    stack = getattr(wrapper, "real_stack", None)
    if not stack:
        return
    try:
        frames = "".join(traceback.format_list(stack)).rstrip("\n")
    except Exception:  # a note must never hide the error
        return
    note = _NOTE + frames
    add_note = getattr(ours, "add_note", None)  # Python 3.11+; 3.10 exceptions carry no notes
    if add_note is not None and note not in getattr(ours, "__notes__", ()):
        add_note(note)


@composes
def make_compile(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.convert_frame._compile`` (torch 2.11, 2.12, 2.13,
    2.14 and 2.15: each release's own fingerprint), where Dynamo compiles one
    frame and re-raises any exception it does not know as
    ``InternalTorchDynamoError``.

    Without it, an error of the library raised while Dynamo builds its
    variables (``torch.compile`` of a function whose subclass argument lists an
    ``int``) reaches the user as ``InternalTorchDynamoError: TypeError:
    MeshTensor.__tensor_flatten__() lists attribute '_mesh' ...``, which reads
    as a torch bug and escapes ``except TypeError``; one raised in a
    subclass's ``__torch_dispatch__`` while Dynamo or AOTAutograd traces it
    arrives inside ``TorchRuntimeError`` or ``BackendCompilerFailed``. With it,
    the library's own exception (an ``OpaqueSubclassError``; for a wrong type an
    ``OpaqueTypeError``, which is a ``TypeError``) is raised as itself, with its
    traceback from where it was raised, its own ``__cause__``, and Dynamo's
    ``from user code:`` frames (in its message, or as a note when torch had
    put them on the wrapper). Torch's ``_compile`` runs unchanged: every other
    exception, graph breaks (``Unsupported``) and
    ``torch._dynamo.config.suppress_errors`` (which suppresses the library's
    error exactly as it suppressed the wrapper) behave as on stock torch.
    torch 2.12's native opaque attributes (pytorch/pytorch#176457) do not
    change this: the wrapping is Dynamo's, for any exception it does not know.
    """
    from torch._dynamo.exc import BackendCompilerFailed, InternalTorchDynamoError, TorchRuntimeError

    wrappers = (InternalTorchDynamoError, TorchRuntimeError, BackendCompilerFailed)

    def _compile(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except wrappers as error:
            ours = ours_under(error)
            if ours is None:
                raise
            _note_user_code(ours, error)
        # raised here, outside the handler, so that the wrapper (whose context
        # is ours) does not become ours' __context__
        raise ours

    return _compile
