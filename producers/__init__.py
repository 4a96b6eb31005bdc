"""The trainer side of runwatch: put a training run's events on Kafka without slowing it.

`RunEmitter` is the one object a training script needs; `producers.logtail` turns the log
lines of scripts that only print into the same events (``runwatch tail-log``).
"""

from runwatch.producers.emitter import EmitterStats, RunEmitter

__all__ = ["EmitterStats", "RunEmitter"]
