"""Configuration: the retry policy's backoff and the ``FAIRQ_*`` environment variables."""

from __future__ import annotations

import random

import pytest

from fairq.config import RetryPolicy, RunQueueConfig, VirtualTimeOptions
from fairq.errors import ConfigurationError, FairqError

# --------------------------------------------------------------------------- retry policy


def test_default_retry_policy_matches_the_reference() -> None:
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.factor) == (12, 2.0)
    assert (policy.min_delay_ms, policy.max_delay_ms) == (1_000, 3_600_000)
    assert policy.randomize


@pytest.mark.parametrize("attempt", range(1, 16))
def test_backoff_doubles_from_one_second_and_caps_at_one_hour(attempt: int) -> None:
    """Attempt 1 waits 1-2 s, attempt 2 waits 2-4 s, ... never more than 1 h."""
    policy = RetryPolicy()
    rng = random.Random(attempt)
    low = min(1_000 * 2 ** (attempt - 1), 3_600_000)
    high = min(2 * 1_000 * 2 ** (attempt - 1), 3_600_000)
    delays = [policy.delay_ms(attempt, rng) for _ in range(200)]
    assert all(low <= d <= high for d in delays), (min(delays), max(delays))
    if high > low:  # jitter actually spreads the delays
        assert max(delays) - min(delays) > (high - low) / 2


def test_backoff_without_jitter_is_exact() -> None:
    policy = RetryPolicy(randomize=False)
    assert [policy.delay_ms(a) for a in (1, 2, 3, 4)] == [1_000, 2_000, 4_000, 8_000]
    assert policy.delay_ms(13) == 3_600_000
    assert policy.delay_ms(1000) == 3_600_000


def test_backoff_is_reproducible_with_a_seeded_rng() -> None:
    policy = RetryPolicy()
    a = [policy.delay_ms(3, random.Random(5)) for _ in range(3)]
    b = [policy.delay_ms(3, random.Random(5)) for _ in range(3)]
    assert a == b


def test_custom_policy_like_the_reference_tests() -> None:
    policy = RetryPolicy(max_attempts=5, factor=1.1, min_delay_ms=100, max_delay_ms=1_000)
    rng = random.Random(1)
    assert all(100 <= policy.delay_ms(1, rng) <= 200 for _ in range(100))
    assert all(policy.delay_ms(40, rng) == 1_000 for _ in range(10))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": 1001},
        {"factor": 0.5},
        {"factor": 101.0},
        {"min_delay_ms": -1},
        {"min_delay_ms": 5_000, "max_delay_ms": 1_000},
    ],
)
def test_invalid_retry_policies_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- config objects


@pytest.mark.parametrize(
    "kwargs",
    [
        {"shard_count": 0},
        {"default_env_concurrency": 0},
        {"default_burst_factor": 0.5},
        {"lease_ms": 10},
        {"max_per_key_per_call": 0},
        {"max_payload_bytes": 1},
        {"counter_ttl_seconds": 0},
    ],
)
def test_invalid_run_queue_configs_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError) as info:
        RunQueueConfig(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, FairqError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "kwargs",
    [{"quantum": 0}, {"scan_window_multiplier": 0}, {"join_policy": "random"}],
)
def test_invalid_virtual_time_options_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        VirtualTimeOptions(**kwargs)  # type: ignore[arg-type]


def test_with_vtime_copies() -> None:
    base = RunQueueConfig()
    fair = base.with_vtime(enabled=True, quantum=2.0)
    assert fair.vtime.enabled and fair.vtime.quantum == 2.0
    assert not base.vtime.enabled


# --------------------------------------------------------------------------- FAIRQ_* variables


def test_from_env_without_variables_gives_defaults() -> None:
    assert RunQueueConfig.from_env({}) == RunQueueConfig()


def test_from_env_reads_every_variable() -> None:
    config = RunQueueConfig.from_env(
        {
            "FAIRQ_PREFIX": "myapp",
            "FAIRQ_SHARD_COUNT": "8",
            "FAIRQ_MAX_PER_KEY_PER_CALL": "3",
            "FAIRQ_COUNTER_TTL_SECONDS": "60",
            "FAIRQ_CK_VTIME_ENABLED": "true",
            "FAIRQ_CK_VTIME_QUANTUM": "2.5",
            "FAIRQ_CK_VTIME_WINDOW_MULTIPLIER": "5",
            "FAIRQ_CK_VTIME_STATE_TTL_SECONDS": "120",
            "FAIRQ_CK_VTIME_JOIN_POLICY": "behind_leader",
        }
    )
    assert config.prefix == "myapp"
    assert config.shard_count == 8
    assert config.max_per_key_per_call == 3
    assert config.counter_ttl_seconds == 60
    assert config.vtime == VirtualTimeOptions(
        enabled=True,
        quantum=2.5,
        scan_window_multiplier=5,
        state_ttl_seconds=120,
        join_policy="behind_leader",
    )


@pytest.mark.parametrize(
    "raw, expected",
    [("1", True), ("yes", True), ("ON", True), (" True ", True), ("0", False), ("off", False)],
)
def test_boolean_variables(raw: str, expected: bool) -> None:
    config = RunQueueConfig.from_env({"FAIRQ_CK_VTIME_ENABLED": raw})
    assert config.vtime.enabled is expected


def test_empty_variables_are_ignored() -> None:
    assert RunQueueConfig.from_env({"FAIRQ_SHARD_COUNT": ""}).shard_count == 4


def test_overrides_win_over_variables() -> None:
    config = RunQueueConfig.from_env({"FAIRQ_SHARD_COUNT": "8"}, shard_count=2)
    assert config.shard_count == 2


@pytest.mark.parametrize(
    "name, raw",
    [
        ("FAIRQ_SHARD_COUNT", "many"),
        ("FAIRQ_SHARD_COUNT", "2.5"),
        ("FAIRQ_MAX_PER_KEY_PER_CALL", "x"),
        ("FAIRQ_COUNTER_TTL_SECONDS", "1e"),
        ("FAIRQ_CK_VTIME_ENABLED", "maybe"),
        ("FAIRQ_CK_VTIME_QUANTUM", "fast"),
        ("FAIRQ_CK_VTIME_WINDOW_MULTIPLIER", "3.0"),
        ("FAIRQ_CK_VTIME_STATE_TTL_SECONDS", "day"),
    ],
)
def test_unparsable_variables_raise_naming_the_variable(name: str, raw: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        RunQueueConfig.from_env({name: raw})
    assert name in str(info.value)
    assert raw in str(info.value)


OUT_OF_RANGE = [
    ("FAIRQ_SHARD_COUNT", "0"),
    ("FAIRQ_SHARD_COUNT", "20000"),
    ("FAIRQ_MAX_PER_KEY_PER_CALL", "0"),
    ("FAIRQ_COUNTER_TTL_SECONDS", "-5"),
    ("FAIRQ_CK_VTIME_QUANTUM", "0"),
    ("FAIRQ_CK_VTIME_WINDOW_MULTIPLIER", "0"),
    ("FAIRQ_CK_VTIME_STATE_TTL_SECONDS", "0"),
    ("FAIRQ_CK_VTIME_JOIN_POLICY", "random"),
]


@pytest.mark.parametrize("name, raw", OUT_OF_RANGE)
def test_out_of_range_variables_raise(name: str, raw: str) -> None:
    with pytest.raises(ConfigurationError):
        RunQueueConfig.from_env({name: raw})


@pytest.mark.parametrize("name, raw", [*OUT_OF_RANGE, ("FAIRQ_PREFIX", "has:colon")])
def test_out_of_range_variables_name_the_variable(name: str, raw: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        RunQueueConfig.from_env({name: raw})
    assert name in str(info.value)
