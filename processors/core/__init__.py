"""The pure verdict engine: reducers ``(state, event) -> (state, verdicts)``.

No kafka, faust or torch import lives here (a test enforces it): the stream processors,
the replay/audit runner and the in-process `TrainingHealthMonitor` all fold the same
functions, so a verdict is the same live, in replay and in process. Design notes and every
difference from the seeds: ``docs/core.md``.

`COMPILED` says whether the mypyc-compiled copies of the hot kernels run (`native`).
"""

# isort: off
# First: chooses the compiled or the pure copy of each compiled module before any import.
from runwatch.processors.core.native import COMPILED

# isort: on
from runwatch.processors.core.baseline import RollingBaseline
from runwatch.processors.core.checkpoints import (
    CheckpointCatalogue,
    fold_checkpoint,
    latest_checkpoint,
)
from runwatch.processors.core.config import DetectorConfig, config_hash, with_overrides
from runwatch.processors.core.liveness import LivenessState, advance_step, fold_liveness
from runwatch.processors.core.mfu import flops_per_token, mfu, theoretical_flops_per_iter
from runwatch.processors.core.monitor import TrainingHealthMonitor
from runwatch.processors.core.policy import PolicyState, fold_policy
from runwatch.processors.core.replay import Replayer, ReplayResult, replay
from runwatch.processors.core.report import health_report
from runwatch.processors.core.state_codec import decode_state, encode_state
from runwatch.processors.core.steps import StepHealthState, fold_step
from runwatch.processors.core.verdicts import command_id, verdict_id

__all__ = [
    "COMPILED",
    "CheckpointCatalogue",
    "DetectorConfig",
    "LivenessState",
    "PolicyState",
    "ReplayResult",
    "Replayer",
    "RollingBaseline",
    "StepHealthState",
    "TrainingHealthMonitor",
    "advance_step",
    "command_id",
    "config_hash",
    "decode_state",
    "encode_state",
    "flops_per_token",
    "fold_checkpoint",
    "fold_liveness",
    "fold_policy",
    "fold_step",
    "health_report",
    "latest_checkpoint",
    "mfu",
    "replay",
    "theoretical_flops_per_iter",
    "verdict_id",
    "with_overrides",
]
