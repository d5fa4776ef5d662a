"""The package version, read once from the installed package's metadata (pyproject.toml)."""

from importlib.metadata import version

__version__ = version("tokentape")


__all__ = ["__version__"]
