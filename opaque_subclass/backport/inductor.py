"""Inductor with opaque graph inputs (torch 2.11).

An opaque that reaches inductor's graph (a custom op taking a subclass's mesh
or process group) is a ``TorchBindObject`` buffer there. torch 2.12 counts its
bytes as zero; torch 2.11 asks it for torchbind's ``__obj_flatten__``, which
an opaque does not have.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opaque_subclass.core.registry import opaque_kind

__all__ = ["make_get_buf_bytes"]


def make_get_buf_bytes(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._inductor.ir.TorchBindObject.get_buf_bytes`` (torch 2.11), the
    bytes inductor counts for a script-object buffer of its graph when its metrics log
    is on (``TORCH_LOGS=inductor_metrics``, or any handler at INFO on that log).

    Without it, an opaque graph input fails the compilation (``InductorError:
    AssertionError`` on ``hasattr(real_script_obj, "__obj_flatten__")``: torch 2.11
    tests the object, not its type, for an opaque). With it, a registered opaque counts
    zero bytes, as in torch 2.12 (pytorch/pytorch#176457's release); a torchbind object
    is torch's.
    """

    def get_buf_bytes(self: Any) -> int:
        if opaque_kind(self.get_real_obj()) is not None:
            return 0
        return int(original(self))

    return get_buf_bytes
