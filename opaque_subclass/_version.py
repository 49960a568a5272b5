"""The library's version, and nothing else.

The one place it is written: ``opaque_subclass.__version__`` (through
``opaque_subclass.releases.LIBRARY_VERSION``, which saved archives record) and
the distribution's metadata (``pyproject.toml`` reads it with
``[tool.setuptools.dynamic]``, from the source, without importing the package
or torch) both come from here.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
