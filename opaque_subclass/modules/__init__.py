"""Tools for ``nn.Module`` parameters whose tensors are opaque-attribute
subclasses: the parametrization that exposes their leaves, and storage
accounting. Built on :mod:`opaque_subclass.core`."""
