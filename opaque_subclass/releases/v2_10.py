"""torch 2.10: unsupported (no opaque base class, no backport)."""

from __future__ import annotations

from opaque_subclass.releases.schema import Difference, ReleaseSupport

RELEASE = ReleaseSupport(
    (2, 10),
    "unsupported",
    None,
    differences=(Difference("no opaque base class (torch._opaque_base); a backport is not written yet"),),
)
