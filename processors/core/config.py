"""Detector configuration: every threshold and window in one frozen, hashable value.

A verdict carries `config_hash` of the configuration that produced it, so the same log
replayed with the same configuration yields the same verdict ids, and a replay with other
thresholds (``runwatch replay --set loss_z_thresh=8``) yields visibly different ones.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from functools import lru_cache
from typing import Annotated, Final, Literal

import msgspec

from runwatch.schemas.kinds import ALL_KINDS

MfuConvention = Literal["6N", "6N+attn"]
"""How FLOPs per token are counted: ``6N`` (weights only) or ``6N+attn`` (plus 12·L·d·T)."""

_DISABLED_WORDS: Final = frozenset({"none", "off", "null", ""})
_TRUE_WORDS: Final = frozenset({"1", "1.0", "true", "yes", "on"})
_FALSE_WORDS: Final = frozenset({"0", "0.0", "false", "no", "off"})

PosInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
PosFloat = Annotated[float, msgspec.Meta(gt=0.0)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0.0)]


class DetectorConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Every threshold and window the detectors use (see docs/core.md for the reasoning).

    Attributes:
        loss_window: Trailing steps in the loss baseline.
        loss_min_periods: Values needed before the loss baseline judges anything.
        loss_z_thresh: Robust z above which a loss is a spike (upward only).
        grad_window: Trailing steps in the grad-norm baseline.
        grad_min_periods: Values needed before the grad-norm baseline judges anything.
        grad_z_thresh: Robust z of the grad norm's logarithm above which it is a spike
            (upward only; grad norms are scored in log space, where their noise is).
        grad_min_ratio: A grad-norm spike must also be at least this many times the
            window's median (a tight window makes a small blip a large z).
        loss_shift_k: Allowance of the sustained-loss CUSUM: a loss adds its robust z
            minus this (at most ``loss_z_thresh``), so healthy noise adds up to nothing.
        loss_shift_h: The CUSUM above which the loss has shifted up (a sustained loss
            spike no single step shows); 0 disables.
        spike_recover_frac: A loss spike episode has recovered once the loss is back at or
            below the median plus this fraction of its rise (docs/core.md, "Spike episodes").
        spike_recover_steps: A loss spike episode not recovered this many steps after its
            first step pages (it stays up).
        spike_page_rel: A loss spike whose peak is at least this relative rise over the
            median (``peak / median - 1``) pages at once, whatever follows.
        spike_repeat_count: This many loss spike episodes starting within
            ``spike_repeat_steps`` steps page (the last one pages when it starts).
        spike_repeat_steps: The repeat window, in steps.
        grad_follow_steps: A grad-norm spike pages when a loss spike episode starts at its
            step or within this many steps after; otherwise it is information.
        max_loss: Loss ceiling: above it the run has diverged; None: no explicit ceiling.
        divergence_uniform_factor: Without ``max_loss``, the ceiling is this factor times
            ln(vocab_size) when the vocabulary is known; 0 disables the derived ceiling.
        collapse_steps: Consecutive steps near ln(vocab_size) that make a collapse.
        collapse_band_nats: How near ln(vocab_size) counts as "near" (absolute, nats).
        collapse_learned_nats: The run must once have been this far below ln(vocab_size)
            before a return to it counts as a collapse (a fresh model starts there).
        restart_check_steps: Steps after a restart marker judged against the baseline as
            it stood at the step resumed from.
        restart_z_thresh: Threshold for the restart check (per step and cumulative).
        restart_pair_z_thresh: Threshold for the cumulative z of the redone steps compared
            with their own first attempts (same weights, same batches: a healthy resume
            leaves almost nothing to add up, so this one can be lower).
        rank_heartbeat_threshold: A rank more than this many steps behind the run is dead.
        dead_rank_timeout_s: A rank silent this long in log time is dead.
        hang_timeout_s: No rank reported for this long in log time: the run hangs.
        startup_timeout_s: Before the first heartbeat of an incarnation, the hang timeout.
        straggler_ratio: A step time above this multiple of the peers' median is slow.
        straggler_steps: Consecutive slow steps that make a straggler.
        restart_budget: Most restart commands per run per budget window.
        restart_budget_window_steps: The budget window, in steps.
        history_steps: Kept steps remembered for exact rollback of baselines and totals.
        mfu_convention: How FLOPs per token are counted for MFU.
        min_scale_rel: When every value of a window is identical, the spread used is this
            fraction of the median (or of 1 when the median is 0).
        min_replicas: Fewest replica groups a run's steps should have in their quorum
            (a per-step fault-tolerant run); 0: no floor. A run announces it for itself
            (``RunStarted.thresholds={"min_replicas": M}``, ``runwatch launch
            --min-replicas-bound-s``).
        min_replicas_bound_s: Steps below ``min_replicas`` for longer than this, in log
            time, raise ``replicas_below_min``: the degraded run becomes a gang restart.
        shadow: Shadow mode for every kind: verdicts and the commands they would cause are
            recorded flagged ``shadow`` and never executed. A run sets it for itself with
            ``RunStarted.thresholds={"shadow": 1}``.
        shadow_kinds: Comma-separated kinds in shadow mode (``runwatch processors
            --shadow KIND,...``); empty: none.
    """

    loss_window: PosInt = 50
    loss_min_periods: PosInt = 10
    loss_z_thresh: PosFloat = 6.0
    grad_window: PosInt = 50
    grad_min_periods: PosInt = 10
    grad_z_thresh: PosFloat = 6.0
    grad_min_ratio: Annotated[float, msgspec.Meta(ge=1.0)] = 3.0
    loss_shift_k: NonNegFloat = 1.0
    loss_shift_h: NonNegFloat = 12.0
    spike_recover_frac: Annotated[float, msgspec.Meta(ge=0.0, lt=1.0)] = 0.5
    spike_recover_steps: PosInt = 3
    spike_page_rel: PosFloat = 0.5
    spike_repeat_count: Annotated[int, msgspec.Meta(ge=2)] = 3
    spike_repeat_steps: PosInt = 50
    grad_follow_steps: NonNegInt = 3
    max_loss: PosFloat | None = None
    divergence_uniform_factor: NonNegFloat = 2.0
    collapse_steps: PosInt = 20
    collapse_band_nats: PosFloat = 0.25
    collapse_learned_nats: PosFloat = 1.0
    restart_check_steps: NonNegInt = 20
    restart_z_thresh: PosFloat = 6.0
    restart_pair_z_thresh: PosFloat = 3.0
    rank_heartbeat_threshold: PosInt = 50
    dead_rank_timeout_s: PosFloat = 300.0
    hang_timeout_s: PosFloat = 600.0
    startup_timeout_s: PosFloat = 1800.0
    straggler_ratio: Annotated[float, msgspec.Meta(gt=1.0)] = 1.5
    straggler_steps: PosInt = 10
    restart_budget: NonNegInt = 3
    restart_budget_window_steps: PosInt = 1000
    history_steps: PosInt = 512
    mfu_convention: MfuConvention = "6N+attn"
    min_scale_rel: PosFloat = 1e-3
    min_replicas: NonNegInt = 0
    min_replicas_bound_s: PosFloat = 300.0
    shadow: bool = False
    shadow_kinds: str = ""

    def __post_init__(self) -> None:
        """Check the constraints that involve two fields, and the shadow kinds."""
        unknown = [k for k in _kinds_of(self.shadow_kinds) if k not in ALL_KINDS]
        if unknown:
            raise ValueError(
                f"shadow_kinds: unknown kind(s) {', '.join(unknown)}; kinds: {', '.join(ALL_KINDS)}"
            )
        for window, periods, name in (
            (self.loss_window, self.loss_min_periods, "loss"),
            (self.grad_window, self.grad_min_periods, "grad"),
        ):
            if periods > window:
                raise ValueError(f"{name}_min_periods ({periods}) > {name}_window ({window})")
        if self.history_steps < max(self.loss_window, self.grad_window):
            raise ValueError("history_steps must be >= loss_window and grad_window")


def _kinds_of(csv: str) -> list[str]:
    return [k.strip() for k in csv.split(",") if k.strip()]


def is_shadow(cfg: DetectorConfig, kind: str) -> bool:
    """True when verdicts of ``kind`` are in shadow mode under ``cfg`` (recorded, not acted on)."""
    return cfg.shadow or (bool(cfg.shadow_kinds) and kind in _kinds_of(cfg.shadow_kinds))


DEFAULT_CONFIG: Final = DetectorConfig()
VALID_KEYS: Final[tuple[str, ...]] = DetectorConfig.__struct_fields__

DAY_S: Final = 86_400.0
RUN_THRESHOLD_BOUNDS: Final[Mapping[str, tuple[float, float]]] = {
    "loss_window": (5, 4096),
    "loss_min_periods": (2, 4096),
    "loss_z_thresh": (2.0, 1000.0),
    "grad_window": (5, 4096),
    "grad_min_periods": (2, 4096),
    "grad_z_thresh": (2.0, 1000.0),
    "grad_min_ratio": (1.0, 1000.0),
    "loss_shift_k": (0.0, 100.0),
    "loss_shift_h": (0.0, 10_000.0),
    "max_loss": (1e-3, 1e9),
    "divergence_uniform_factor": (0.0, 1000.0),
    "collapse_steps": (2, 100_000),
    "collapse_band_nats": (1e-3, 10.0),
    "collapse_learned_nats": (1e-3, 100.0),
    "restart_check_steps": (0, 10_000),
    "restart_z_thresh": (1.0, 1000.0),
    "restart_pair_z_thresh": (1.0, 1000.0),
    "rank_heartbeat_threshold": (1, 1_000_000),
    "dead_rank_timeout_s": (1.0, DAY_S),
    "hang_timeout_s": (1.0, DAY_S),
    "startup_timeout_s": (1.0, DAY_S),
    "straggler_ratio": (1.01, 100.0),
    "straggler_steps": (1, 100_000),
    "restart_budget": (0, 100),
    "restart_budget_window_steps": (1, 1_000_000_000),
    "history_steps": (5, 8192),
    "min_scale_rel": (1e-9, 1.0),
    "spike_recover_frac": (0.0, 0.99),
    "spike_recover_steps": (1, 1000),
    "spike_page_rel": (0.01, 100.0),
    "spike_repeat_count": (2, 1000),
    "spike_repeat_steps": (1, 100_000),
    "grad_follow_steps": (0, 1000),
    "min_replicas": (0, 4096),
    "min_replicas_bound_s": (1.0, DAY_S),
}
"""The range a run's own threshold (``RunStarted.thresholds``) is clamped into, per field.

A run may tune its detectors, but a trainer's credential can write any run's RunStarted,
so no announced value may switch a detector off or make a state unstorable: a timeout is
at most a day (``hang_timeout_s: 1e12`` still detects a hang, after a day), a window or a
history at most a few thousand steps (memory), a step threshold at most a million (the
state's integers stay far inside int64). The operator's own configuration
(``runwatch processors --set``) is trusted and not bounded here. ``mfu_convention``,
``shadow`` and ``shadow_kinds`` are not numbers and have no entry. docs/core.md, "Records
that steer decisions"."""


def bounded_thresholds(thresholds: Mapping[str, float]) -> dict[str, float]:
    """A run's thresholds with each bounded field clamped into `RUN_THRESHOLD_BOUNDS`.

    Rules, in order:
        1. A field without bounds (unknown, or not a number) is passed on as announced
           (`with_overrides` judges it).
        2. A NaN is dropped: the processor's value applies.
        3. A value below or above the field's range becomes the range's end (an infinite
           ``max_loss`` too: a run cannot remove the ceiling the processor set).
        4. Anything else is kept.

    Args:
        thresholds: ``RunStarted.thresholds`` as announced.

    Returns:
        The thresholds the run's detectors use.
    """
    out: dict[str, float] = {}
    for key, value in thresholds.items():
        bounds = RUN_THRESHOLD_BOUNDS.get(key)
        if bounds is None or not isinstance(value, int | float) or isinstance(value, bool):
            out[key] = value
            continue
        if math.isnan(value):
            continue
        low, high = bounds
        out[key] = low if value < low else high if value > high else value
    return out


@lru_cache(maxsize=256)
def config_hash(cfg: DetectorConfig) -> str:
    """A stable short hex digest of a configuration (every field, by name).

    Args:
        cfg: The configuration.

    Returns:
        12 hex characters; equal configurations give equal hashes across processes.
    """
    canonical = msgspec.json.encode(msgspec.structs.asdict(cfg), order="sorted")
    return hashlib.blake2b(canonical, digest_size=6).hexdigest()


def _field_kind(name: str) -> str:
    default = getattr(DEFAULT_CONFIG, name)
    if name == "max_loss":
        return "optional_float"
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    if isinstance(default, float):
        return "float"
    return "str"


def _coerce(name: str, value: float | int | str) -> float | int | str | None:
    """Turn one override value into the field's type; ValueError with a reason if it can't."""
    kind = _field_kind(name)
    if isinstance(value, bool):
        raise ValueError("booleans are not accepted")
    if kind == "bool":
        word = str(value).strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
        raise ValueError(f"{value!r} is not a boolean (1/0, true/false)")
    if kind == "str":
        return str(value)
    if kind == "optional_float":
        if isinstance(value, str) and value.strip().lower() in _DISABLED_WORDS:
            return None
        number = float(value)
        if math.isinf(number) and number > 0:
            return None
        return number
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not finite")
    if kind == "int":
        if not number.is_integer():
            raise ValueError(f"{value!r} is not an integer")
        return int(number)
    return number


def with_overrides(
    cfg: DetectorConfig, overrides: Mapping[str, float | int | str]
) -> DetectorConfig:
    """A copy of ``cfg`` with some fields replaced, validated.

    Used by ``runwatch replay --set k=v`` (string values) and by ``RunStarted.thresholds``
    (float values; an integral float is accepted for an integer field).

    Args:
        cfg: The base configuration.
        overrides: Field name to new value.

    Returns:
        The new configuration (``cfg`` itself when ``overrides`` is empty).

    Raises:
        ValueError: One line naming the offending key and the valid keys.
    """
    if not overrides:
        return cfg
    valid = ", ".join(VALID_KEYS)
    merged = msgspec.structs.asdict(cfg)
    for key, raw in overrides.items():
        if key not in merged:
            raise ValueError(f"unknown detector setting {key!r}; valid keys: {valid}")
        try:
            merged[key] = _coerce(key, raw)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"bad value for {key}: {exc}; valid keys: {valid}") from None
    try:
        return msgspec.convert(merged, DetectorConfig)
    except (msgspec.ValidationError, ValueError) as exc:
        reason = str(exc).replace("\n", " ")
        raise ValueError(f"bad detector settings: {reason}; valid keys: {valid}") from None


@lru_cache(maxsize=1024)
def _cached_overrides(cfg: DetectorConfig, items: tuple[tuple[str, float], ...]) -> DetectorConfig:
    return with_overrides(cfg, dict(items))


def effective_config(cfg: DetectorConfig, thresholds: Mapping[str, float]) -> DetectorConfig:
    """``cfg`` with a run's own thresholds applied, bounded; invalid ones are ignored.

    Each announced value is first clamped into its sane range (`bounded_thresholds`), so
    no run disables a detector or makes its state unstorable. A run cannot crash the
    processor by announcing a bad threshold: when the overrides do not validate, the
    processor's configuration is used unchanged (the run's state keeps the thresholds it
    announced, so the report shows them).

    Args:
        cfg: The processor's configuration.
        thresholds: ``RunStarted.thresholds`` of the run.

    Returns:
        The configuration the run's detectors use.
    """
    if not thresholds:
        return cfg
    try:
        return _cached_overrides(cfg, tuple(sorted(bounded_thresholds(thresholds).items())))
    except ValueError:
        return cfg


__all__ = [
    "DEFAULT_CONFIG",
    "RUN_THRESHOLD_BOUNDS",
    "VALID_KEYS",
    "DetectorConfig",
    "MfuConvention",
    "bounded_thresholds",
    "config_hash",
    "effective_config",
    "is_shadow",
    "with_overrides",
]
