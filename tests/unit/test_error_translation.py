"""Which driver errors the store turns into which of fairq's: what a consumer rides out
(ConnectionLostError, retried with backoff) and what it raises."""

from __future__ import annotations

import pytest
from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from fairq.errors import ConnectionLostError, FairqError
from fairq.store._core import translated

SERVER = "redis+cluster://127.0.0.1:7000"


@pytest.mark.parametrize(
    "error",
    [
        RedisConnectionError("Connection closed by server."),
        RedisTimeoutError("Timeout reading from socket"),
        BusyLoadingError("Redis is loading the dataset in memory"),
        ConnectionResetError(104, "Connection reset by peer"),
        ClusterDownError("The cluster is down"),
        MasterDownError("Link with MASTER is down"),
        TryAgainError("Multiple keys request during rehashing of slot"),
        ReadOnlyError("You can't write against a read only replica."),
        SlotNotCoveredError('Slot "4242" is not covered by the cluster.'),
        RedisClusterException("Redis Cluster cannot be connected. Please provide at least one"),
        RedisClusterException("All slots are not covered after query all startup_nodes."),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_server_that_cannot_serve_for_now_is_a_lost_connection(error: Exception) -> None:
    # Given an error a node restarting or failing over makes the client raise
    # When the store translates it
    mapped = translated(error, SERVER)
    # Then it is a lost connection (a consumer backs off and retries), naming the cause
    assert isinstance(mapped, ConnectionLostError)
    assert type(error).__name__ in str(mapped)
    assert SERVER in str(mapped)


@pytest.mark.parametrize(
    "error",
    [ResponseError("ERR wrong number of arguments"), RedisError("unexpected reply")],
    ids=lambda e: type(e).__name__,
)
def test_a_server_that_refuses_is_an_error_not_a_lost_connection(error: Exception) -> None:
    mapped = translated(error, SERVER)
    assert isinstance(mapped, FairqError)
    assert not isinstance(mapped, ConnectionLostError)


def test_an_error_of_another_kind_is_left_as_it_is() -> None:
    error = ValueError("not the driver's")
    assert translated(error, SERVER) is error
