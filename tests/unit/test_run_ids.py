"""Fresh run ids sort in the order they were made, whatever the clock does."""

from __future__ import annotations

import re

from fairq.tasks import RunIds, new_run_id

ID = re.compile(r"^run_[0-9a-f]{32}$")


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms * 1_000_000 + 123  # nanoseconds, inside the millisecond


def test_ids_made_in_one_millisecond_sort_in_the_order_they_were_made() -> None:
    ids = RunIds(Clock(1_700_000_000_000))
    made = [ids() for _ in range(1_000)]
    assert all(ID.match(i) for i in made)
    assert sorted(made) == made and len(set(made)) == len(made)
    assert made[0].startswith(f"run_{1_700_000_000_000:012x}0000")
    assert made[999].startswith(f"run_{1_700_000_000_000:012x}{999:04x}")


def test_ids_stay_in_order_when_the_clock_moves_on_or_goes_back() -> None:
    clock = Clock(5_000)
    ids = RunIds(clock)
    made = [ids()]
    clock.ms = 5_001  # on: a new millisecond, the sequence starts again
    made.append(ids())
    assert made[1].startswith(f"run_{5_001:012x}0000")
    clock.ms = 4_000  # back (a clock step): still after every earlier id
    made += [ids(), ids()]
    assert sorted(made) == made and len(set(made)) == 4
    assert all(i.startswith(f"run_{5_001:012x}") for i in made[2:])


def test_more_ids_than_a_millisecond_holds_borrow_the_next_millisecond() -> None:
    ids = RunIds(Clock(7_000))
    made = [ids() for _ in range(0x10000 + 2)]
    assert sorted(made) == made and len(set(made)) == len(made)
    assert made[0x10000].startswith(f"run_{7_001:012x}0000")


def test_two_processes_in_one_millisecond_make_different_ids() -> None:
    a, b = RunIds(Clock(9_000)), RunIds(Clock(9_000))
    assert a() != b()  # same time and sequence: the random part tells them apart
    assert ID.match(new_run_id())


def test_a_child_forked_while_another_thread_makes_an_id_can_make_ids() -> None:
    import os
    import threading

    ids = RunIds(Clock(11_000))
    ids._lock.acquire()  # another thread is inside ids() at the moment of the fork
    try:
        pid = os.fork()
        if pid == 0:  # the child: its copy of the lock would be held forever
            try:
                ok = ID.match(ids()) is not None
            finally:
                os._exit(0 if ok else 1)
        done = threading.Event()
        status: list[int] = []

        def wait() -> None:
            status.append(os.waitpid(pid, 0)[1])
            done.set()

        threading.Thread(target=wait, daemon=True).start()
        if not done.wait(10):
            os.kill(pid, 9)
            raise AssertionError("the forked child hung on the run-id lock")
        assert status == [0]
    finally:
        ids._lock.release()
