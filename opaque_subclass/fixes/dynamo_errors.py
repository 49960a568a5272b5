"""The library's errors reach the caller of a compiled function as themselves
(torch 2.11 - 2.15).

``torch._dynamo.convert_frame._compile`` re-raises most unknown exceptions as
``InternalTorchDynamoError("{type}: {e}")`` ``from None`` (the original only as
``__context__``), so a library error while Dynamo builds its variables read as
a torch bug, escaping ``except TypeError``; one raised on fake tensors (in a
``__torch_dispatch__``) arrived inside ``TorchRuntimeError`` or
``BackendCompilerFailed``.

The replacement runs torch's ``_compile`` unchanged; when a Dynamo wrapper it
raises wraps an :class:`~opaque_subclass.core.errors.OpaqueSubclassError`, that
is raised instead. Anything else (torch's, the user's, a graph break)
propagates exactly as torch raised it.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from opaque_subclass.core.errors import OpaqueSubclassError
from opaque_subclass.fixes import messages
from opaque_subclass.patching import composes

__all__ = ["make_compile", "ours_under"]

#: How many wrappers deep to look (torch 2.15 puts five between ``TorchRuntimeError``
#: and an error raised in ``__torch_dispatch__``).
_MAX_DEPTH = 12

#: The start of the ``RuntimeError`` Dynamo's ``run_node`` (``torch._dynamo.utils``) raises
#: from an operation failing on fake tensors (torch 2.11 - 2.15).
_RUN_NODE = "Dynamo failed to run FX node with fake tensors: "


def _wrapped(error: BaseException) -> BaseException | None:
    """The exception torch wrapped in ``error``, when ``error`` is a wrapper.

    Every ``TorchDynamoException`` names it as ``__cause__``, or ``__context__``
    when raised ``from None`` (``BackendCompilerFailed``: ``inner_exception``
    too). A plain ``RuntimeError`` is a wrapper only as ``run_node``'s
    (:data:`_RUN_NODE`); any other, the user's included, is a failure of its own.
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
    """The library's error that ``error`` (one of Dynamo's wrappers) wraps, or ``None``:
    the first non-wrapper down the :func:`_wrapped` chain decides."""
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
    """Keep the ``from user code:`` frames Dynamo put on ``wrapper`` as a note on
    ``ours`` (Python 3.11+). Nothing to add for ``InternalTorchDynamoError``:
    ``_compile`` appended them to ``ours``' own message.
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
    note = messages.user_code_note(frames)
    add_note = getattr(ours, "add_note", None)  # Python 3.11+; 3.10 exceptions carry no notes
    if add_note is not None and note not in getattr(ours, "__notes__", ()):
        add_note(note)


@composes
def make_compile(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._dynamo.convert_frame._compile`` (torch 2.11, 2.12, 2.13,
    2.14 and 2.15: each release's own fingerprint), where Dynamo compiles one
    frame and re-raises any exception it does not know as
    ``InternalTorchDynamoError``.

    Without it, a library error while Dynamo builds its variables (a subclass
    argument listing an ``int``) reaches the user as ``InternalTorchDynamoError:
    TypeError: MeshTensor.__tensor_flatten__() lists attribute '_mesh' ...``,
    reading as a torch bug and escaping ``except TypeError``; one raised in a
    ``__torch_dispatch__`` while tracing arrives inside ``TorchRuntimeError`` or
    ``BackendCompilerFailed``. With it, the library's exception (an
    ``OpaqueTypeError`` is a ``TypeError``) is raised as itself, with its
    traceback, ``__cause__`` and Dynamo's ``from user code:`` frames (in its
    message, or as a note). Other exceptions, graph breaks and
    ``torch._dynamo.config.suppress_errors`` behave as on stock torch. torch
    2.12's native opaque attributes (pytorch/pytorch#176457) do not change
    this: the wrapping is Dynamo's.
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
        # raised outside the handler: the wrapper must not become ours' __context__
        raise ours

    return _compile
