"""``ExportedProgram.module()`` and the ``.pt2`` archive with opaque constants (torch 2.12).

torch 2.12 lifts a reference opaque read from a module attribute as a
custom-object constant of the exported program, but the unlifting that
``ExportedProgram.module()`` runs puts back only tensors and script objects
(``torch.export.unflatten._assign_attr``, unchanged from 2.11). The torch 2.11
backport's replacement of that function is exactly the fix; torch 2.13
assigns opaques itself. Its archive writer and reader (``torch.export.save``
and ``load``) also take only tensors and script objects as constants, the same
functions as 2.11's: the fixes write and read opaque constants as 2.13 does.
"""

from __future__ import annotations

from opaque_subclass.backport._machinery.patching import Patch
from opaque_subclass.backport.v2_11.archive import make_load_constants, make_package_opaque_constants
from opaque_subclass.backport.v2_11.export import make_assign_attr

__all__ = ["PATCHES"]

PATCHES = [
    Patch("torch.export.unflatten._assign_attr", "364fb4f027a9f58d", make_assign_attr),
    Patch("torch.export.pt2_archive._package._package_constants", "c503d4b5c778fbd4", make_package_opaque_constants),
    Patch("torch.export.pt2_archive._package._load_constants", "23b892b69c176401", make_load_constants),
]
