"""``python -m opaque_subclass``: see :mod:`opaque_subclass.cli`."""

import sys

from opaque_subclass.cli import main

sys.exit(main())
