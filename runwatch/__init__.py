"""runwatch: watch long training runs through Kafka and act on what they do."""

__version__ = "0.1.0"
