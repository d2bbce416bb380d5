"""Script replies as the client reads them: a short text reply is parsed once and then
looked up by its bytes, and what a lookup gives is what a parse gives, refusals
included."""

from __future__ import annotations

import pytest

from fairq.errors import ScriptProtocolError
from fairq.keys import Environment
from fairq.models import EnqueueRequest, EnqueueStatus
from fairq.store import _core
from fairq.store import enqueue as enqueue_mod
from fairq.store._core import status_of
from fairq.store.enqueue import enqueue_results
from fairq.store.status import ReplyMemo, Status

ENV = Environment("o", "p", "e")


def request(run_id: str) -> EnqueueRequest:
    return EnqueueRequest(ENV, "q", run_id, None)


@pytest.mark.parametrize("repeat", [1, 2, 3])
def test_a_one_run_reply_reads_the_same_every_time(repeat: int) -> None:
    for _ in range(repeat):
        (result,) = enqueue_results([request("a")], b"40 7 3")
        assert result.run_id == "a"
        assert (result.status, result.queue_size_limit) == (EnqueueStatus.REJECTED, 7)
        assert status_of(b"40 7 3") is Status.OK
    (other,) = enqueue_results([request("b")], b"40 7 3")
    assert other.run_id == "b"  # the lookup keeps the statuses, not the results


def test_several_runs_and_a_long_reply() -> None:
    runs = [request(f"r{i}") for i in range(40)]
    reply = b"40 0 " + b" ".join(b"1" if i % 2 else b"2" for i in range(40))
    results = enqueue_results(runs, reply)
    assert [r.status for r in results] == [
        EnqueueStatus.ENQUEUED if i % 2 else EnqueueStatus.DUPLICATE for i in range(40)
    ]
    assert reply not in enqueue_mod._PARSED_REPLIES  # longer than ReplyMemo.MEMO_BYTES


def test_refusals_hold_on_every_call() -> None:
    for _ in range(2):
        with pytest.raises(ScriptProtocolError):
            enqueue_results([request("a")], b"40 0 10")  # ACKED is no enqueue status
        with pytest.raises(ValueError):
            enqueue_results([request("a"), request("b")], b"40 0 1")  # one status, two runs
        with pytest.raises(ScriptProtocolError):
            enqueue_results([request("a")], [b"40", b"0", b"1"])  # not a text


def test_the_leading_status_of_texts_and_lists() -> None:
    assert status_of(b"41 0") is Status.NEEDS_FAIR
    assert status_of(b"41 0") is Status.NEEDS_FAIR
    assert status_of("41 0") is Status.NEEDS_FAIR
    assert status_of(b"99 0") is None
    assert status_of(b"hello") is None
    assert status_of([b"40", b"x"]) is Status.OK
    assert status_of(None) is None


def test_the_memos_stay_bounded() -> None:
    for i in range(ReplyMemo.MEMO_SIZE + 10):
        status_of(f"40 {i} 1".encode())
        enqueue_results([request("a")], f"40 {i} 1".encode())
    assert len(_core._TEXT_STATUS) <= ReplyMemo.MEMO_SIZE
    assert len(enqueue_mod._PARSED_REPLIES) <= ReplyMemo.MEMO_SIZE
