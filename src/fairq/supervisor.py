"""``fairq worker --processes N``: a supervisor that keeps N worker processes running.

* Each child is a plain ``fairq worker`` (``--processes 1``) in its own process group:
  the children share nothing but the server (each has its own connection, event loop and
  thread pool), so N processes use N cores for plain-function tasks.
* A child that exits with a failure while the supervisor is not stopping (a crash,
  ``kill -9``, the OOM killer) is started again after a backoff: 0.5 s, doubling per
  consecutive early death up to 30 s; a child that ran for :data:`STABLE_AFTER_S` resets
  its backoff. Its leased runs are not lost: their leases lapse and the runs go back to
  their queue. A child that exits 0 by itself (``--burst``, ``--max-runs``) is not
  restarted; the supervisor ends when all have.
* SIGTERM / SIGINT to the supervisor is forwarded once to every child, which stops taking
  work and finishes its in-flight runs (its ``--grace``); a second signal is forwarded
  again (the children return their runs at once). The supervisor exits when every child
  has, with status 0 when they all exited 0.
* A child watches its supervisor: if the supervisor dies (even ``kill -9``), the child
  stops gracefully by itself (:func:`watch_parent`), so no worker is left orphaned.

Cost: nothing per run; the supervisor polls its children's exit status every
:data:`POLL_S` seconds and never talks to the server.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

log = logging.getLogger("fairq.supervisor")

#: Environment variable a child gets: its supervisor's pid (for :func:`watch_parent`).
SUPERVISOR_PID_ENV: Final = "FAIRQ_SUPERVISOR_PID"
#: Environment variable a child gets: its slot, 0..N-1.
WORKER_INDEX_ENV: Final = "FAIRQ_WORKER_INDEX"
#: First restart delay (s); doubles per consecutive early death.
MIN_BACKOFF_S: Final = 0.5
#: Longest restart delay (s).
MAX_BACKOFF_S: Final = 30.0
#: A child that ran this long (s) resets its slot's backoff.
STABLE_AFTER_S: Final = 30.0
#: How often the supervisor checks its children (s).
POLL_S: Final = 0.1


def cpu_count() -> int:
    """Cores this process may use (``auto``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(slots=True)
class _Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    failures: int = 0
    restart_at: float | None = None
    restarts: int = 0
    exit_codes: list[int] = field(default_factory=list)


class Supervisor:
    """Runs ``processes`` copies of a worker command and keeps them running.

    Args:
        command: the argv of every child; or
        commands: one argv per child (e.g. each with its own metrics port).
        processes: how many children.
        env: the children's environment (default: this process's).
    """

    def __init__(
        self,
        command: Sequence[str] | None = None,
        processes: int = 1,
        *,
        commands: Sequence[Sequence[str]] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if processes < 1:
            raise ValueError("processes must be at least 1")
        if commands is None:
            if command is None:
                raise ValueError("give command or commands")
            commands = [list(command)] * processes
        if len(commands) != processes:
            raise ValueError("one command per process")
        self.commands = [list(c) for c in commands]
        self.processes = processes
        self.env = dict(os.environ if env is None else env)
        self.slots = [_Slot(i) for i in range(processes)]
        self._signals: list[int] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ children

    def _spawn(self, slot: _Slot) -> None:
        env = {
            **self.env,
            SUPERVISOR_PID_ENV: str(os.getpid()),
            WORKER_INDEX_ENV: str(slot.index),
        }
        # its own process group: a Ctrl-C in the terminal reaches the supervisor only,
        # which forwards it once (a second SIGINT would skip the children's grace period)
        slot.proc = subprocess.Popen(self.commands[slot.index], env=env, start_new_session=True)
        slot.started = time.monotonic()
        slot.restart_at = None
        log.info("worker %d started (pid %d)", slot.index, slot.proc.pid)

    def _reap(self, slot: _Slot, now: float, stopping: bool) -> None:
        proc = slot.proc
        if proc is None or proc.poll() is None:
            return
        code = proc.returncode
        slot.exit_codes.append(code)
        slot.proc = None
        if stopping or code == 0:
            # a clean exit of its own is the worker's choice (--burst, --max-runs)
            log.info("worker %d exited (%s)", slot.index, code)
            return
        ran = now - slot.started
        slot.failures = 0 if ran >= STABLE_AFTER_S else slot.failures + 1
        delay = min(MAX_BACKOFF_S, MIN_BACKOFF_S * 2 ** max(0, slot.failures - 1))
        slot.restart_at = now + delay
        log.warning(
            "worker %d (pid %d) exited with %s after %.1fs; restarting in %.1fs",
            slot.index, proc.pid, code, ran, delay,
        )  # fmt: skip

    def _forward(self, signum: int) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                    slot.proc.send_signal(signum)

    def _on_signal(self, signum: int, _frame: object) -> None:
        with self._lock:
            self._signals.append(signum)

    # ------------------------------------------------------------------ main loop

    @property
    def pids(self) -> list[int | None]:
        """The children's pids by slot (None while a slot waits to restart)."""
        return [None if s.proc is None else s.proc.pid for s in self.slots]

    def run(self, *, install_signal_handlers: bool = True) -> int:
        """Run until SIGTERM / SIGINT and every child exited; returns the exit status."""
        previous: dict[signal.Signals, object] = {}
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            for slot in self.slots:
                self._spawn(slot)
            stopping = False
            while True:
                with self._lock:
                    pending, self._signals = self._signals, []
                for signum in pending:
                    name = signal.Signals(signum).name
                    if stopping:
                        log.warning("%s again: the workers return their runs now", name)
                    else:
                        log.warning("%s: stopping %d worker(s) gracefully", name, self.processes)
                    stopping = True
                    self._forward(signum)
                now = time.monotonic()
                for slot in self.slots:
                    self._reap(slot, now, stopping)
                    due = slot.restart_at is not None and now >= slot.restart_at
                    if not stopping and slot.proc is None and due:
                        slot.restarts += 1
                        self._spawn(slot)
                if all(s.proc is None and s.restart_at is None for s in self.slots):
                    break
                time.sleep(POLL_S)
        finally:
            for slot in self.slots:  # only on an error of our own: never leave children
                if slot.proc is not None and slot.proc.poll() is None:
                    slot.proc.send_signal(signal.SIGTERM)
            for sig, handler in previous.items():
                signal.signal(sig, handler)  # type: ignore[arg-type]
        last = [s.exit_codes[-1] for s in self.slots if s.exit_codes]
        return 0 if all(code == 0 for code in last) else 1


def watch_parent(interval: float = 1.0) -> threading.Thread | None:
    """In a supervised child: SIGTERM ourselves (a graceful stop) once the supervisor is
    gone, so a supervisor killed outright leaves no orphaned worker. None when this process
    is not supervised."""
    raw = os.environ.get(SUPERVISOR_PID_ENV)
    if not raw or not raw.isdigit():
        return None
    parent = int(raw)
    if os.getppid() != parent:
        return None

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                log.warning("the supervisor (pid %d) is gone: stopping", parent)
                os.kill(os.getpid(), signal.SIGTERM)
                return

    thread = threading.Thread(target=watch, name="fairq-parent-watch", daemon=True)
    thread.start()
    return thread


__all__ = [
    "MAX_BACKOFF_S",
    "MIN_BACKOFF_S",
    "STABLE_AFTER_S",
    "SUPERVISOR_PID_ENV",
    "WORKER_INDEX_ENV",
    "Supervisor",
    "cpu_count",
    "watch_parent",
]
