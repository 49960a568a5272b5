"""How patches are made: :mod:`.patching` (fingerprinted, all-or-nothing patch
sets, deferred until torch imports the target module) and :mod:`.hiding` (the
views of a subclass that hide its opaques from torch code that walks
``__tensor_flatten__`` itself)."""
