"""Upstream torch bugs in opaque objects, with the library on (issue #36; the
table: docs/compatibility.md, "Upstream's own bugs in this feature").

Each test runs what a user would write and checks that the library's answer
holds on the running release: the right result where the library installs a
fix (``tests/test_fixes.py`` shows the fix is needed: with it suspended the
same scenario fails as recorded), or the library's named error where a fix is
not sound. The scenarios: ``tests/upstream_scenarios.py``.
"""

from __future__ import annotations

import pytest
from upstream_scenarios import value_opaque_beside_subclass_output_survives_the_caches

from opaque_subclass.releases import current

ROW = current()


@pytest.mark.skipif(
    ROW.release < (2, 12),
    reason="torch 2.11's Dynamo cannot return a value opaque built in the region (a listed difference)",
)
def test_193190_value_opaque_beside_subclass_output():
    """pytorch/pytorch#193190 (fixed upstream in torch 2.15; the library's fix
    on 2.12 - 2.14): the value opaque comes back real, compiled and from the caches."""
    value_opaque_beside_subclass_output_survives_the_caches()
