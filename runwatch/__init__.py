"""runwatch: watch long training runs through Kafka and act on what they do.

The supported surface for training code is what this package exports, imported lazily:
``import runwatch`` loads none of torch, faust or kafka, and each name below imports its
module (and that module's dependencies) on first use::

    from runwatch import RunEmitter                 # a rank's events onto Kafka
    from runwatch import mark_training_done         # every rank, once training ended well
    from runwatch import TrainingHealthMonitor      # the same verdicts, in process
    from runwatch import RunwatchTrainerCallback    # Hugging Face Trainer (extra ``hf``)
    from runwatch import RunwatchLightningCallback  # PyTorch Lightning (extra ``lightning``)
    from runwatch import get_training_backend, register_training_backend
    from runwatch import flop_config_from_causal_lm  # a Hugging Face model's FLOPs (torch)

Everything else (``runwatch.processors``, ``runwatch.controller``, ...) is runwatch's own
machinery: importable, but free to change between releases.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from runwatch.common.version import __version__

if TYPE_CHECKING:
    from runwatch.processors.core.monitor import TrainingHealthMonitor
    from runwatch.producers.backend import (
        BackendCapabilities,
        DistributedTrainingBackend,
        get_training_backend,
        register_training_backend,
        training_backend_capabilities,
        training_backend_names,
    )
    from runwatch.producers.callbacks.hf import RunwatchTrainerCallback
    from runwatch.producers.callbacks.lightning import RunwatchLightningCallback
    from runwatch.producers.emitter import EmitterStats, RunEmitter
    from runwatch.producers.rank_done import mark_training_done
    from runwatch.producers.torch_helpers import flop_config_from_causal_lm

PUBLIC_API: dict[str, str] = {
    "RunEmitter": "runwatch.producers.emitter",
    "EmitterStats": "runwatch.producers.emitter",
    "TrainingHealthMonitor": "runwatch.processors.core.monitor",
    "RunwatchTrainerCallback": "runwatch.producers.callbacks.hf",
    "RunwatchLightningCallback": "runwatch.producers.callbacks.lightning",
    "BackendCapabilities": "runwatch.producers.backend",
    "DistributedTrainingBackend": "runwatch.producers.backend",
    "get_training_backend": "runwatch.producers.backend",
    "register_training_backend": "runwatch.producers.backend",
    "training_backend_capabilities": "runwatch.producers.backend",
    "training_backend_names": "runwatch.producers.backend",
    "flop_config_from_causal_lm": "runwatch.producers.torch_helpers",
    "mark_training_done": "runwatch.producers.rank_done",
}
"""Public name -> the module that defines it (imported on first access)."""

__all__ = [
    "BackendCapabilities",
    "DistributedTrainingBackend",
    "EmitterStats",
    "RunEmitter",
    "RunwatchLightningCallback",
    "RunwatchTrainerCallback",
    "TrainingHealthMonitor",
    "__version__",
    "flop_config_from_causal_lm",
    "get_training_backend",
    "mark_training_done",
    "register_training_backend",
    "training_backend_capabilities",
    "training_backend_names",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first access (PEP 562)."""
    module = PUBLIC_API.get(name)
    if module is None:
        raise AttributeError(f"module 'runwatch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *PUBLIC_API})
