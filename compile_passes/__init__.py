"""Compiler-side tools built on :mod:`opaque_subclass`.

* :func:`explain_flat_inputs` - which flat graph inputs are tensors, opaques or
  symbolic sizes, which argument attribute each came from, and which opaques
  share one object (the identity guard a compiled graph depends on).

This package depends on :mod:`opaque_subclass`; the reverse never holds.
"""

from .inputs import FlatInput, InputReport, explain_flat_inputs

__all__ = ["FlatInput", "InputReport", "explain_flat_inputs"]
