"""Fixes of torch behaviour on the native releases (torch >= 2.12), one module
per concern: replacement factories (``make_<name>(original)``) whose docstrings
say what fails without them and what changes with them.

* :mod:`.entry_checks`: named errors where torch first meets a subclass input
  (the checks themselves are :mod:`opaque_subclass.core.checks`); also used by
  the 2.11 backport;
* :mod:`.dynamo_errors`: the library's errors raised while Dynamo traces reach
  the user as themselves, not wrapped as an internal Dynamo error (every
  release, 2.11 included);
* :mod:`.autograd_cache`, :mod:`.members`, :mod:`.dtensor_mesh`: upstream bugs
  of every native release;
* :mod:`.tangent_attributes` (a tangent listing other attributes than its
  forward output), :mod:`.opaque_protocols` (an opaque whose ``__getattr__``
  answers every name): bugs of every release, also installed by the 2.11
  backport;
* :mod:`.registry` (torch 2.12), :mod:`.partitioner` (torch 2.14 and 2.15):
  bugs of one release;
* :mod:`.value_outputs` (torch 2.12 - 2.14): pytorch/pytorch#193190, a value
  opaque beside a subclass turned into torch's fake wrapper (fixed in 2.15);
* :mod:`.traced_opaques` (every release, also installed by the 2.11 backport):
  pytorch/pytorch#176044, a reference opaque made while torch traces refused
  by name instead of compiled in as a constant;
* :mod:`.callable_values` (torch 2.12 - 2.14): pytorch/pytorch#188796, a
  callable value opaque read off a subclass tensor made in the compiled
  region (a graph break; fixed in 2.15).
* :mod:`.subclass_guards` (every release, also installed by the 2.11
  backport): a subclass input whose class flattens every instance alike is
  guarded once per class and call instead of by two Python calls of its
  ``__tensor_flatten__`` (issue #39, per-call cost).

Which torch function each replaces on which release, with the fingerprint of
the original, is a row of ``opaque_subclass/releases/v2_NN.py``.
"""
