"""Wraps ``AOTDispatchAutograd.process_runtime_tangent``, calling torch's (or whatever
was there) for every tangent, and counts the calls."""

from __future__ import annotations

from typing import Any

CALLS: list[str] = []


def install() -> None:
    import torch._dynamo  # noqa: F401  # torch's runtime_wrappers imports back into Dynamo: load it first
    from torch._functorch._aot_autograd.runtime_wrappers import AOTDispatchAutograd

    before = AOTDispatchAutograd.process_runtime_tangent
    if getattr(before, "_stand_in_shim", False):
        return

    def _process_runtime_tangent(x: Any, meta: Any, *args: Any, **kwargs: Any) -> Any:
        CALLS.append(type(x).__name__)
        return before(x, meta, *args, **kwargs)

    _process_runtime_tangent._stand_in_shim = True  # type: ignore[attr-defined]
    AOTDispatchAutograd.process_runtime_tangent = staticmethod(_process_runtime_tangent)  # type: ignore[method-assign]


install()
