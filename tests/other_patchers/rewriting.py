"""Replaces ``AOTDispatchAutograd.process_runtime_tangent`` with a function that
does not call the one it replaced (a rewrite)."""

from __future__ import annotations

from typing import Any


def install() -> None:
    import torch._dynamo  # noqa: F401  # torch's runtime_wrappers imports back into Dynamo: load it first
    from torch._functorch._aot_autograd.runtime_wrappers import AOTDispatchAutograd

    def process_runtime_tangent(x: Any, meta: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the stand-in's own tangent handling")

    AOTDispatchAutograd.process_runtime_tangent = staticmethod(process_runtime_tangent)  # type: ignore[method-assign]


install()
