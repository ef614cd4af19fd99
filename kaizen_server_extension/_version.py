"""The distribution's version, in a module of its own so parts of the package can name it
without importing the package's entry points."""

__version__ = "0.1.0"
