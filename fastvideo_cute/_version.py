"""The library version, in a leaf module: the cache directories and the JIT key read it without
importing the package root (which imports the whole API)."""

__version__ = "0.1.0"
