"""Value opaques that AOTAutograd flattens beside subclasses (torch 2.12 - 2.14).

pytorch/pytorch#193190. When a traced graph has a tensor-subclass input or
output, AOTAutograd flattens the whole list through
``subclass_utils.unwrap_tensor_subclasses``, and on torch 2.12 - 2.14 that
function swaps *every* registered opaque it meets for torch's fake wrapper
(``FakeScriptObject``), value opaques included. A value opaque is a constant
of the program: without a subclass beside it, torch inlines it in the graph
(its ``__fx_repr__``). Wrapped, inductor keeps the wrapper as a module
constant instead, so a compiled ``f(x) = (x * 2, Scale(3.0))`` with ``x`` a
subclass returns the ``FakeScriptObject`` (2.12, 2.13) and, once the graph is
loaded from the compile caches, ``None`` (2.12 - 2.14). torch 2.15 leaves
such objects real.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from opaque_subclass.core.registry import opaque_kind, real_object
from opaque_subclass.core.walk import is_wrapper_subclass
from opaque_subclass.patching import composes

__all__ = ["make_unwrap_tensor_subclasses"]


@composes
def make_unwrap_tensor_subclasses(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._functorch._aot_autograd.subclass_utils.unwrap_tensor_subclasses``
    (torch 2.12 - 2.14; pytorch/pytorch#193190, fixed in torch 2.15).

    Without it, a value opaque that sits in the same flat list as a tensor
    subclass (a compiled function returning ``(subclass, Scale(3.0))``) is
    swapped for torch's ``FakeScriptObject`` while AOTAutograd traces, and
    inductor compiles the wrapper in as a module constant: the function returns
    the ``FakeScriptObject`` (2.12, 2.13), and ``None`` when the graph is loaded
    from AOTAutograd's or inductor's cache (2.12 - 2.14).

    With it, torch's function runs as before; then each top-level, non-hoisted
    value opaque of the list it was given (one that was real, not already a
    fake wrapper) is put back in place of the wrapper torch made of it, so it
    is inlined as a constant exactly as when no subclass is beside it (torch
    2.15's behaviour). Reference opaques and hoisted value opaques (graph
    inputs) keep torch's wrapper. Value opaques never come from inside a
    subclass: torch refuses them among flattened attributes.
    """
    should_hoist: Callable[[type], bool] = importlib.import_module("torch._library.opaque_object").should_hoist

    def inlined_values(values: Sequence[Any]) -> dict[int, object]:
        found: dict[int, object] = {}
        for value in values:
            if value is None or isinstance(value, (torch.Tensor, int, float, bool, str)):
                continue
            if is_wrapper_subclass(value) or real_object(value) is not value:
                continue
            if opaque_kind(value) == "value" and not should_hoist(type(value)):
                found[id(value)] = value
        return found

    def unwrap_tensor_subclasses(wrapped_args: Any, wrapped_args_descs: Any, *args: Any, **kwargs: Any) -> Any:
        flat, descs = original(wrapped_args, wrapped_args_descs, *args, **kwargs)
        keep = inlined_values(wrapped_args)
        if not keep:
            return flat, descs
        restored = []
        for value in flat:
            real = real_object(value)
            restored.append(real if real is not value and keep.get(id(real)) is real else value)
        return restored, descs

    return unwrap_tensor_subclasses
