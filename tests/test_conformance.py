"""One behaviour on every release, measured: the conformance corpus
(``tests/conformance.py``) on the running leg against the reference
observations (``tests/conformance_reference.json``, recorded on the newest
release).

An entry whose observation differs from the reference fails unless the running
release's row of ``opaque_subclass.releases.RELEASES`` lists a
:class:`~opaque_subclass.releases.Difference` naming it; a listed entry that
observes the reference fails too (the listing is stale). Set
``OPAQUE_SUBCLASS_CONFORMANCE_DIR`` to keep each leg's observations
(``observations-<torch version>.json``) for comparison.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conformance import ENTRIES, REFERENCE, compare, run_entry
from scenarios import SHARED_CHUNK_JOB_GROUP

from opaque_subclass.releases import NEWEST, RELEASES, current

_REFERENCE = json.loads(REFERENCE.read_text())
_OBSERVED: dict[str, object] = {}


def _listed(row_release: tuple[int, int] | None = None) -> dict[str, str]:
    row = RELEASES[row_release] if row_release else current()
    return {name: d.text for d in row.differences for name in d.entries}


def test_corpus_is_large_enough_and_the_reference_covers_it():
    assert len(ENTRIES) >= 60
    assert sorted(_REFERENCE["observations"]) == sorted(ENTRIES), "re-record: python tests/conformance.py --out ..."
    assert _REFERENCE["torch"].startswith(".".join(map(str, NEWEST))), _REFERENCE["torch"]
    assert not _REFERENCE["stock"]


def test_every_listed_difference_names_corpus_entries():
    for release, row in RELEASES.items():
        if row.mode == "unsupported":
            continue
        for difference in row.differences:
            assert difference.entries, f"{release}: {difference.text!r} names no conformance entry"
            unknown = [n for n in difference.entries if n not in ENTRIES]
            assert not unknown, f"{release}: {unknown} are not conformance entries"
    assert not RELEASES[NEWEST].differences, "the reference release differs from nothing"


#: Entries that read a scenario some test of another module reads too (cached per process):
#: one xdist worker runs them all, so the scenario runs once per session.
_GROUPS = {"dtensor/share-compiles-job-of-two-ranks": SHARED_CHUNK_JOB_GROUP}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.xdist_group(_GROUPS[n])) if n in _GROUPS else n for n in sorted(ENTRIES)],
)
def test_entry_matches_reference(name):
    observed = run_entry(name)
    _OBSERVED[name] = observed
    reference = _REFERENCE["observations"][name]
    listed = _listed().get(name)
    if listed is None:
        assert observed == reference, (
            f"{name} differs from the reference ({_REFERENCE['torch']}) and the release table lists no "
            f"such difference.\n  reference: {json.dumps(reference)}\n  observed:  {json.dumps(observed)}"
        )
    else:
        assert observed != reference, f"{name} now observes the reference: drop the listed difference {listed!r}"


def test_zz_keep_observations():
    """Writes the leg's observations when asked (runs after the entries)."""
    folder = os.environ.get("OPAQUE_SUBCLASS_CONFORMANCE_DIR")
    if not folder:
        pytest.skip("OPAQUE_SUBCLASS_CONFORMANCE_DIR not set")
    import torch

    path = Path(folder) / f"observations-{torch.__version__}.json"
    path.write_text(json.dumps({"torch": torch.__version__, "stock": False, "observations": _OBSERVED}, indent=1))
    diff = compare({n: _REFERENCE["observations"][n] for n in _OBSERVED}, _OBSERVED)
    assert set(diff) == set(_listed()) & set(_OBSERVED)
