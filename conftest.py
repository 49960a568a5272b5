"""Puts ``tests/`` on ``sys.path`` for the root-level scenario suite
(``test_opaque_obj_v2.py``), which imports the test fixtures (``subclasses``)
and shared scenario bodies (``scenarios``) from there; ``tests/conftest.py``
does the same for the modules under ``tests/``."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests"))
