"""A pure-Python reference model of the concurrency-key dequeue of one base queue.

It implements the same discipline as ``dequeue_ck.lua`` (age order) and
``dequeue_ck_vtime.lua`` + ``hooks_vtime.lua`` (start-time fair queueing), written
from the specification rather than from the Lua, so the integration tests can run
random workloads through both and compare the serve order step by step.

The discipline (fair order):

* Every variant with queued runs has a virtual start tag; the floor is monotonic.
* A new variant joins at the floor (``floor``) or one quantum behind the highest tag,
  at most ``arrival_cap`` above the floor (``behind_leader``). A variant that drained
  earlier returns at ``max(floor, parked tag)``.
* One dequeue call: ``n = min(max_count, env limit x burst - env busy)``;
  ``window = n x multiplier``; tags below the floor count as the floor; variants
  whose head is in the future are skipped, variants with nothing queued are dropped
  (and their tags parked), and the rest are served lowest
  tag first, ties to the oldest head, then the name; each serve advances the tag by
  ``quantum / weight``; a variant is served at most ``max_per_key`` times per call and
  is dropped for the call when gated or when its next head is not ready.
* Candidates are the ``2 x window`` lowest tags plus the ``max(2 x window, 3 n)``
  oldest ready heads (discovery: a variant without a tag is registered at
  ``max(floor, parked)``); because every ready variant the age order would look at is
  a candidate, no separate age-order fill can serve more.
* The floor becomes ``max(stored, lowest stored tag, lowest tag served)``.

Not modelled: TTL expiry, stale message hashes, several queues per environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["age", "fair"]


@dataclass
class _Cand:
    ck: str
    key: float
    tie: float = 0.0
    weight: float = 1.0
    served: int = 0
    active: bool = True
    attempted: bool = False


@dataclass
class SfqModel:
    """One base queue's variants, their slots, and the virtual-time state."""

    mode: Mode = "fair"
    env_limit: int = 100
    burst_factor: float = 1.0
    queue_limit: int | None = None
    quantum: float = 1.0
    window_multiplier: int = 3
    join_policy: str = "floor"
    arrival_cap: float = 2.0**32
    idle_max: int = 10_000
    max_per_key: int = 1
    queued: dict[str, dict[str, int]] = field(default_factory=dict)
    inflight: dict[str, set[str]] = field(default_factory=dict)
    vtime: dict[str, float] = field(default_factory=dict)
    floor: float | None = None
    vidle: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    run_variant: dict[str, str] = field(default_factory=dict)

    # ------------------------------------------------------------------ helpers

    @property
    def fair(self) -> bool:
        return self.mode == "fair"

    def head(self, ck: str) -> int | None:
        runs = self.queued.get(ck)
        if not runs:
            return None
        return min(runs.values())

    def ckindex(self) -> list[tuple[str, int]]:
        """Variants with queued runs, ``(name, head)``, in ZSET order."""
        out = [(ck, h) for ck in self.queued if (h := self.head(ck)) is not None]
        return sorted(out, key=lambda e: (e[1], e[0]))

    def env_busy(self) -> int:
        return sum(len(s) for s in self.inflight.values())

    def variant_limit(self) -> int:
        limit = 1_000_000_000 if self.queue_limit is None else self.queue_limit
        return min(limit, self.env_limit)

    def stored_floor(self) -> float:
        return 0.0 if self.floor is None else self.floor

    # ------------------------------------------------------------------ hooks

    def _join_tag(self, ck: str, floor: float) -> float:
        if ck in self.vidle:
            return max(floor, self.vidle.pop(ck))
        if self.join_policy == "behind_leader" and self.vtime:
            top = max(self.vtime.items(), key=lambda e: (e[1], e[0]))[1]
            if top > floor:
                return min(top + self.quantum, floor + self.arrival_cap)
        return floor

    def _filled(self, ck: str) -> None:
        if not self.fair or ck in self.vtime:
            return
        self.vtime[ck] = self._join_tag(ck, self.stored_floor())

    def _drained(self, ck: str, tag: float, floor: float) -> bool:
        """Leave the order, parking a tag above the floor. Returns whether it parked."""
        self.vtime.pop(ck, None)
        if tag > floor:
            self.vidle[ck] = tag
            return True
        return False

    def _finish(self, floor: float) -> None:
        for ck in [c for c, t in self.vidle.items() if t <= floor]:
            del self.vidle[ck]
        if len(self.vidle) > self.idle_max:
            ranked = sorted(self.vidle.items(), key=lambda e: (e[1], e[0]))
            for ck, _ in ranked[: len(ranked) - self.idle_max]:
                del self.vidle[ck]

    # ------------------------------------------------------------------ operations

    def enqueue(self, ck: str, run: str, score: int) -> None:
        if run in self.run_variant:
            return
        self.run_variant[run] = ck
        self.queued.setdefault(ck, {})[run] = score
        self._filled(ck)

    def ack(self, run: str) -> None:
        ck = self.run_variant.pop(run)
        self.inflight.get(ck, set()).discard(run)

    def nack(self, run: str, retry_at: int) -> None:
        ck = self.run_variant[run]
        self.inflight[ck].discard(run)
        self.queued.setdefault(ck, {})[run] = retry_at
        self._filled(ck)

    def set_weight(self, ck: str, weight: float) -> None:
        self.weights[ck] = weight

    def _claim(self, ck: str, now: int) -> str | None:
        runs = self.queued.get(ck, {})
        ready = sorted((s, r) for r, s in runs.items() if s <= now)
        if not ready:
            return None
        run = ready[0][1]
        del runs[run]
        self.inflight.setdefault(ck, set()).add(run)
        return run

    def _serve_in_order(
        self, cands: list[_Cand], budget: int, now: int, out: list[tuple[str, str]],
        admit, on_served, on_head,  # type: ignore[no-untyped-def]
    ) -> int:  # fmt: skip
        total = 0
        limit = self.variant_limit()
        while total < budget:
            active = [c for c in cands if c.active]
            if not active:
                break
            c = min(active, key=lambda c: (c.key, c.tie, c.ck))
            c.attempted = True
            if (c.served == 0 and not admit(c)) or len(self.inflight.get(c.ck, ())) >= limit:
                c.active = False
            else:
                run = self._claim(c.ck, now)
                if run is not None:
                    out.append((run, c.ck))
                    c.served += 1
                    total += 1
                    on_served(c)
                head = self.head(c.ck)
                drained = head is None
                if run is not None:
                    on_head(c, head, drained)
                    if drained or head > now or c.served >= self.max_per_key:  # type: ignore[operator]
                        c.active = False
                else:
                    c.active = False
        return total

    def dequeue(self, max_count: int, now: int) -> list[tuple[str, str]]:
        """One dequeue call; returns ``(run, variant)`` in serve order."""
        n = min(max_count, int(self.env_limit * self.burst_factor) - self.env_busy())
        out: list[tuple[str, str]] = []
        if n <= 0:
            return out
        if not self.fair:
            window = [e for e in self.ckindex() if e[1] <= now][: n * self.window_multiplier]
            cands = [_Cand(ck, float(h)) for ck, h in window]

            def age_head(c: _Cand, head: int | None, drained: bool) -> None:
                if head is not None:
                    c.key = float(head)

            self._serve_in_order(cands, n, now, out, lambda c: True, lambda c: None, age_head)
            return out
        return self._dequeue_fair(n, now, out)

    def _dequeue_fair(self, n: int, now: int, out: list[tuple[str, str]]) -> list[tuple[str, str]]:
        window = n * self.window_multiplier
        scan = 2 * window
        stored = self.stored_floor()
        floor = stored
        ranked = sorted(self.vtime.items(), key=lambda e: (e[1], e[0]))[:scan]
        if ranked and ranked[0][1] > floor:
            floor = ranked[0][1]
        complete = len(ranked) < scan
        tag_of = dict(ranked)
        parked = False
        # discovery: the oldest ready heads; register those without a tag
        aged = [e for e in self.ckindex() if e[1] <= now][: max(scan, 3 * n)]
        head_of = dict(aged)
        order = [ck for ck, _ in aged]
        for ck in order:
            if ck in tag_of:
                continue
            if not complete and ck in self.vtime:
                tag_of[ck] = self.vtime[ck]
                continue
            tag = max(floor, self.vidle.pop(ck)) if ck in self.vidle else floor
            tag_of[ck] = tag
            self.vtime.setdefault(ck, tag)
        for ck, tag in ranked:
            if ck in head_of:
                continue
            head = self.head(ck)
            if head is None:
                parked |= self._drained(ck, tag, floor)
                del tag_of[ck]
            elif head <= now:
                head_of[ck] = head
                order.append(ck)
        cands = [
            _Cand(ck, max(tag_of[ck], floor), float(head_of[ck]), self.weights.get(ck, 1.0))
            for ck in order
            if ck in tag_of
        ]
        min_served: list[float] = []
        slots = 0

        def advance(c: _Cand) -> None:
            nonlocal slots
            if c.served == 1:
                slots += 1
            min_served.append(c.key)
            c.key = c.key + self.quantum / c.weight

        def written(c: _Cand, head: int | None, drained: bool) -> None:
            nonlocal parked
            if drained:
                parked |= self._drained(c.ck, c.key, floor)
            else:
                self.vtime[c.ck] = c.key
                c.tie = float(head)  # type: ignore[arg-type]

        self._serve_in_order(cands, n, now, out, lambda c: slots < window, advance, written)

        if min_served and min(min_served) > floor:
            floor = min(min_served)
        if out or floor > stored:
            self.floor = floor
        if parked:
            self._finish(floor)
        return out
