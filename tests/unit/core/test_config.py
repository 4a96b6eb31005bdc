"""DetectorConfig, config_hash and with_overrides."""

from __future__ import annotations

import math

import pytest

from runwatch.processors.core.config import (
    VALID_KEYS,
    DetectorConfig,
    config_hash,
    effective_config,
    with_overrides,
)


def test_hash_is_stable_short_hex_and_sensitive() -> None:
    a, b = DetectorConfig(), DetectorConfig()
    assert config_hash(a) == config_hash(b)
    assert len(config_hash(a)) == 12 and int(config_hash(a), 16) >= 0
    assert config_hash(a) != config_hash(with_overrides(a, {"loss_z_thresh": 7}))


def test_hash_is_pinned() -> None:
    # Changing a default or adding a field changes every verdict id: do it on purpose.
    assert config_hash(DetectorConfig()) == "b880980534a0"


@pytest.mark.parametrize(
    ("overrides", "field", "expected"),
    [
        ({"loss_window": "30"}, "loss_window", 30),
        ({"loss_window": 30.0}, "loss_window", 30),
        ({"loss_z_thresh": "7.5"}, "loss_z_thresh", 7.5),
        ({"hang_timeout_s": 60}, "hang_timeout_s", 60.0),
        ({"max_loss": 20.0}, "max_loss", 20.0),
        ({"max_loss": "none"}, "max_loss", None),
        ({"max_loss": math.inf}, "max_loss", None),
        ({"mfu_convention": "6N"}, "mfu_convention", "6N"),
    ],
)
def test_valid_overrides(
    overrides: dict[str, float | int | str], field: str, expected: object
) -> None:
    cfg = with_overrides(DetectorConfig(), overrides)
    assert getattr(cfg, field) == expected


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"loss_windw": 3}, "unknown detector setting 'loss_windw'"),
        ({"loss_window": 2.5}, "not an integer"),
        ({"loss_window": "abc"}, "bad value for loss_window"),
        ({"loss_window": 0}, ">= 1"),
        ({"loss_min_periods": 60}, "loss_min_periods (60) > loss_window (50)"),
        ({"hang_timeout_s": "nan"}, "not finite"),
        ({"straggler_ratio": 1.0}, "> 1.0"),
        ({"mfu_convention": "7N"}, "mfu_convention"),
        ({"max_loss": -1}, "max_loss"),
        ({"history_steps": 10}, "history_steps"),
    ],
)
def test_invalid_overrides_name_the_problem_and_valid_keys(
    overrides: dict[str, float | int | str], message: str
) -> None:
    with pytest.raises(ValueError) as info:
        with_overrides(DetectorConfig(), overrides)
    text = str(info.value)
    assert message in text
    assert "\n" not in text
    assert "valid keys: " + ", ".join(VALID_KEYS) in text


def test_empty_overrides_return_the_same_object() -> None:
    cfg = DetectorConfig()
    assert with_overrides(cfg, {}) is cfg


def test_effective_config_ignores_invalid_run_thresholds() -> None:
    cfg = DetectorConfig()
    assert effective_config(cfg, {"loss_z_thresh": 8.0}).loss_z_thresh == 8.0
    assert effective_config(cfg, {"nonsense": 1.0}) is cfg


def test_every_numeric_field_has_run_bounds_that_hold_its_default() -> None:
    from runwatch.processors.core.config import RUN_THRESHOLD_BOUNDS, VALID_KEYS

    numeric = set(VALID_KEYS) - {"mfu_convention", "shadow", "shadow_kinds"}
    assert set(RUN_THRESHOLD_BOUNDS) == numeric
    defaults = DetectorConfig()
    for key, (low, high) in RUN_THRESHOLD_BOUNDS.items():
        default = getattr(defaults, key)
        assert low < high and (default is None or low <= default <= high), key
        # each end of the range is a valid value of the field (the constraints between two
        # fields, windows and history, may still refuse it beside the defaults)
        for end in (low, high):
            try:
                with_overrides(defaults, {key: end})
            except ValueError as exc:
                assert "min_periods" in str(exc) or "history_steps must" in str(exc), exc


def test_run_thresholds_out_of_range_are_clamped_never_disabling() -> None:
    from runwatch.processors.core.config import DAY_S, bounded_thresholds, effective_config

    base = DetectorConfig()
    cfg = effective_config(
        base,
        {
            "hang_timeout_s": 1e12,
            "dead_rank_timeout_s": -5.0,
            "rank_heartbeat_threshold": 1e300,
            "max_loss": float("inf"),
            "loss_z_thresh": float("nan"),
        },
    )
    assert cfg.hang_timeout_s == DAY_S
    assert cfg.dead_rank_timeout_s == 1.0
    assert cfg.rank_heartbeat_threshold == 1_000_000
    assert cfg.max_loss == 1e9
    assert cfg.loss_z_thresh == base.loss_z_thresh  # NaN: the processor's value
    assert bounded_thresholds({"hang_timeout_s": 30.0}) == {"hang_timeout_s": 30.0}
