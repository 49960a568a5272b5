"""Compiler-side tools built on :mod:`opaque_subclass`, one concept per module.

* :func:`explain` (``explain.py``) - compile a call and report, per graph, its
  flat inputs (attribute paths, opaques sharing one object), the flatten
  contexts torch guards on, the objects baked in, the findings, and later
  calls' recompilations in opaque terms.
* Lints with stable codes (``findings.py``): OSC001 reference-like objects in a
  flatten context (``context.py``), OSC002 ones baked into a graph
  (``baked.py``), OSC003 guarded opaque sharing (``guards.py``, which also
  translates recompile reasons), OSC004 opaque values read while tracing and
  compiled in (``reads.py``: Dynamo's reads via the member fix, and reads below
  Dynamo while the inner backend compiles), OSC005 collectives on a process
  group named by a constant (``collectives.py``: Dynamo's and those issued
  below it, such as DTensor's).
* :func:`checking_backend` / ``backend="opaque_check"`` (``backend.py``) - the
  lints on every graph before an inner backend compiles it (watched below
  Dynamo with ``watch_reads=True``, as ``explain`` does).
* ``ordering.py`` - :class:`~compile_passes.ordering.FindingsFirst`: ``explain``
  logs its findings before torch's first warning or error of a call, leaving
  torch's records as they are.
* :func:`explain_flat_inputs` (``inputs.py``) - the flat inputs of an argument list.
* ``messages.py`` - the texts of the findings, fixes and recompile reasons, one
  constructor per situation; the lints decide which applies.

This package depends on :mod:`opaque_subclass`; the reverse never holds.
"""

from .backend import GraphCheck, check_graph, checking_backend, opaque_check
from .baked import BakedObject, baked_objects, lint_baked
from .collectives import BakedGroup, baked_groups, lint_collectives
from .context import lint_contexts, reference_reason
from .explain import Explanation, Recompile, explain
from .findings import CODES, Finding, OpaqueCheckError, OpaqueCheckWarning
from .guards import lint_sharing, translate_guard
from .inputs import FlatInput, InputReport, explain_flat_inputs

__all__ = [
    "CODES",
    "BakedGroup",
    "BakedObject",
    "Explanation",
    "Finding",
    "FlatInput",
    "GraphCheck",
    "InputReport",
    "OpaqueCheckError",
    "OpaqueCheckWarning",
    "Recompile",
    "baked_groups",
    "baked_objects",
    "check_graph",
    "checking_backend",
    "explain",
    "explain_flat_inputs",
    "lint_baked",
    "lint_collectives",
    "lint_contexts",
    "lint_sharing",
    "opaque_check",
    "reference_reason",
    "translate_guard",
]
