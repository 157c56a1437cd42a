"""The package's version, in the base layer so that any layer (the HTML page, the CLI) can name it
without importing the package root."""

__version__ = "0.1.0"
