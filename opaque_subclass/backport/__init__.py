"""The backport: what torch 2.11 lacks of opaque attributes, one module per
torch area (``fake``, ``dynamo``, ``aot_autograd``, ``runtime``, ``export``,
``archive``, ``parametrize``, ``distributed``, ``collectives``, ``dtensor``),
and :mod:`.hiding`, the views that route opaques past torch 2.11 helpers that
walk inner tensors.

Each module holds replacement factories (``make_<name>(original)``), whose
docstrings say what fails without them and what changes with them. Which torch
function each replaces, with the fingerprint of the original, is a row of
``opaque_subclass/releases/v2_11.py``; some rows of the native releases reuse a
factory from here (torch 2.12 shares functions with 2.11). The core modules of
``opaque_subclass`` never import this package.
"""
