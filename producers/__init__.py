"""The trainer side of runwatch: put a training run's events on Kafka without slowing it.

`RunEmitter` is the one object a training script needs; `mark_training_done` (every rank,
once training ended well) tells the rank's agent that a crash after it is the interpreter's
teardown, not a fault; `producers.logtail` turns the log lines of scripts that only print
into the same events (``runwatch tail-log``).
"""

from runwatch.producers.emitter import EmitterStats, RunEmitter
from runwatch.producers.rank_done import mark_training_done

__all__ = ["EmitterStats", "RunEmitter", "mark_training_done"]
