"""One rank of :func:`opaque_subclass.testing.run_local_workers`:
``python -m opaque_subclass.testing._worker_main TARGET RANK WORLD PORT WORKDIR
PG_TIMEOUT``.

A module of its own, which nothing imports: ``python -m`` imports the parent
package ``opaque_subclass.testing`` first, and that package imports
:mod:`opaque_subclass.testing.workers`, so running ``workers`` itself with
``-m`` would execute it a second time and make runpy warn (``RuntimeWarning:
... found in sys.modules after import of package ...``) in every rank's output.
"""

import sys

from opaque_subclass.testing.workers import main

if __name__ == "__main__":
    sys.exit(main())
