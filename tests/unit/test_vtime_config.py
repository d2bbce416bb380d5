"""VirtualTimeOptions and the FAIRQ_CK_VTIME_* environment variables (no server)."""

from __future__ import annotations

import pytest

from fairq.config import RunQueueConfig, VirtualTimeOptions
from fairq.errors import ConfigurationError


def test_defaults_match_the_plan() -> None:
    vt = VirtualTimeOptions()
    assert (vt.enabled, vt.quantum, vt.scan_window_multiplier, vt.state_ttl_seconds) == (
        False, 1.0, 3, 86_400,
    )  # fmt: skip
    assert vt.join_policy == "floor"


def test_defaults_that_hold_per_key_batch_follows_the_order_and_arrival_cap_is_finite() -> None:
    """No process-level per-key batch: the order decides (age 1, fair the whole call);
    the behind-the-leader arrival cap is finite (one quantum) by default."""
    assert RunQueueConfig().max_per_key_per_call is None
    vt = VirtualTimeOptions()
    assert vt.arrival_cap == 1.0
    assert (vt.charge, vt.charge_unit_ms) == ("count", 1000)


def test_environment_variables_are_read() -> None:
    cfg = RunQueueConfig.from_env({
        "FAIRQ_CK_VTIME_ENABLED": "true", "FAIRQ_CK_VTIME_QUANTUM": "0.5",
        "FAIRQ_CK_VTIME_WINDOW_MULTIPLIER": "5", "FAIRQ_CK_VTIME_STATE_TTL_SECONDS": "60",
        "FAIRQ_CK_VTIME_JOIN_POLICY": "behind_leader", "FAIRQ_MAX_PER_KEY_PER_CALL": "10",
    })  # fmt: skip
    vt = cfg.vtime
    assert (vt.enabled, vt.quantum, vt.scan_window_multiplier, vt.state_ttl_seconds) == (
        True, 0.5, 5, 60,
    )  # fmt: skip
    assert (vt.join_policy, cfg.max_per_key_per_call) == ("behind_leader", 10)


def test_unset_or_empty_variables_keep_defaults() -> None:
    assert RunQueueConfig.from_env({"FAIRQ_CK_VTIME_ENABLED": ""}).vtime == VirtualTimeOptions()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("FAIRQ_CK_VTIME_ENABLED", "maybe"),
        ("FAIRQ_CK_VTIME_QUANTUM", "0"),
        ("FAIRQ_CK_VTIME_QUANTUM", "-1"),
        ("FAIRQ_CK_VTIME_QUANTUM", "fast"),
        ("FAIRQ_CK_VTIME_QUANTUM", "nan"),
        ("FAIRQ_CK_VTIME_WINDOW_MULTIPLIER", "0"),
        ("FAIRQ_CK_VTIME_WINDOW_MULTIPLIER", "2.5"),
        ("FAIRQ_CK_VTIME_STATE_TTL_SECONDS", "0"),
        ("FAIRQ_CK_VTIME_JOIN_POLICY", "front"),
        ("FAIRQ_MAX_PER_KEY_PER_CALL", "0"),
    ],
)
def test_invalid_variables_fail_at_start_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        RunQueueConfig.from_env({name: value})
    message = str(info.value)
    assert name in message or "FAIRQ_CK_VTIME_" in message or "max_per_key" in message


@pytest.mark.parametrize(
    "changes",
    [
        {"quantum": 0.0},
        {"quantum": float("inf")},
        {"scan_window_multiplier": 101},
        {"state_ttl_seconds": -5},
        {"join_policy": "nowhere"},
        {"arrival_cap": -1.0},
        {"arrival_cap": float("nan")},
        {"arrival_cap": float("inf")},
        {"charge": "time"},
        {"charge_unit_ms": 0},
        {"enabled": "yes"},
    ],
)
def test_invalid_options_raise_configuration_error(changes: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        VirtualTimeOptions(**changes)  # type: ignore[arg-type]
