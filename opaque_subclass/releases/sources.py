"""The recorded digests of the torch source files each release's fingerprints are read from
(``ReleaseSupport.sources``): data, in ``sources.json`` beside this module.

``tools/record_sources.py`` writes that file, run with each release's torch (do not edit it by
hand): per release (``"2.13"``), the torch build it was recorded on and ``{file under torch/:
digest}``, the ``"<fingerprints>"`` entry first (the digest of the fingerprints it was recorded
with). While a release's recorded files are unchanged, ``import opaque_subclass`` hashes them
instead of parsing them (:func:`opaque_subclass.patching.record_sources`); a release without an
entry, or with a stale one, has its fingerprints read from the sources: slower, never wrong.
"""

from __future__ import annotations

import importlib.resources
import json
from functools import cache
from typing import Any

__all__ = ["FILE", "recorded_sources"]

#: The data file, package data of ``opaque_subclass`` (``pyproject.toml``).
FILE = "sources.json"


@cache
def _table() -> dict[str, Any]:
    try:
        text = importlib.resources.files("opaque_subclass.releases").joinpath(FILE).read_text(encoding="utf-8")
    except FileNotFoundError:  # an install without the package data: every fingerprint is parsed
        return {}
    table: dict[str, Any] = json.loads(text)
    return table


def recorded_sources(release: tuple[int, int]) -> tuple[tuple[str, str], ...]:
    """``(file under torch/, digest)`` recorded for ``release``, ``("<fingerprints>", digest)``
    first; ``()`` when none is recorded."""
    entry = _table().get(f"{release[0]}.{release[1]}")
    return tuple(entry["files"].items()) if entry else ()
