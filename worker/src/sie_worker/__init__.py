"""sie-worker: places models on contiguous GPU blocks and runs one engine per model."""

from sie_worker._version import __version__

__all__ = ["__version__"]
