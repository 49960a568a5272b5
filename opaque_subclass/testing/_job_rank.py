"""One rank of :func:`opaque_subclass.testing.simulate_job`:
``python -m opaque_subclass.testing._job_rank SPEC_FILE``.

A module of its own, which nothing imports, for the reason
:mod:`opaque_subclass.testing._worker_main` gives.
"""

import sys

from opaque_subclass.testing.jobs import _run_rank

if __name__ == "__main__":
    sys.exit(_run_rank(sys.argv[1]))
