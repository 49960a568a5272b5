"""``ExportedProgram.module()`` with opaque constants (torch 2.12).

torch 2.12 lifts a reference opaque read from a module attribute as a
custom-object constant of the exported program, but the unlifting that
``ExportedProgram.module()`` runs puts back only tensors and script objects
(``torch.export.unflatten._assign_attr``, unchanged from 2.11). The torch 2.11
backport's replacement of that function is exactly the fix; torch 2.13
assigns opaques itself.
"""

from __future__ import annotations

from ..patching import Patch
from ..v2_11.export import make_assign_attr

__all__ = ["PATCHES"]

PATCHES = [
    Patch("torch.export.unflatten._assign_attr", "364fb4f027a9f58d", make_assign_attr),
]
