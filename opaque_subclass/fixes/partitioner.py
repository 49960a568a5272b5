"""AOTAutograd's partitioner on torch 2.14 and 2.15."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["make_partitioner_is_opaque_value"]


def make_partitioner_is_opaque_value(original: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ``torch._functorch.partitioners.is_opaque_value`` (torch 2.14 and
    2.15): the partitioner's own import of the function torch 2.14 deprecated,
    and only that import (torch's public function keeps its warning).

    Without it, every compile with a backward whose graph holds an opaque logs
    torch's ``is_opaque_value is deprecated, use is_custom_class_obj instead``:
    a warning about a call the user never made, from torch's own partitioner.
    With it, the partitioner asks the function's new name,
    ``is_custom_class_obj``, which answers the same without the warning. torch
    2.13 and older had no deprecation (the names were current); no release
    has moved the partitioner to the new name yet.
    """
    renamed: Callable[[object], bool] = importlib.import_module("torch._library.opaque_object").is_custom_class_obj

    def is_opaque_value(value: object) -> bool:
        return renamed(value)

    return is_opaque_value
