"""The installed version, from the package metadata (one source of truth: pyproject.toml)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kubeplex")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
