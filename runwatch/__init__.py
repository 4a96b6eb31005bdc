"""runwatch: watch long training runs through Kafka and act on what they do."""

from common.version import __version__

__all__ = ["__version__"]
