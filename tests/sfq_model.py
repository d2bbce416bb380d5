"""A pure-Python reference model of the two-level fair order of one environment.

Written from notes/fair_spec.md (the fair order's semantics as specified), not by
transliterating the Lua, so tests/integration/test_vtime_model.py can run random
workloads through the model and the real scripts and compare them serve by serve;
then brought in line with the design changes notes/migration.md records after it (the
floors as members of their sets, pruning on ticks, cap parks only for a flow holding a
slot plus a re-check, key sets read :data:`KEYS_LOADED` entries at a time, more while the best key
known may not be the tenant's best, and a tenant
leaving its queue's candidates only by what the call knows about its key set).

An ambiguity of the spec the workloads avoid: a key serving as its own tenant in
several queues takes the first weight found among them (so the tests give a key the
same weight in every queue).

Scope (fair order): several queues of one environment served by one dequeue call;
keyed flows and keyless flows (``*``); default tenants (a key is its own tenant,
keyless runs belong to ``/<queue>``) and named tenants (a pair with a key set); key and
tenant weights; per-key caps (queue concurrency, key cap overrides) and per-tenant caps
(parking on a cap, unparking when a slot of the key / tenant frees); ``max_per_key``;
the join policies ``floor`` and ``behind_leader``; behind the flag ``admit="budget"``
(default off: ``"floor"``), the design study's admission rule for new tenants (a
newcomer clock and a budget per floor epoch, see :meth:`SfqModel._admit_new`); behind
the flag ``pools=True`` (default off), fair state per pool (the set of queues a dequeue
serves: its own V:tt, floor and newcomer clock; a queue's enqueues use the state of
the pool that last served it, ``*`` before any); the tenant floor (start tag of the
run most recently begun, the ``~floor`` member of V:tt, read-repaired from the lowest
tag when lost; tags it passed pruned whenever it crosses a multiple of :data:`TICK`) and
the key floors; delayed heads (parked until due); cap parks (only for a flow that holds
a slot; re-checked after :data:`CAP_RECHECK_MS`); the candidate window and discovery.

The age order of one queue's keyed runs is modelled too (:meth:`SfqModel.dequeue_age`).

The limits under the order are modelled too: a queue's total cap (the queue serves no
more in the call), token-bucket rate limits of a queue, of every key / tenant and of
one key / tenant (a flow held back by a rate parks until its next token; the buckets'
stored text ``tokens:updated`` is part of the compared state), borrowing (flows held
back by a cap take the slots the call left unused, after the serve, in the order they
were held back) and charging by run time (``charge = "duration"``: a finished run's
tenant tag, its copy and its key's tag move by ``(run time / unit - 1) * quantum``
over the weight, where stored).

Not modelled: TTL expiry, cancel, stale run hashes, pausing, burst factors other than 1,
the age-order queues of a mixed call, and a tenant named like a key of another tenant.

Two details of the stored representation are part of the observable state and so are
modelled: a parked tag is stored as text (``'c:'`` / ``'d:'`` + the tag with 17
significant digits), and the candidate window, discovery and key-set loads read sorted
sets in Redis order (score, then member bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

INF = math.inf
KEYLESS = "*"
#: The scripts' "unlimited" (a queue without a concurrency limit).
UNLIMITED = 1_000_000_000
#: The floor crossing a multiple of this prunes the tags below it (and refreshes TTLs).
TICK = 8
#: A member parked by a cap is also re-checked this long after parking.
CAP_RECHECK_MS = 30_000
#: The member of V:tt that holds its floor.
FLOOR_MEMBER = "~floor"
#: The member of a key set that holds its floor (first among equal tags).
KEY_FLOOR_MEMBER = "!floor"
#: Entries of a key set a dequeue reads first (twice as many each time it needs more);
#: one fewer in a call with more candidate pairs than runs to serve.
KEYS_LOADED = 3
#: At most this many gather-and-serve rounds per dequeue call.
MAX_ROUNDS = 16
#: A gather reads at least this many copies of a queue's B:tq first.
FIRST_READ = 8


def flow_of(key: str | None, tenant: str | None) -> str:
    """The flow of a run: a key scoped by its named tenant (``T/k``, ``T/`` for the
    tenant's keyless runs), a key of no named tenant, or ``*``."""
    if tenant:
        return f"{tenant}/{key or ''}"
    return KEYLESS if key is None else key


def flow_tenant(flow: str) -> str | None:
    """The named tenant of a flow (None: it names none)."""
    return flow.split("/", 1)[0] if "/" in flow else None


def flow_key(flow: str) -> str:
    """The concurrency key of a flow ('' = none)."""
    if flow == KEYLESS:
        return ""
    return flow.split("/", 1)[1] if "/" in flow else flow


def keyless_group(flow: str) -> bool:
    """Whether a flow's runs hold the queue's keyless slots (it has no key)."""
    return flow == KEYLESS or flow.endswith("/")


def default_tenant(queue: str, flow: str) -> str:
    """The tenant a flow belongs to: its named tenant, else its key, or ``/<queue>``."""
    if flow == KEYLESS:
        return "/" + queue
    return flow_tenant(flow) or flow


def park_text(kind: str, tag: float) -> str:
    """The stored text of a parked tag (``c`` cap, ``d`` due): 17 significant digits (it
    round-trips exactly)."""
    return f"{kind}:{tag:.17g}"


@dataclass
class Run:
    queue: str
    flow: str
    tenant: str  # the tenant its enqueue named ('' = none)
    score: int
    ta: str = ""  # the named tenant whose slot it holds while running ('' = none)
    started: int | None = None  # when its lease began (while running)


@dataclass
class QueueModel:
    """One queue's runs and its part of the fair order's state."""

    name: str
    concurrency: int | None = None
    queued: dict[str, dict[str, int]] = field(default_factory=dict)  # flow -> run -> score
    inflight: dict[str, set[str]] = field(default_factory=dict)  # flow -> runs
    trunning: dict[str, int] = field(default_factory=dict)  # named tenant -> runs in flight
    tq: dict[str, float] = field(default_factory=dict)  # tenant -> tag copy
    keysets: dict[str, dict[str, float]] = field(default_factory=dict)  # tenant -> key -> tag
    kfloor: dict[str, float] = field(default_factory=dict)  # tenant -> key floor (!floor)
    named: bool = False  # a flow of the queue ever had a named tenant (the config flag)
    park: dict[str, str] = field(default_factory=dict)  # 't:T' / 'k:K' -> 'c:tag' / 'd:tag'
    parkdue: dict[str, int] = field(default_factory=dict)
    kcaps: dict[str, int] = field(default_factory=dict)
    tcaps: dict[str, int] = field(default_factory=dict)
    key_weights: dict[str, float] = field(default_factory=dict)
    total: int | None = None  # total cap: runs in flight of the whole queue
    #: rate limits, (runs per second, burst): the queue's, every key's and every
    #: tenant's by default, and the overrides of one key / tenant
    rate: tuple[float, int] | None = None
    key_rate: tuple[float, int] | None = None
    tenant_rate: tuple[float, int] | None = None
    key_rates: dict[str, tuple[float, int]] = field(default_factory=dict)
    tenant_rates: dict[str, tuple[float, int]] = field(default_factory=dict)
    #: the token buckets as stored: 'q' / 't:T' / 'k:F' -> 'tokens:updated_ms'
    buckets: dict[str, str] = field(default_factory=dict)
    borrow: bool = False  # capped flows may take the slots nobody else of the call used
    charge: bool = False  # charge = "duration": a run costs its run time, not a quantum
    #: the config flag: discovery lately registered flows (read every head it may)
    unregistered: bool = False

    def head(self, flow: str) -> int | None:
        runs = self.queued.get(flow)
        return min(runs.values()) if runs else None

    def ck_index(self) -> list[tuple[str, int]]:
        """Keyed flows with queued runs, (flow, head), in sorted-set order."""
        out = [(f, min(r.values())) for f, r in self.queued.items() if f != KEYLESS and r]
        return sorted(out, key=lambda e: (e[1], e[0]))

    def in_flight(self) -> int:
        """Runs of the queue in flight, keyed and keyless (for its total cap)."""
        return sum(len(r) for r in self.inflight.values())

    def running(self, flow: str) -> int:
        """Slots the flow holds: its own, or the keyless slots every keyless flow shares."""
        if keyless_group(flow):
            return sum(len(r) for f, r in self.inflight.items() if keyless_group(f))
        return len(self.inflight.get(flow, ()))

    def keys_of(self, tenant: str) -> dict[str, float]:
        return self.keysets.setdefault(tenant, {})


@dataclass
class _Ten:
    tag: float | None
    weight: float | None
    touched: bool = False


@dataclass
class _Key:
    flow: str
    tag: float
    tie: float
    weight: float
    active: bool = True
    touched: bool = False
    gone: bool = False  # left the key set in this call (drained or parked)


@dataclass
class _Pair:
    q: QueueModel
    tenant: str
    copy: float
    tie: float = INF
    disc: dict[str, float] = field(default_factory=dict)
    active: bool = True
    dropped: bool = False
    simple: bool = False
    keys: list[_Key] | None = None
    complete: bool = False  # its whole key set was loaded
    width: int = 0  # entries of its key set the last read asked for
    bound: float = INF  # no key it does not list has a lower tag
    kf: list[float | bool] | None = None  # [value, dirty] of its key floor
    ten: _Ten | None = None


@dataclass
class _Bucket:
    """A token bucket as one script tracks it (read once, refilled on its clock)."""

    tokens: float
    rate: float  # per second
    dirty: bool = False

    def peek(self, now: int) -> tuple[int, int]:
        """Whole tokens now, and when the next one arrives (ms)."""
        whole = math.floor(self.tokens + 1e-9)
        return whole, now + math.ceil((1 - (self.tokens - whole)) * 1000 / self.rate - 1e-9)


@dataclass
class _Floor:
    value: float
    start: float
    stored: bool


@dataclass
class _AgeCand:
    flow: str
    head: int
    served: int = 0
    active: bool = True


@dataclass
class _PoolState:
    """A pool's fair state while another pool's is current (``pools=True``)."""

    tt: dict[str, float]
    tfloor: float | None
    clock: float
    epoch: int
    joined: int


class _Call:
    """Per-script caches of the scripts (the floors are read once per script)."""

    def __init__(self, now: int) -> None:
        self.now = now
        self.floor: _Floor | None = None
        self.kf: dict[tuple[str, str], list[float | bool]] = {}
        #: (queue, tenant) whose key set got a key in this script
        self.kadded: set[tuple[str, str]] = set()
        self.buckets: dict[tuple[str, str], _Bucket] = {}


@dataclass
class SfqModel:
    """The fair order's state of one environment and the operations that change it."""

    env_limit: int = 100
    quantum: float = 1.0
    window: int = 3
    join: str = "floor"
    arrival_cap: float = 1.0
    max_per_key: int | None = None
    #: the admission rule for new tenants: "floor" (the scripts today) | "budget" (the
    #: design study's: see :meth:`_admit_new`); its budget and the newcomers' share
    admit: str = "budget"
    free: int = 1
    newcomer_weight: float = 1.0
    #: the newcomer clock, the floor epoch of the last counted new tenant, and how many
    new_clock: float = 0.0
    new_epoch: int = -1
    new_joined: int = 0
    #: fair state per pool (the set of queues a dequeue serves) instead of one per
    #: environment; the current pool, the others' states, and each queue's pool
    pools: bool = True
    pool: str = "*"
    pool_states: dict[str, _PoolState] = field(default_factory=dict)
    queue_pool: dict[str, str] = field(default_factory=dict)
    #: the queues that ever had a run (V:queues)
    known: set[str] = field(default_factory=set)
    queues: dict[str, QueueModel] = field(default_factory=dict)
    runs: dict[str, Run] = field(default_factory=dict)
    tt: dict[str, float] = field(default_factory=dict)  # V:tt
    tfloor: float | None = None  # V:tt[~floor]
    tw: dict[str, float] = field(default_factory=dict)  # V:tw
    #: the run time charged as one quantum (queues with ``charge = "duration"``)
    charge_unit_ms: int = 1_000
    #: how many times a serve read more of a key set than its first entries
    reads_more: int = 0
    short_reads: int = 0  # first reads of a key set one entry short (see load_keys)
    probes: int = 0  # tenants loaded from their discovered keys' tags only (probe_keys)
    #: how many runs were served by borrowing, and how many held back by a rate
    borrowed: int = 0
    rate_held: int = 0
    #: how many finished runs corrected their charge by their run time
    charged: int = 0
    #: how many flows discovery registered, and how many calls read every head because
    #: the queue's flag said the last reads registered some
    joined_by_discovery: int = 0
    full_reads: int = 0

    # ------------------------------------------------------------------ helpers

    def queue(self, name: str) -> QueueModel:
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = QueueModel(name)
        return q

    def env_busy(self) -> int:
        return sum(len(s) for q in self.queues.values() for s in q.inflight.values())

    def limit(self, q: QueueModel) -> int:
        """The per-key limit (and the keyless runs' total): min(queue limit, env limit)."""
        return min(UNLIMITED if q.concurrency is None else q.concurrency, self.env_limit)

    def _floor(self, call: _Call) -> _Floor:
        """The tenant floor of this script: V:tt[~floor], or read-repaired (lowest tag)."""
        if call.floor is None:
            if self.tfloor is not None:
                call.floor = _Floor(self.tfloor, self.tfloor, True)
            else:
                low = min(self.tt.values()) if self.tt else 0.0
                call.floor = _Floor(low, low, False)
        return call.floor

    def _key_floor(self, call: _Call, q: QueueModel, tenant: str) -> list[float | bool]:
        kf = call.kf.get((q.name, tenant))
        if kf is None:
            if tenant in q.kfloor:
                kf = [q.kfloor[tenant], False]
            else:
                kk = q.keysets.get(tenant) or {}
                kf = [min(kk.values()) if kk else 0.0, True]
            call.kf[(q.name, tenant)] = kf
        return kf

    # ------------------------------------------------------------------ registration

    def _tenant_join(self, call: _Call, tenant: str) -> float:
        floor = self._floor(call).value
        stored = self.tt.get(tenant)
        if stored is not None:
            return stored if stored > floor else floor
        if self.admit == "floor":
            return floor
        return self._admit_new(floor, tenant)

    # ------------------------------------------------------------------ admission

    def _admit_new(self, floor: float, tenant: str) -> float:
        """``admit="budget"``: where a new tenant (no tag in V:tt) starts.

        Before the floor is stored (no fair dequeue ran on this state yet, or it was
        lost: nobody to protect) it joins at the floor, uncounted, as today. Else the
        first ``free`` new tenants of each floor epoch (``floor // quantum``) join at
        the floor and the others at ``max(floor, clock)``; each of them advances the
        newcomer clock to ``max(floor, clock) + quantum / newcomer_weight``, and its
        start tag goes into V:tt at once (so its other queues find it, and attach reads
        it as the authoritative tag)."""
        if self.tfloor is None:
            return floor
        epoch = math.floor(floor / self.quantum + 1e-9)
        if epoch != self.new_epoch:
            self.new_epoch, self.new_joined = epoch, 0
        tag = floor if self.new_joined < self.free else max(floor, self.new_clock)
        self.new_clock = max(floor, self.new_clock) + self.quantum / self.newcomer_weight
        self.new_joined += 1
        self.tt[tenant] = tag
        return tag

    def _register_pair(self, call: _Call, q: QueueModel, tenant: str) -> None:
        if tenant in q.tq or f"t:{tenant}" in q.park:
            return
        q.tq[tenant] = self._tenant_join(call, tenant)

    def _key_join(self, call: _Call, q: QueueModel, tenant: str) -> float:
        floor = float(self._key_floor(call, q, tenant)[0])
        kk = q.keysets.get(tenant) or {}
        if self.join == "behind_leader" and kk:
            top = max(kk.values())
            if top > floor:
                return min(top + self.quantum, floor + self.arrival_cap)
        return floor

    def _register_key(self, call: _Call, q: QueueModel, tenant: str, flow: str) -> float | None:
        """Register a key in its named tenant's key set; its tag there (None: parked)."""
        kk = q.keys_of(tenant)
        if flow in kk:
            return kk[flow]
        if f"k:{flow}" in q.park:
            return None
        kf = self._key_floor(call, q, tenant)
        if tenant != flow and tenant not in kk and q.queued.get(tenant):
            # a key named as the tenant serves as its own tenant here: it joins the set
            kk[tenant] = float(kf[0])
        tag = self._key_join(call, q, tenant)
        kk[flow] = tag
        if kf[1]:
            q.kfloor[tenant] = float(kf[0])
            kf[1] = False
        call.kadded.add((q.name, tenant))
        return tag

    def _flow_queued(self, call: _Call, q: QueueModel, flow: str, score: int, is_new: bool) -> None:
        tenant = flow_tenant(flow) or ""
        default = default_tenant(q.name, flow)
        if not is_new:
            # a head that moved earlier may bring a time-parked flow back sooner
            for member in (f"k:{flow}", f"t:{default}"):
                if member in q.parkdue and score < q.parkdue[member]:
                    q.parkdue[member] = score
            return
        if not tenant:
            self._register_pair(call, q, default)
        else:
            self._register_key(call, q, tenant, flow)
            self._register_pair(call, q, tenant)

    def _place(self, call: _Call, q: QueueModel, flow: str, run: str, score: int) -> None:
        runs = q.queued.setdefault(flow, {})
        head = min(runs.values()) if runs else None
        runs[run] = score
        if head is None or score < head:
            if head is None and flow_tenant(flow):
                q.named = True
            self._flow_queued(call, q, flow, score, head is None)

    # ------------------------------------------------------------------ parking

    def _park(self, call: _Call, q: QueueModel, member: str, tag: float, due: int | None) -> None:
        q.park[member] = park_text("d" if due is not None else "c", tag)
        q.parkdue[member] = call.now + CAP_RECHECK_MS if due is None else due

    def _unpark(self, call: _Call, q: QueueModel, member: str) -> None:
        value = q.park[member]
        tag = float(value[2:])
        kind, name = member[0], member[2:]
        if kind == "t":
            q.tq.setdefault(name, tag)
            del q.park[member]
        else:
            named = flow_tenant(name)
            tenant = default_tenant(q.name, name)
            if named:
                q.keys_of(tenant).setdefault(name, tag)
                call.kadded.add((q.name, tenant))
            del q.park[member]
            self._register_pair(call, q, tenant)
        q.parkdue.pop(member, None)

    def _promote_due(self, call: _Call, q: QueueModel, now: int) -> None:
        due = sorted((d, m) for m, d in q.parkdue.items() if d <= now)[:64]
        for _, member in due:
            if member in q.park:
                self._unpark(call, q, member)
            else:
                del q.parkdue[member]

    def _slot_freed(self, call: _Call, q: QueueModel, flow: str, ta: str) -> None:
        tenant = ta or default_tenant(q.name, flow)
        members = [f"k:{flow}", f"t:{tenant}"]
        values = [q.park.get(m) for m in members]
        for member, value in zip(members, values, strict=True):
            if value is not None and value[0] == "c" and member in q.park:
                self._unpark(call, q, member)

    def _free(self, call: _Call, run_id: str) -> Run:
        run = self.runs[run_id]
        q = self.queues[run.queue]
        q.inflight[run.flow].discard(run_id)
        if run.ta:
            q.trunning[run.ta] -= 1
        self._slot_freed(call, q, run.flow, run.ta)
        run.ta = ""
        return run

    # ------------------------------------------------------------------ pools

    def _use_pool(self, pool: str) -> None:
        """``pools=True``: make ``pool``'s fair state (V:tt with its floor, the newcomer
        clock) the current one; tenant weights and the queues' state stay shared."""
        if not self.pools or pool == self.pool:
            return
        self.pool_states[self.pool] = _PoolState(
            self.tt, self.tfloor, self.new_clock, self.new_epoch, self.new_joined
        )
        st = self.pool_states.pop(pool, None) or _PoolState({}, None, 0.0, -1, 0)
        self.tt, self.tfloor = st.tt, st.tfloor
        self.new_clock, self.new_epoch, self.new_joined = st.clock, st.epoch, st.joined
        self.pool = pool

    def pool_of(self, queues: list[str]) -> str:
        """The pool a dequeue over ``queues`` serves: its sorted queue names (``*``
        without ``pools``, or when they cover every queue that ever had a run)."""
        if not self.pools or set(queues) >= self.known:
            return "*"
        return ",".join(sorted(set(queues)))

    # ------------------------------------------------------------------ operations

    def enqueue(
        self, queue: str, run: str, key: str | None, tenant: str | None, score: int, now: int = 0
    ) -> None:
        if run in self.runs:
            return
        self._use_pool(self.queue_pool.get(queue, "*"))
        self.known.add(queue)
        flow = flow_of(key, tenant)
        self.runs[run] = Run(queue, flow, tenant or "", score)
        self._place(_Call(now), self.queue(queue), flow, run, score)

    def enqueue_unregistered(
        self, queue: str, run: str, key: str | None, tenant: str | None, score: int
    ) -> None:
        """An enqueue by an age-order process: the run is queued, nothing registered (the
        fair dequeue's discovery finds its flow)."""
        if run in self.runs:
            return
        self.known.add(queue)
        flow = flow_of(key, tenant)
        self.runs[run] = Run(queue, flow, tenant or "", score)
        q = self.queue(queue)
        runs = q.queued.setdefault(flow, {})
        if not runs and flow_tenant(flow):
            q.named = True
        runs[run] = score

    def ack(self, run: str, now: int = 0) -> None:
        """A run finished: charged its run time (``charge``), then its slot freed."""
        self._use_pool(self.queue_pool.get(self.runs[run].queue, "*"))
        self._charge(self.runs[run], now)
        self._free(_Call(now), run)
        del self.runs[run]

    def nack(self, run_id: str, retry_at: int, now: int = 0) -> None:
        """A run failed and is retried at ``retry_at``: its slot freed, then its run
        time charged (``charge``)."""
        self._use_pool(self.queue_pool.get(self.runs[run_id].queue, "*"))
        call = _Call(now)
        ta = self.runs[run_id].ta
        run = self._free(call, run_id)
        self._charge(run, now, ta)
        run.score = retry_at
        self._place(call, self.queues[run.queue], run.flow, run_id, retry_at)

    def _charge(self, run: Run, now: int, ta: str | None = None) -> None:
        """``charge = "duration"``: the serve charged one quantum; correct the tags of
        the run's tenant (where stored: V:tt and its copy in the queue) and of its key
        in its named tenant's key set by what the run took."""
        q = self.queues[run.queue]
        if not q.charge or run.started is None:
            return
        tenant = (run.ta if ta is None else ta) or default_tenant(q.name, run.flow)
        delta = ((now - run.started) / self.charge_unit_ms - 1) * self.quantum
        if delta == 0:
            return
        self.charged += 1
        weight = self.tw.get(tenant)
        if weight is None and tenant == run.flow:
            weight = q.key_weights.get(tenant)
        tag = self.tt.get(tenant)
        if tag is not None:
            tag = tag + delta / (weight or 1.0)
            self.tt[tenant] = tag
            if tenant in q.tq:
                q.tq[tenant] = tag
        kk = q.keysets.get(tenant) or {}
        if flow_tenant(run.flow) and run.flow in kk:
            kk[run.flow] = kk[run.flow] + delta / self._kw(q, run.flow)

    def delete_floor(self) -> None:
        self.tfloor = None

    # ------------------------------------------------------------------ gates

    def _room(self, q: QueueModel, flow: str, tenant: str, named: bool) -> tuple[float, str | None]:
        limit = self.limit(q)
        cap = limit if keyless_group(flow) else q.kcaps.get(flow_key(flow), limit)
        room: float = INF
        bound = None
        if cap < self.env_limit:
            room, bound = cap - q.running(flow), "key"
        if named:
            tcap = q.tcaps.get(tenant, UNLIMITED)  # a named tenant has no cap by default
            if tcap < self.env_limit:
                t_room = tcap - q.trunning.get(tenant, 0)
                if t_room < room:
                    room, bound = t_room, "tenant"
        else:
            # a key's default tenant is the key: only an explicit tenant cap binds too
            own = q.tcaps.get(tenant)
            if own is not None and own < cap:
                t_room = own - q.running(flow)
                if t_room < room:
                    room, bound = t_room, "tenant"
        return room, bound

    def _total_room(self, q: QueueModel) -> float:
        """Room left under the queue's total cap."""
        return INF if q.total is None else q.total - q.in_flight()

    def _bucket(self, call: _Call, q: QueueModel, bid: str, limit: tuple[float, int]) -> _Bucket:
        """Bucket ``bid`` of q, read once per script and refilled to its clock."""
        b = call.buckets.get((q.name, bid))
        if b is None:
            rate, burst = limit
            raw = q.buckets.get(bid)
            tokens, updated = float(burst), call.now
            if raw is not None:
                t, u = raw.split(":")
                tokens, updated = float(t), int(u)
            if call.now > updated:
                tokens = min(burst, tokens + (call.now - updated) * rate / 1000)
            b = call.buckets[(q.name, bid)] = _Bucket(min(tokens, burst), rate)
        return b

    def _flow_buckets(
        self, call: _Call, q: QueueModel, flow: str, tenant: str
    ) -> list[tuple[_Bucket, str]]:
        """The buckets one flow's runs take from: the queue's, its tenant's, its key's."""
        out = []
        if q.rate is not None:
            out.append((self._bucket(call, q, "q", q.rate), "queue"))
        tenant_rate = q.tenant_rates.get(tenant) or q.tenant_rate
        if tenant_rate is not None:
            out.append((self._bucket(call, q, f"t:{tenant}", tenant_rate), "tenant"))
        if not keyless_group(flow):
            key_rate = q.key_rates.get(flow_key(flow)) or q.key_rate
            if key_rate is not None:
                out.append((self._bucket(call, q, f"k:{flow}", key_rate), "key"))
        return out

    @staticmethod
    def _rate_room(buckets: list[tuple[_Bucket, str]], now: int) -> tuple[float, str, int]:
        """Runs the buckets allow now, the scope that binds, when its next token comes."""
        room: float = INF
        scope, next_at = "", 0
        for b, where in buckets:
            whole, at = b.peek(now)
            if whole < room:
                room, scope, next_at = whole, where, at
        return room, scope, next_at

    @staticmethod
    def _flush_buckets(call: _Call, queues: dict[str, QueueModel]) -> None:
        for (name, bid), b in call.buckets.items():
            if b.dirty:
                queues[name].buckets[bid] = f"{b.tokens:.6f}:{call.now}"

    def _claim(
        self, q: QueueModel, flow: str, limit: int, ta: str, now: int, out: list[tuple[str, str]]
    ) -> tuple[int, int | None]:
        runs = q.queued.get(flow, {})
        ready = sorted((s, r) for r, s in runs.items() if s <= now)[:limit]
        for _, run in ready:
            del runs[run]
            q.inflight.setdefault(flow, set()).add(run)
            self.runs[run].ta = ta
            self.runs[run].started = now
            out.append((run, flow))
        if ta and ready:
            q.trunning[ta] = q.trunning.get(ta, 0) + len(ready)
        head = min(runs.values()) if runs else None
        return len(ready), head

    # ------------------------------------------------------------------ the fair serve

    def dequeue(self, queues: list[str], max_count: int, now: int) -> list[tuple[str, str, str]]:
        """One dequeue call over ``queues``: ``(run, queue, flow)`` in serve order (with
        ``pools``: in the fair state of the pool of ``queues``, which its queues'
        enqueues then use too)."""
        pool = self.pool_of(queues)
        self._use_pool(pool)
        if self.pools:
            self.queue_pool.update(dict.fromkeys(queues, pool))
        env_id = "E"
        ready: list[tuple[int, str, str, str]] = []  # (score, member, kind, queue)
        for name in queues:
            q = self.queue(name)
            keyless = q.head(KEYLESS)
            if keyless is not None and keyless <= now:
                ready.append((keyless, f"q:{env_id}:{name}", "q", name))
            index = q.ck_index()
            if index and index[0][1] <= now:
                ready.append((index[0][1], f"ck:{env_id}:{name}", "ck", name))
        if not ready:
            return []
        n = min(max_count, self.env_limit - self.env_busy())
        if n <= 0:
            return []
        ready.sort()
        order: list[QueueModel] = []
        heads: dict[str, int] = {}
        for score, _, kind, name in ready:
            if self.queues[name] not in order:
                order.append(self.queues[name])
            if kind == "q":
                heads[name] = score
        return self._fair_serve(order, heads, n, now)

    def _fair_serve(
        self, queues: list[QueueModel], heads: dict[str, int], budget: int, now: int
    ) -> list[tuple[str, str, str]]:
        """The fair queues of one call, in one SFQ order over (tenant, queue) pairs (see
        :class:`_FairServe`)."""
        return _FairServe(self, queues, heads, budget, now).run()

    def _kw(self, q: QueueModel, flow: str) -> float:
        return 1.0 if keyless_group(flow) else q.key_weights.get(flow_key(flow), 1.0)

    # ------------------------------------------------------------------ the age order

    def dequeue_age(
        self, queue: str, max_count: int, now: int, per_key: int = 1
    ) -> list[tuple[str, str, str]]:
        """One age-order call on one queue's keyed runs: the window's oldest ready head
        first, at most ``per_key`` runs per key, each claim only older than the next
        candidate's head (ties to the lower name); gated candidates drop out."""
        q = self.queue(queue)
        index = q.ck_index()
        if not index or index[0][1] > now:
            return []
        n = min(max_count, self.env_limit - self.env_busy())
        if n <= 0:
            return []
        cands = [_AgeCand(f, h) for f, h in index if h <= now][: n * self.window]
        out: list[tuple[str, str, str]] = []
        served = 0
        while served < n:
            active = sorted((c for c in cands if c.active), key=lambda c: (c.head, c.flow))
            if not active:
                break
            c, second = active[0], (active[1] if len(active) > 1 else None)
            flow = c.flow
            room, _ = self._room(
                q, flow, default_tenant(q.name, flow), flow_tenant(flow) is not None
            )
            take = int(min(n - served, per_key - c.served, room))
            if take <= 0:
                c.active = False
                continue
            runs = q.queued[flow]
            ready = sorted((s, r) for r, s in runs.items() if s <= now)
            got = 0
            for s, r in ready:
                if got >= take:
                    break
                if second is not None and (
                    s > second.head or (s == second.head and not flow < second.flow)
                ):
                    break
                del runs[r]
                q.inflight.setdefault(flow, set()).add(r)
                out.append((r, queue, flow))
                got += 1
            c.served += got
            served += got
            head = min(runs.values()) if runs else None
            if got == 0 or head is None or head > now or c.served >= per_key:
                c.active = False
            else:
                c.head = head
        return out


class _FairServe:
    """One dequeue call's fair serve, phase by phase as the scripts run it: gather
    candidates (:meth:`gather`), serve rounds (:meth:`serve_round`), borrow
    (:meth:`borrow_idle_slots`), write back (:meth:`write_back`)."""

    def __init__(
        self,
        m: SfqModel,
        queues: list[QueueModel],
        heads: dict[str, int],
        budget: int,
        now: int,
    ) -> None:
        self.m = m
        self.queues = queues
        self.heads = heads  # queue -> its ready keyless head
        self.budget = budget
        self.now = now
        self.call = _Call(now)
        self.by_id: dict[tuple[str, str], _Pair] = {}
        self.plist: list[_Pair] = []
        self.ten: dict[str, _Ten] = {}
        self.served = 0
        self.served_of: dict[tuple[str, str], int] = {}
        self.keysets: dict[tuple[str, str], _Pair] = {}
        self.out: list[tuple[str, str, str]] = []
        self.parked_now = False
        self.qdone: set[str] = set()  # queues that serve no more in this call
        self.widths: dict[str, int] = {}  # queue -> how many of its B:tq entries gathers read
        self.bounds: dict[str, float] = {}  # queue -> no pair it did not read has a lower copy
        self.tq_bound = INF  # the least of the last gather's bounds
        self.widen = False  # the last round stopped to read more candidates
        self.lenders: list[tuple[_Pair, str, _Key | None]] = []  # capped flows (borrow)

    def run(self) -> list[tuple[str, str, str]]:
        """Gather and serve rounds (again while a round parked something or must read
        more), borrowing, the buckets, the write-back; the runs served."""
        for rnd in range(MAX_ROUNDS):
            self.parked_now = False
            if self.gather() == 0 and rnd > 0 and not self.widen:
                break
            self.serve_round()
            if self.served >= self.budget or not (self.parked_now or self.widen):
                break
            if self.widen:  # twice the width of every queue not read to its end
                for name, b in self.bounds.items():
                    if b < INF:
                        self.widths[name] *= 2
        self.borrow_idle_slots()
        self.m._flush_buckets(self.call, self.m.queues)
        self.write_back()
        return self.out

    # ------------------------------------------------------------------ gather

    def pair_of(self, q: QueueModel, tenant: str, copy: float) -> _Pair:
        p = self.by_id.get((tenant, q.name))
        if p is None:
            p = self.by_id[(tenant, q.name)] = _Pair(q, tenant, copy)
            self.plist.append(p)
        return p

    def attach(self, first: int) -> None:
        m, ten = self.m, self.ten
        floor = m._floor(self.call).value
        for p in self.plist[first:]:
            if p.tenant not in ten:
                ten[p.tenant] = _Ten(m.tt.get(p.tenant), m.tw.get(p.tenant))
        for p in self.plist[first:]:
            t = ten[p.tenant]
            if t.weight is None and not p.tenant.startswith("/"):
                t.weight = p.q.key_weights.get(p.tenant)
        for p in self.plist[first:]:
            t = ten[p.tenant]
            if t.tag is None:
                t.tag = p.copy
            if t.tag < floor:
                t.tag = floor
            if t.weight is None:
                t.weight = 1.0
            p.ten = t

    def queue_open(self, q: QueueModel) -> bool:
        """Whether q may serve in this call (its total cap and rate leave room)."""
        if q.name in self.qdone:
            return False
        m = self.m
        full = m._total_room(q) <= 0
        limited = (
            not full
            and q.rate is not None
            and m._bucket(self.call, q, "q", q.rate).peek(self.now)[0] < 1
        )
        if full or limited:
            self.qdone.add(q.name)
        return q.name not in self.qdone

    def adopt_discovered(self, q: QueueModel, disc: list[tuple[str, int]], adopt: int) -> bool:
        """Discovered heads (and the keyless head): flows nothing registered join (and
        are candidates), a registered pair not yet a candidate only among the first
        ``adopt``. Returns whether one joined."""
        m = self.m
        flows = [f for f, _ in disc]
        found: dict[str, float] = {f: float(h) for f, h in disc}
        if q.name in self.heads:
            flows.append(KEYLESS)
            found[KEYLESS] = float(self.heads[q.name])
        unknown: list[tuple[str, str, int]] = []
        for i, f in enumerate(flows):
            tenant = default_tenant(q.name, f)
            p = self.by_id.get((tenant, q.name))
            if p is None:
                unknown.append((tenant, f, i))
            else:
                p.disc[f] = found[f]
                p.tie = min(p.tie, found[f])
        fresh = False
        scores = [q.tq.get(t) for t, _, _ in unknown]
        for (tenant, f, i), score in zip(unknown, scores, strict=True):
            joins = i < adopt or f == KEYLESS
            if score is None and f"k:{f}" not in q.park and f"t:{tenant}" not in q.park:
                if flow_tenant(f):
                    m._register_key(self.call, q, tenant, f)
                m._register_pair(self.call, q, tenant)
                score = q.tq.get(tenant)
                joins = fresh = True
                m.joined_by_discovery += 1
            if score is not None and joins:
                p = self.pair_of(q, tenant, score)
                p.disc[f] = found[f]
                p.tie = min(p.tie, found[f])
        return fresh

    def discover(self, q: QueueModel, width: int, most: int) -> None:
        """Discovery: ``adopt`` heads, or all it may read while the queue's flag says
        reads lately registered flows (then on to them when this one did)."""
        full = max(most, 3 * self.budget)
        adopt = min(max(width, math.ceil(3 * width / self.m.window)), full)
        first = full if q.unregistered else adopt
        self.m.full_reads += int(q.unregistered)
        ready = [e for e in q.ck_index() if e[1] <= self.now]
        fresh = self.adopt_discovered(q, ready[:first], adopt)
        read_all = len(ready) < first
        if fresh and not read_all and first < full:
            self.adopt_discovered(q, ready[:full], adopt)
        q.unregistered = fresh

    def gather(self) -> int:
        """Candidates of every open queue: its lowest ``width`` copies (``budget`` + 1
        at first, at least FIRST_READ, twice as many each time the call must read
        more, up to budget x window), and as many of its discovered heads (3 x width /
        window with a window under 3); when a flow among those joined, its heads on to
        max(budget x window, 3 x budget) (see ``adopt_discovered``)."""
        before = len(self.plist)
        self.tq_bound = INF
        for q in self.queues:
            if not self.queue_open(q):
                continue
            self.m._promote_due(self.call, q, self.now)
            most = self.budget * self.m.window
            first = max(self.budget + 1, FIRST_READ)
            width = self.widths[q.name] = min(self.widths.get(q.name, first), most)
            win = sorted(q.tq.items(), key=lambda e: (e[1], e[0]))[:width]
            for tenant, copy in win:
                self.pair_of(q, tenant, copy)
            self.bounds[q.name] = win[-1][1] if width < most and len(win) == width else INF
            self.tq_bound = min(self.tq_bound, self.bounds[q.name])
            self.discover(q, width, most)
        if len(self.plist) > before:
            self.attach(before)
        return len(self.plist) - before

    # ------------------------------------------------------------------ keys of a pair

    def pair_emptied(self, p: _Pair) -> bool:
        """Every key of a (wholly loaded) key set left it in this call."""
        if not p.complete or (p.q.name, p.tenant) in self.call.kadded:
            return False
        return all(k.gone for k in p.keys or [])

    @staticmethod
    def key_entries(p: _Pair, width: int) -> list[tuple[str, float]]:
        """The first ``width`` entries of p's key set (its floor member included), and
        whether that is all of it."""
        members = dict(p.q.keysets.get(p.tenant) or {})
        if p.tenant in p.q.kfloor:
            members[KEY_FLOOR_MEMBER] = p.q.kfloor[p.tenant]
        entries = sorted(members.items(), key=lambda e: (e[1], e[0]))[:width]
        p.width = width
        p.complete = len(entries) < width
        return entries

    def list_keys(self, p: _Pair, entries: list[tuple[str, float]]) -> None:
        assert p.keys is not None and p.kf is not None
        listed = {k.flow for k in p.keys}
        for f, tag in entries:
            if f != KEY_FLOOR_MEMBER and f not in listed:
                listed.add(f)
                k = _Key(f, max(tag, float(p.kf[0])), p.disc.get(f, INF), self.m._kw(p.q, f))
                p.keys.append(k)

    @staticmethod
    def read_bound(p: _Pair, entries: list[tuple[str, float]]) -> None:
        assert p.kf is not None
        p.bound = INF if p.complete else max(entries[-1][1], float(p.kf[0]))

    def load_keys(self, p: _Pair) -> None:
        if p.keys is not None or p.simple:
            return
        q, m = p.q, self.m
        width = KEYS_LOADED - 1 if len(self.plist) > self.budget else KEYS_LOADED
        if q.named and width < KEYS_LOADED and p.disc and self.probe_keys(p):
            return
        entries = self.key_entries(p, width) if q.named else []
        if entries and width < KEYS_LOADED:
            m.short_reads += 1
        if not entries:
            p.simple = True
            return
        kk = q.keysets.get(p.tenant) or {}
        p.kf = m._key_floor(self.call, q, p.tenant)
        p.keys = []
        self.list_keys(p, entries)
        self.read_bound(p, entries)
        listed = {k.flow for k in p.keys}
        added: list[tuple[str, float]] = []
        for f in sorted(f for f in p.disc if f not in listed):
            found = None if p.complete else kk.get(f)
            tag = found if found is not None else m._register_key(self.call, q, p.tenant, f)
            if tag is not None:
                added.append((f, tag))
        self.list_keys(p, added)
        self.keysets[(q.name, p.tenant)] = p
        if not p.keys and self.pair_emptied(p):
            self.drop(p)

    def probe_keys(self, p: _Pair) -> bool:
        """In a call with more candidate pairs than runs: when the tenant's key set has
        its floor and a discovered key is at it (a stored tag at most the floor), that
        key beats every key not discovered, so the pair lists the discovered keys only
        (registering a flow nothing registered): the bound is the floor, the set not
        known whole, and a later read takes 4 entries. Whether it did."""
        q, m = p.q, self.m
        if p.tenant not in q.kfloor:
            return False
        kk = q.keysets.get(p.tenant) or {}
        kf = m._key_floor(self.call, q, p.tenant)
        floor = float(kf[0])
        if not any(f in kk and kk[f] <= floor for f in p.disc):
            return False
        m.probes += 1
        p.kf, p.keys, p.width, p.complete, p.bound = kf, [], KEYS_LOADED - 1, False, floor
        added: list[tuple[str, float]] = []
        for f in sorted(p.disc):
            tag = kk.get(f)
            if tag is None:
                tag = m._register_key(self.call, q, p.tenant, f)
            if tag is not None:
                added.append((f, tag))
        self.list_keys(p, added)
        self.keysets[(q.name, p.tenant)] = p
        return True

    def load_more_keys(self, p: _Pair) -> None:
        self.m.reads_more += 1
        entries = self.key_entries(p, 2 * p.width)
        self.list_keys(p, entries)
        self.read_bound(p, entries)
        if self.pair_emptied(p):
            self.drop(p)

    @staticmethod
    def listed_best(p: _Pair) -> tuple[_Key | None, _Key | None]:
        active = sorted((k for k in p.keys or [] if k.active), key=lambda k: (k.tag, k.tie, k.flow))
        return (active[0] if active else None, active[1] if len(active) > 1 else None)

    def best_keys(self, p: _Pair) -> tuple[_Key | None, _Key | None]:
        """The tenant's best key and the next (at most the bound of what was read: a
        key not read may be there), reading more of its set while the best listed key
        may not be the best."""
        best, second = self.listed_best(p)
        while not p.complete and (best is None or best.tag > p.bound):
            self.load_more_keys(p)
            best, second = self.listed_best(p)
        if not p.complete and (second is None or second.tag > p.bound):
            second = _Key("", p.bound, INF, 1.0)
        return best, second

    # ------------------------------------------------------------------ leaving the order

    @staticmethod
    def drop(p: _Pair) -> None:
        p.active = False
        p.dropped = True
        p.q.tq.pop(p.tenant, None)

    def park_pair(self, p: _Pair, due: int | None) -> None:
        assert p.ten is not None and p.ten.tag is not None
        p.q.tq.pop(p.tenant, None)
        self.m._park(self.call, p.q, f"t:{p.tenant}", p.ten.tag, due)
        self.parked_now = True

    def park_key(self, p: _Pair, k: _Key, due: int | None) -> None:
        k.active = False
        k.gone = True
        p.q.keys_of(p.tenant).pop(k.flow, None)
        self.m._park(self.call, p.q, f"k:{k.flow}", k.tag, due)
        self.parked_now = True
        if self.pair_emptied(p):
            self.drop(p)

    # ------------------------------------------------------------------ serve a round

    @staticmethod
    def pair_key(c: _Pair) -> tuple[float, float, str, str]:
        assert c.ten is not None and c.ten.tag is not None
        return (c.ten.tag, c.tie, c.tenant, c.q.name)

    def advance(self, p: _Pair, kc: _Key | None, got: int) -> None:
        t = p.ten
        assert t is not None and t.tag is not None and t.weight is not None
        m = self.m
        step = m.quantum / t.weight
        start = t.tag
        f = m._floor(self.call)
        f.value = max(f.value, start + (got - 1) * step)
        t.tag = start + got * step
        t.touched = True
        if kc is not None:
            assert p.kf is not None
            kstep = m.quantum / kc.weight
            klast = kc.tag + (got - 1) * kstep
            if klast > float(p.kf[0]):
                p.kf[0] = klast
                p.kf[1] = True
            kc.tag = kc.tag + got * kstep
            kc.touched = True

    def claim(
        self, p: _Pair, flow: str, limit: int, buckets: list[tuple[_Bucket, str]]
    ) -> tuple[int, int | None]:
        """Claim up to ``limit`` ready runs of pair p's flow (in the served order) and
        take them from its buckets; the count and the flow's new head."""
        claimed: list[tuple[str, str]] = []
        ta = p.tenant if flow_tenant(flow) is not None else ""
        got, head = self.m._claim(p.q, flow, limit, ta, self.now, claimed)
        self.out.extend((r, p.q.name, f) for r, f in claimed)
        for b, _ in buckets:
            b.tokens -= got
            b.dirty = True
        return got, head

    def serve_round(self) -> None:
        """The SFQ loop; it stops (``widen``) when the best pair's tag passes what the
        gather read, or nobody is left while a queue was not read to its end."""
        self.widen = False
        while self.served < self.budget:
            cands = [c for c in self.plist if c.active and c.q.name not in self.qdone]
            p = min(cands, key=self.pair_key) if cands else None
            if p is None or self.pair_key(p)[0] > self.tq_bound:
                self.widen = self.tq_bound < INF
                break
            others = [c for c in cands if c.tenant != p.tenant]
            self.pick(p, min(others, key=self.pair_key) if others else None)

    def pick(self, p: _Pair, second: _Pair | None) -> None:
        """The best pair's best flow, served (or held back) under the gates."""
        q, m = p.q, self.m
        self.load_keys(p)
        kc = kc2 = None
        if p.simple:
            flow: str | None = KEYLESS if p.tenant.startswith("/") else p.tenant
        else:
            kc, kc2 = self.best_keys(p)
            flow = kc.flow if kc is not None else None
        if flow is None:
            p.active = False
            return
        named = flow_tenant(flow) is not None
        per_key = m.max_per_key or self.budget
        sid = (q.name, flow)
        want = min(self.budget - self.served, per_key - self.served_of.get(sid, 0))
        total = m._total_room(q)
        if total <= 0:
            self.qdone.add(q.name)
            return
        room, bound = m._room(q, flow, p.tenant, named)
        if room <= 0:
            self.hold_back_by_cap(p, kc, flow, named, bound)
            return
        buckets = m._flow_buckets(self.call, q, flow, p.tenant)
        rate, scope, next_at = m._rate_room(buckets, self.now)
        if rate <= 0:
            self.hold_back_by_rate(p, kc, scope, next_at)
            return
        take = int(min(want, room, total, rate))
        if take <= 0:  # this flow had its share of the call (max_per_key)
            if kc is not None:
                kc.active = False
            else:
                p.active = False
            return
        self.serve_flow(p, kc, flow, self.run_length(p, kc, kc2, second, take), buckets)

    def hold_back_by_cap(
        self, p: _Pair, kc: _Key | None, flow: str, named: bool, bound: str | None
    ) -> None:
        """A key or tenant cap holds the flow back: parked when it holds a slot (back when
        one frees), else (a cap of 0 or below: no slot of it can free) skipped in this
        call; a queue that lends lists it for borrowing."""
        q = p.q
        holds = (
            q.trunning.get(p.tenant, 0) > 0 if bound == "tenant" and named else q.running(flow) > 0
        )
        if not holds:
            if kc is not None and bound == "key":
                kc.active = False
            else:
                p.active = False
            return
        if bound == "key" and not p.simple:
            assert kc is not None
            self.park_key(p, kc, None)
        else:
            p.active = False
            self.park_pair(p, None)
        if q.borrow:
            self.lenders.append((p, flow, kc))

    def hold_back_by_rate(self, p: _Pair, kc: _Key | None, scope: str, next_at: int) -> None:
        """A rate holds the flow back: the queue serves no more, or the tenant or key is
        parked until its next token."""
        self.m.rate_held += 1
        if scope == "queue":
            self.qdone.add(p.q.name)
        elif scope == "tenant" or p.simple:
            p.active = False
            self.park_pair(p, next_at)
        else:
            assert kc is not None
            self.park_key(p, kc, next_at)

    def run_length(
        self, p: _Pair, kc: _Key | None, kc2: _Key | None, second: _Pair | None, take: int
    ) -> int:
        """How many runs p takes before its start tag passes the next tenant's (or a pair
        not read yet: from the read bound on) or, inside the tenant, the next key's."""
        assert p.ten is not None and p.ten.tag is not None and p.ten.weight is not None
        run = take
        step = self.m.quantum / p.ten.weight
        stop = self.tq_bound
        if second is not None:
            assert second.ten is not None and second.ten.tag is not None
            stop = min(stop, second.ten.tag)
        if stop < INF:
            run = min(run, max(1, math.ceil((stop - p.ten.tag) / step - 1e-9)))
        if kc is not None and kc2 is not None:
            kstep = self.m.quantum / kc.weight
            run = min(run, max(1, math.ceil((kc2.tag - kc.tag) / kstep - 1e-9)))
        return run

    def serve_flow(
        self, p: _Pair, kc: _Key | None, flow: str, run: int, buckets: list[tuple[_Bucket, str]]
    ) -> None:
        """Claim ``run`` runs, advance the tags, and settle what the flow's new head says:
        drained, only future runs (parked until due), or more to serve."""
        q = p.q
        got, head = self.claim(p, flow, run, buckets)
        if got > 0:
            self.served += got
            sid = (q.name, flow)
            self.served_of[sid] = self.served_of.get(sid, 0) + got
            self.advance(p, kc, got)
            if kc is not None:
                kc.tie = INF if head is None else float(head)
                ties = [k.tie for k in p.keys or [] if k.active]
                p.tie = min(ties, default=INF)
            else:
                p.tie = INF if head is None else float(head)
        if head is None:
            if kc is not None:
                kc.active = False
                kc.gone = True
                q.keys_of(p.tenant).pop(flow, None)
                if self.pair_emptied(p):
                    self.drop(p)
            else:
                self.drop(p)
        elif head > self.now:
            if kc is not None:
                self.park_key(p, kc, head)
            else:
                p.active = False
                self.park_pair(p, head)
        elif got == 0:
            if kc is not None:
                kc.active = False
            else:
                p.active = False

    # ------------------------------------------------------------------ borrow, write back

    def borrow_idle_slots(self) -> None:
        """Capped flows (of queues with ``borrow``) take the slots nobody else of the
        call could use, in the order they were held back; rates and total caps still
        hold."""
        m = self.m
        for p, flow, kc in self.lenders:
            if self.served >= self.budget:
                break
            q = p.q
            total = m._total_room(q)
            if total <= 0:
                continue
            buckets = m._flow_buckets(self.call, q, flow, p.tenant)
            rate, _, _ = m._rate_room(buckets, self.now)
            take = int(min(self.budget - self.served, total, rate))
            if take <= 0:
                continue
            got, _ = self.claim(p, flow, take, buckets)
            if got > 0:
                self.served += got
                m.borrowed += got
                self.advance(p, kc, got)

    def write_back(self) -> None:
        """Only when the floor was read (else nothing was a candidate): V:tt with the
        floor (pruned below it on a tick), the copies (only where still registered), key
        sets with their floors."""
        m = self.m
        f = self.call.floor
        if f is None:
            return
        touched = False
        for tenant, t in self.ten.items():
            if t.touched:
                assert t.tag is not None
                m.tt[tenant] = t.tag
                touched = True
        if touched or f.value > f.start or not f.stored:
            m.tfloor = f.value
        if not f.stored or math.floor(f.value / TICK) > math.floor(f.start / TICK):
            m.tt = {t: tag for t, tag in m.tt.items() if tag >= f.value}
        for p in self.plist:
            assert p.ten is not None and p.ten.tag is not None
            if p.ten.touched and not p.dropped and p.tenant in p.q.tq:
                p.q.tq[p.tenant] = p.ten.tag
        for (qname, tenant), p in self.keysets.items():
            q = m.queues[qname]
            kk = q.keys_of(tenant)
            for k in p.keys or []:
                if k.touched and not k.gone:
                    kk[k.flow] = k.tag
            assert p.kf is not None
            if p.kf[1]:
                q.kfloor[tenant] = float(p.kf[0])
                p.kf[1] = False
