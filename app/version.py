"""The package's version: a leaf, so that any module may read it without importing the face."""

__version__ = "0.1.0"
