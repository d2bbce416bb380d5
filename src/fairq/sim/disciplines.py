"""Disciplines the simulator can run, and the driver-side reference models.

Spec grammar: ``NAME[:OPT=VALUE[,OPT=VALUE...]]``, or ``codel:INNER`` with INNER any
other spec. ``age`` and ``sfq`` run fairq's real scripts (flag off / flag on); ``drr``,
``stride`` and ``tsfq`` are driver-side reference models that pick one key per dequeue
call (``max_count`` 1, as the design study's experiments did); ``tsfq`` is the two-level
fair order (tenants, then keys) with the design study's admission rules for new tenants
and fair state per pool (:mod:`fairq.sim.admission`); ``codel`` hoists the stalest key when the
standing delay stays above a target (the design study's CoDel wrapper) and otherwise defers to
its inner discipline.

Options:

=======================  =====================  =============================================
option                   disciplines            meaning
=======================  =====================  =============================================
join                     sfq                    ``floor`` | ``behind_leader`` (join policy)
arrival_cap              sfq                    with behind_leader: max start above the floor
quantum                  sfq, drr, tsfq         virtual time per serve / DRR quantum
charge                   sfq                    ``count`` | ``duration`` (overrides the
                                                scenario's ``charge``)
window                   age, sfq               scan window multiplier
max_per_key_per_call     age, sfq               serves per variant per call (default:
                                                the store's: age 1, sfq the whole call)
per_key_cap              all                    real per-key gate (0 = none)
total_cap                all                    real total gate per base queue (0 = none)
borrow                   all                    ``true`` | ``false``: capped keys may borrow
                                                idle slots (overrides the scenario's)
target, interval         codel                  standing-delay target and interval (steps)
admit                    sfq, tsfq              ``floor`` | ``clock`` | ``epoch`` | ``budget``:
                                                where a new tenant starts (sfq, the real
                                                scripts: ``floor`` or ``budget``, the
                                                default)
free                     tsfq                   with budget: new tenants per floor epoch that
                                                join at the floor (default 1)
newcomer_weight          tsfq                   the newcomers' share, in tenants (default 1)
state                    tsfq                   ``env`` | ``pool``: one fair state per
                                                environment, or one per consumer pool
=======================  =====================  =============================================
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fairq.errors import FairqError
from fairq.sim.admission import ADMIT_RULES, STATES, Admission, TwoLevelModel

REAL = ("age", "sfq")
MODELS = ("drr", "stride", "tsfq")
NAMES = (*REAL, *MODELS, "codel")

_OPTIONS: dict[str, dict[str, type]] = {
    "age": {
        "window": int,
        "max_per_key_per_call": int,
        "per_key_cap": int,
        "total_cap": int,
        "borrow": bool,
    },
    "sfq": {
        "admit": str,
        "join": str,
        "arrival_cap": float,
        "quantum": float,
        "charge": str,
        "window": int,
        "max_per_key_per_call": int,
        "per_key_cap": int,
        "total_cap": int,
        "borrow": bool,
    },
    "drr": {"quantum": float, "per_key_cap": int, "total_cap": int, "borrow": bool},
    "stride": {"per_key_cap": int, "total_cap": int, "borrow": bool},
    "tsfq": {
        "admit": str,
        "free": int,
        "newcomer_weight": float,
        "state": str,
        "quantum": float,
        "per_key_cap": int,
        "total_cap": int,
        "borrow": bool,
    },
}
_CODEL_OPTIONS: dict[str, type] = {"target": int, "interval": int}


class DisciplineError(FairqError, ValueError):
    """A discipline spec cannot be parsed."""


@dataclass(frozen=True, slots=True)
class Discipline:
    """A parsed discipline spec.

    Attributes:
        name: ``age``, ``sfq``, ``drr`` or ``stride`` (for codel: the inner's name).
        options: validated options (see the module docstring).
        codel: CoDel wrapper options when wrapped, else None.
    """

    name: str
    options: dict[str, object] = field(default_factory=dict)
    codel: dict[str, int] | None = None

    @property
    def spec(self) -> str:
        """The canonical spec string (options sorted)."""
        inner = self.name
        if self.options:
            inner += ":" + ",".join(f"{k}={_fmt(v)}" for k, v in sorted(self.options.items()))
        if self.codel is None:
            return inner
        wrapper = "codel"
        if self.codel:
            wrapper += "[" + ",".join(f"{k}={v}" for k, v in sorted(self.codel.items())) + "]"
        return f"{wrapper}:{inner}"

    @property
    def real(self) -> bool:
        return self.name in REAL

    def cap(self, name: str, default: int) -> int:
        value = self.options.get(name, default)
        assert isinstance(value, int)
        return value

    def borrow(self, default: bool) -> bool:
        """Whether capped keys and tenants may borrow idle slots: the ``borrow`` option,
        else ``default`` (the scenario's)."""
        value = self.options.get("borrow", default)
        assert isinstance(value, bool)
        return value

    def charge(self, default: str) -> str:
        """How a serve is charged in the fair order: the ``charge`` option, else
        ``default`` (the scenario's)."""
        value = self.options.get("charge", default)
        assert isinstance(value, str)
        return value


def _fmt(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _convert(name: str, option: str, raw: str, kind: type) -> object:
    value: object = raw
    try:
        if kind is bool:
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            value = raw.lower() in ("true", "1")
        elif kind is int:
            number = int(raw)
            if number < 0:
                raise ValueError
            value = number
        elif kind is float:
            real = float(raw)
            if not real > 0:
                raise ValueError
            value = real
    except ValueError:
        expected = {int: "a non-negative integer", bool: "true or false"}.get(
            kind, "a positive number"
        )
        raise DisciplineError(f"{name}: option {option}={raw!r} must be {expected}") from None
    if option == "join" and value not in ("floor", "behind_leader"):
        raise DisciplineError(f"{name}: join must be 'floor' or 'behind_leader', got {raw!r}")
    if option == "admit" and name == "sfq" and value not in ("floor", "budget"):
        raise DisciplineError(f"{name}: admit must be 'floor' or 'budget', got {raw!r}")
    if option == "admit" and value not in ADMIT_RULES:
        raise DisciplineError(f"{name}: admit must be one of {', '.join(ADMIT_RULES)}, got {raw!r}")
    if option == "state" and value not in STATES:
        raise DisciplineError(f"{name}: state must be 'env' or 'pool', got {raw!r}")
    if option == "charge" and value not in ("count", "duration"):
        raise DisciplineError(f"{name}: charge must be 'count' or 'duration', got {raw!r}")
    if option in ("window", "max_per_key_per_call", "target", "interval") and value == 0:
        raise DisciplineError(f"{name}: {option} must be at least 1")
    return value


def _options(name: str, text: str, allowed: dict[str, type]) -> dict[str, object]:
    out: dict[str, object] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        option, eq, raw = part.partition("=")
        option = option.strip()
        if not eq:
            raise DisciplineError(f"{name}: option {part!r} must be written as name=value")
        if option not in allowed:
            raise DisciplineError(
                f"{name}: unknown option {option!r} (allowed: {', '.join(sorted(allowed))})"
            )
        out[option] = _convert(name, option, raw.strip(), allowed[option])
    return out


def parse_discipline(spec: str) -> Discipline:
    """Parse ``age``, ``sfq:join=behind_leader``, ``codel:sfq``, ``codel[target=3]:age``...

    Raises:
        DisciplineError: unknown name or option, or a bad value.
    """
    text = spec.strip()
    codel: dict[str, int] | None = None
    if text.startswith("codel"):
        head, sep, rest = text.partition(":")
        if not sep or not rest:
            raise DisciplineError("codel needs an inner discipline, e.g. codel:sfq")
        codel = {}
        if head != "codel":
            if not (head.startswith("codel[") and head.endswith("]")):
                raise DisciplineError(
                    f"cannot parse {head!r}; write codel[target=5,interval=10]:INNER"
                )
            codel = {k: int(v) for k, v in _options("codel", head[6:-1], _CODEL_OPTIONS).items()}  # type: ignore[call-overload]
        text = rest
        if text.startswith("codel"):
            raise DisciplineError("codel cannot wrap codel")
    name, _, opts = text.partition(":")
    name = name.strip()
    if name not in _OPTIONS:
        raise DisciplineError(f"unknown discipline {name!r} (known: {', '.join(NAMES)})")
    return Discipline(name, _options(name, opts, _OPTIONS[name]), codel)


def split_discipline_list(values: list[str] | tuple[str, ...]) -> list[str]:
    """Split ``--discipline`` values on commas; a piece with ``=`` and no ``:`` continues
    the previous spec's options (``sfq:join=behind_leader,arrival_cap=2``)."""
    out: list[str] = []
    for value in values:
        for piece in (p.strip() for p in value.split(",")):
            if not piece:
                continue
            if out and "=" in piece and ":" not in piece.split("=", 1)[0]:
                head = piece.split("=", 1)[0]
                if head not in NAMES and not head.startswith("codel"):
                    out[-1] += "," + piece
                    continue
            out.append(piece)
    return out


# --------------------------------------------------------------------------- models


class Model:
    """A driver-side ordering model over keys (registration order breaks ties)."""

    def __init__(self, weights: dict[str, float], order: list[str]) -> None:
        self.weights = weights
        self.rank = {k: i for i, k in enumerate(order)}

    def pick(
        self, ready: list[str], backlogged: set[str], pool: str = "*"
    ) -> str | None:  # pragma: no cover - interface
        """The next key to serve among ``ready`` (servable now); ``backlogged`` is every
        key with queued work, servable or not; ``pool``: the consumer pool asking."""
        raise NotImplementedError

    def served(self, key: str, pool: str = "*") -> None:  # pragma: no cover - interface
        raise NotImplementedError


class StrideModel(Model):
    """Stride scheduling: lowest pass first; pass += 1 / weight per serve; a key that
    (re)activates starts at the global pass (monotonic), so idling earns no credit."""

    def __init__(self, weights: dict[str, float], order: list[str]) -> None:
        super().__init__(weights, order)
        self.passes: dict[str, float] = {}
        self.global_pass = 0.0

    def pick(self, ready: list[str], backlogged: set[str], pool: str = "*") -> str | None:
        if not ready:
            return None
        for k in ready:
            self.passes[k] = max(self.passes.get(k, self.global_pass), self.global_pass)
        low = min(self.passes[k] for k in ready)
        self.global_pass = max(self.global_pass, low)
        return min(ready, key=lambda k: (self.passes[k], self.rank[k]))

    def served(self, key: str, pool: str = "*") -> None:
        self.passes[key] = self.passes.get(key, self.global_pass) + 1.0 / self.weights[key]


class DrrModel(Model):
    """Deficit round robin with unit-cost messages: a ring in registration order; a key
    whose turn comes gains ``quantum x weight`` credit and is served while it has >= 1;
    an empty key's credit is reset."""

    def __init__(self, weights: dict[str, float], order: list[str], quantum: float = 1.0) -> None:
        super().__init__(weights, order)
        self.quantum = quantum
        self.ring = list(order)
        self.cursor = 0
        self.deficit: dict[str, float] = dict.fromkeys(order, 0.0)
        self.fresh_turn = True

    def pick(self, ready: list[str], backlogged: set[str], pool: str = "*") -> str | None:
        if not ready:
            return None
        ready_set = set(ready)
        for _ in range(len(self.ring) * 1000 + 1):
            key = self.ring[self.cursor]
            if key not in ready_set:
                if key not in backlogged:
                    self.deficit[key] = 0.0
                self._next()
                continue
            if self.fresh_turn:
                self.deficit[key] += self.quantum * self.weights[key]
                self.fresh_turn = False
            if self.deficit[key] >= 1.0 - 1e-9:
                return key
            self._next()
        return None  # pragma: no cover - only with absurd weights

    def _next(self) -> None:
        self.cursor = (self.cursor + 1) % len(self.ring)
        self.fresh_turn = True

    def served(self, key: str, pool: str = "*") -> None:
        self.deficit[key] -= 1.0


def make_model(
    d: Discipline,
    weights: dict[str, float],
    order: list[str],
    key_tenant: dict[str, str] | None = None,
    tenant_weight: dict[str, float] | None = None,
) -> Model | TwoLevelModel:
    """The driver-side model of ``d`` (``drr``, ``stride`` or ``tsfq``); ``tsfq`` needs
    each key's tenant and each tenant's weight."""
    if d.name == "tsfq":
        assert key_tenant is not None and tenant_weight is not None
        o = d.options
        admission = Admission(
            rule=str(o.get("admit", "floor")),
            free=int(o.get("free", 1)),  # type: ignore[call-overload]
            newcomer_weight=float(o.get("newcomer_weight", 1.0)),  # type: ignore[arg-type]
            quantum=float(o.get("quantum", 1.0)),  # type: ignore[arg-type]
        )
        state = str(o.get("state", "env"))
        return TwoLevelModel(weights, order, key_tenant, tenant_weight, admission, state)
    if d.name == "drr":
        q = d.options.get("quantum", 1.0)
        assert isinstance(q, float)
        return DrrModel(weights, order, q)
    return StrideModel(weights, order)


@dataclass
class CoDelState:
    """The design study's CoDel wrapper state: once the smallest sojourn served in a step has
    stayed above ``target`` for ``interval`` steps, the next steps start by serving the
    stalest key (hoist) until a step's smallest sojourn drops to the target again."""

    target: int = 5
    interval: int = 10
    first_above: int | None = None
    dropping: bool = False

    def observe(self, step: int, sojourns: list[int]) -> None:
        if not sojourns:
            return
        if min(sojourns) <= self.target:
            self.first_above = None
            self.dropping = False
        elif self.first_above is None:
            self.first_above = step + self.interval
        elif step >= self.first_above:
            self.dropping = True
