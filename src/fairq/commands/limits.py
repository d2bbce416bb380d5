"""``fairq limits``: get or set environment and queue limits; pause and resume queues.

Every ``set`` is validated whole before anything is written, then applied in one atomic
step (:meth:`fairq.store.RunQueue.configure`): a command with one bad value changes
nothing, and a setting it does not name (or clears with ``none``) leaves every other
setting as it is. Pausing is a flag: ``pause`` then ``resume`` keeps the queue's limits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import click
from rich.markup import escape
from rich.table import Table

from fairq.commands._common import (
    console,
    open_queue,
    print_json,
    run_async,
    url_option,
    warn_if_unknown,
)
from fairq.errors import InvalidLimitError, InvalidNameError
from fairq.keys import Environment
from fairq.models import QueueStats
from fairq.store.admin import Change, env_option, queue_option
from fairq.store.options import parse_rate

#: Words that remove a setting (back to the default).
CLEAR_WORDS: Final = ("none", "unset", "default")
#: How errors name each stored setting (env, queue).
_NAMES: Final = {
    (True, "concurrency"): "env concurrency limit",
    (True, "burst_factor"): "burst factor",
    (True, "max_queue_size"): "env queue size limit",
    (True, "order"): "env order",
    (False, "concurrency"): "queue concurrency limit",
    (False, "max_size"): "queue size limit",
    (False, "total"): "total concurrency limit",
    (False, "rate"): "rate",
    (False, "rate_burst"): "rate burst",
    (False, "order"): "queue order",
    (False, "borrow"): "borrow",
}


def _env(value: str) -> Environment:
    try:
        return Environment.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="ENV") from None


def _cleared(value: str) -> bool:
    return value.strip().lower() in CLEAR_WORDS


def _number(value: str, flag: str, kind: type[int] | type[float]) -> int | float:
    try:
        return kind(value)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise click.UsageError(f"{flag}: {value!r} is not {what} or 'none'") from None


def _change(queue: str | None, name: str, value: object) -> Change:
    """One validated change (None removes the setting); a bad value is a clear error."""
    try:
        if queue is None:
            return env_option(name, value)
        return queue_option(queue, name, value)
    except InvalidLimitError as exc:
        label = _NAMES.get((queue is None, name), name)
        raise click.ClickException(str(InvalidLimitError(label, exc.value, exc.reason))) from None
    except OverflowError:  # an integer beyond any float
        label = _NAMES.get((queue is None, name), name)
        raise click.ClickException(
            str(InvalidLimitError(label, value, "is out of range"))
        ) from None
    except InvalidNameError as exc:
        raise click.ClickException(str(exc)) from None


@click.group(name="limits")
def command() -> None:
    """Get or set limits: `fairq limits get ENV [QUEUE]`, `fairq limits set ENV [QUEUE]
    ...`, `fairq limits pause ENV QUEUE`, `fairq limits resume ENV QUEUE`, `fairq limits
    key-cap ENV QUEUE KEY N|none`, `fairq limits tenant-cap ENV QUEUE TENANT N|none`,
    `fairq limits weight ENV QUEUE KEY W` / `fairq limits weight ENV --tenant T W`.

    ENV is org:project:env. Env limits: concurrency (runs in flight across its queues),
    burst factor (one queue may use concurrency x burst), default queue size limit, and
    the default order of its queues. Queue limits: concurrency (per concurrency key when
    runs have keys), size limit, total concurrency (across all its keys), start rate,
    order, borrowing; the fair order's max per key, join, quantum, window, charge and
    arrival cap (on an env: the default of its queues).
    """


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


def queue_limits_json(q: QueueStats) -> dict[str, Any]:
    return {
        "queue": q.queue, "concurrency_limit": q.concurrency_limit,
        "queue_size_limit": q.queue_size_limit,
        "total_concurrency_limit": q.total_concurrency_limit,
        "rate": q.rate, "rate_burst": q.rate_burst, "borrow": q.borrow, "order": q.order,
        "max_per_key": q.max_per_key_per_call, "charge": q.charge, "paused": q.paused,
        "quantum": q.quantum, "window": q.window, "join": q.join, "arrival_cap": q.arrival_cap,
        "running": q.running,
        "keys": [
            {"key": v.concurrency_key, "tenant": v.tenant, "cap": v.cap, "weight": v.weight}
            for v in q.variants if v.cap is not None or v.weight != 1.0
        ],
    }  # fmt: skip


@command.command(name="get")
@click.argument("env_name", metavar="ENV")
@click.argument("queue", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@url_option
@run_async
async def get_limits(env_name: str, queue: str | None, as_json: bool, url: str | None) -> None:
    """Show an environment's limits and its queues' (or one queue's) limits and scheduling
    options; with QUEUE also its keys' caps and weights."""
    env = _env(env_name)
    rq = await open_queue(url)
    try:
        await warn_if_unknown(rq, env, queue)
        e = await rq.env_stats(env)
        names = [queue] if queue else await rq.queues(env)
        stats = await rq.queues_stats(env, names, breakdown=queue is not None) if names else []
        tenants = await rq.tenant_tags(env) if queue is not None else []
    finally:
        await rq.close()
    if as_json:
        print_json({
            "env": env.id, "concurrency_limit": e.concurrency_limit,
            "burst_factor": e.burst_factor, "queue_size_limit": e.queue_size_limit,
            "order": e.order, "weight": e.weight, "running": e.running,
            "quantum": e.quantum, "window": e.window, "join": e.join,
            "arrival_cap": e.arrival_cap, "max_per_key": e.max_per_key_per_call,
            "charge": e.charge,
            "queues": [queue_limits_json(q) for q in stats],
            "tenant_weights": {t.tenant or "": t.weight for t in tenants if t.weight != 1.0},
        })  # fmt: skip
        return
    table = Table(title=f"limits of {env}", title_justify="left")
    table.add_column("Scope", overflow="fold")
    for name in ("Concurrency", "Burst", "Size limit", "Total", "Rate/s", "Running"):
        table.add_column(name, justify="right")
    for name in ("Order", "Max/key", "Charge", "Fair (quantum/window/join)", "Paused"):
        table.add_column(name, overflow="fold")
    table.add_row(
        "env", str(e.concurrency_limit), f"{e.burst_factor:g}", _limit(e.queue_size_limit),
        "", "", str(e.running), e.order, _limit(e.max_per_key_per_call), e.charge,
        f"{e.quantum:g}/{e.window}/{e.join}", "",
    )  # fmt: skip
    for q in stats:
        rate = (
            "-"
            if q.rate is None
            else f"{q.rate:g}"
            + (f" (burst {q.rate_burst})" if q.rate_burst and q.rate_burst > 1 else "")
        )
        table.add_row(
            f"queue {escape(q.queue)}",
            _limit(q.concurrency_limit),
            "borrow" if q.borrow else "",
            _limit(q.queue_size_limit),
            _limit(q.total_concurrency_limit),
            rate,
            str(q.running),
            q.order,
            _limit(q.max_per_key_per_call),
            q.charge,
            f"{q.quantum:g}/{q.window}/{q.join}",
            "paused" if q.paused else "",
        )
    out = console()
    out.print(table)
    keyed = [v for q in stats for v in q.variants if v.cap is not None or v.weight != 1.0]
    if keyed:
        keys = Table(title="keys with their own cap or weight", title_justify="left")
        for name in ("Key", "Tenant", "Cap", "Weight"):
            keys.add_column(name, overflow="fold")
        for v in keyed:
            keys.add_row(escape(v.concurrency_key or ""), escape(v.tenant or ""), _limit(v.cap),
                         f"{v.weight:g}")  # fmt: skip
        out.print(keys)
    weighted = [t for t in tenants if t.weight != 1.0]
    if weighted:
        tw = Table(title="tenant weights", title_justify="left")
        tw.add_column("Tenant", overflow="fold")
        tw.add_column("Weight", justify="right")
        for t in weighted:
            tw.add_row(escape(t.tenant or "(default)"), f"{t.weight:g}")
        out.print(tw)


@command.command(name="set")
@click.argument("env_name", metavar="ENV")
@click.argument("queue", required=False)
@click.option("--concurrency", default=None, help="Concurrency limit ('none' removes it).")
@click.option("--burst", default=None, help="Env burst factor, 1..100 ('none' removes it).")
@click.option("--size-limit", default=None, help="Queue size limit ('none' removes it).")
@click.option("--order", default=None, help="Dequeue order: age, fair ('none' removes it).")
@click.option("--total", default=None, help="Queue: runs in flight across all its keys.")
@click.option("--rate", default=None, help="Queue: start rate, e.g. 100/s, 30/m, 5/h.")
@click.option("--rate-burst", type=int, default=None, help="Queue: starts allowed at once.")
@click.option("--borrow/--no-borrow", default=None, help="Queue: capped keys borrow idle slots.")
@click.option("--max-per-key", default=None, help="Runs one dequeue call takes from one key.")
@click.option(
    "--join", default=None, help="Fair order: where a new key starts (floor, behind_leader)."
)
@click.option("--quantum", default=None, help="Fair order: virtual time charged per run.")
@click.option("--window", default=None, help="Fair order: candidates considered per run asked for.")
@click.option(
    "--charge", default=None, help="Fair order: charge per run (count) or run time (duration)."
)
@click.option(
    "--arrival-cap", default=None, help="Fair order: how far above the floor a key may start."
)
@url_option
@run_async
async def set_limits(
    env_name: str,
    queue: str | None,
    concurrency: str | None,
    burst: str | None,
    size_limit: str | None,
    order: str | None,
    total: str | None,
    rate: str | None,
    rate_burst: int | None,
    borrow: bool | None,
    max_per_key: str | None,
    join: str | None,
    quantum: str | None,
    window: str | None,
    charge: str | None,
    arrival_cap: str | None,
    url: str | None,
) -> None:
    """Set env limits (no QUEUE) or a queue's limits, all at once or none.

    \b
    fairq limits set acme:shop:prod --concurrency 50 --burst 2 --size-limit 10000
    fairq limits set acme:shop:prod emails --concurrency 5 --size-limit 500 --order fair
    fairq limits set acme:shop:prod emails --rate 20/s --rate-burst 5 --total 40
    fairq limits set acme:shop:prod emails --size-limit none   # only the size limit goes
    fairq limits set acme:shop:prod emails --order fair --quantum 2 --window 4 --join floor
    """
    env = _env(env_name)
    request = _SetRequest(
        queue=queue, concurrency=concurrency, burst=burst, size_limit=size_limit,
        order=order, total=total, rate=rate, rate_burst=rate_burst, borrow=borrow,
        max_per_key=max_per_key, join=join, quantum=quantum, window=window, charge=charge,
        arrival_cap=arrival_cap,
    )  # fmt: skip
    _check_set_flags(request)
    # every value is validated before anything is written, then all apply in one step
    plan = _validated_changes(request)
    await _configure(url, env, plan.changes)
    click.echo(f"{env}{' ' + queue if queue else ''}: " + ", ".join(plan.said))


@dataclass(frozen=True, slots=True)
class _SetRequest:
    """The options of one ``limits set``, as given (None: not given)."""

    queue: str | None
    concurrency: str | None
    burst: str | None
    size_limit: str | None
    order: str | None
    total: str | None
    rate: str | None
    rate_burst: int | None
    borrow: bool | None
    max_per_key: str | None
    join: str | None
    quantum: str | None
    window: str | None
    charge: str | None
    arrival_cap: str | None

    def text_flags(self) -> dict[str, str | None]:
        """The options given as text, by flag."""
        return {
            "--concurrency": self.concurrency, "--burst": self.burst,
            "--size-limit": self.size_limit, "--order": self.order, "--total": self.total,
            "--rate": self.rate, "--max-per-key": self.max_per_key, "--join": self.join,
            "--quantum": self.quantum, "--window": self.window, "--charge": self.charge,
            "--arrival-cap": self.arrival_cap,
        }  # fmt: skip


def _check_set_flags(request: _SetRequest) -> None:
    """Refuse a ``limits set`` that names nothing, or a flag of the other scope."""
    given = request.text_flags()
    if (
        all(v is None for v in given.values())
        and request.rate_burst is None
        and request.borrow is None
    ):
        raise click.UsageError("nothing to set: give at least one limit (see --help)")
    if request.queue is None:
        misplaced = [f for f in ("--total", "--rate") if given[f] is not None]
        misplaced += ["--rate-burst"] if request.rate_burst is not None else []
        misplaced += ["--borrow"] if request.borrow is not None else []
        if misplaced:
            raise click.UsageError(f"{', '.join(misplaced)} apply to a queue: name QUEUE")
    elif request.burst is not None:
        raise click.UsageError("--burst applies to an environment, not a queue")


@dataclass(slots=True)
class _Plan:
    """The validated changes of one ``limits set``, and how the reply says each."""

    queue: str | None
    changes: list[Change] = field(default_factory=list)
    said: list[str] = field(default_factory=list)

    def add(self, name: str, value: object, text: str) -> None:
        """Validate one change and note how the reply says it."""
        self.changes.append(_change(self.queue, name, value))
        self.said.append(text)

    def integer(self, flag: str, name: str, raw: str | None, label: str) -> None:
        """An integer setting (or a clear word), when given."""
        if raw is None:
            return
        if _cleared(raw):
            self.add(name, None, f"{label} removed")
        else:
            value = _number(raw, flag, int)
            self.add(name, value, f"{label} {value}")

    def real(self, flag: str, name: str, raw: str | None, label: str) -> None:
        """A number setting (or a clear word), when given."""
        if raw is None:
            return
        if _cleared(raw):
            self.add(name, None, f"{label} removed")
        else:
            value = _number(raw, flag, float)
            self.add(name, value, f"{label} {value:g}")

    def word(self, name: str, raw: str | None) -> None:
        """A word setting (lower-cased), or a clear word, when given."""
        if raw is None:
            return
        if _cleared(raw):
            self.add(name, None, f"{name} removed")
        else:
            self.add(name, raw.strip().lower(), f"{name} {raw.strip().lower()}")

    def rate(self, raw: str | None, rate_burst: int | None) -> None:
        """The start rate (clearing it also clears the rate burst unless that is given)."""
        if raw is None:
            return
        if _cleared(raw):
            self.add("rate", None, "rate removed")
            if rate_burst is None:
                self.changes.append(_change(self.queue, "rate_burst", None))
            return
        try:
            per_second = parse_rate(raw)
        except InvalidLimitError as exc:
            raise click.ClickException(str(exc)) from None
        self.add("rate", per_second, f"rate {per_second:g}/s")


def _validated_changes(request: _SetRequest) -> _Plan:
    """Every change of a ``limits set``, validated in the order the reply lists them."""
    r, plan = request, _Plan(request.queue)
    plan.integer("--concurrency", "concurrency", r.concurrency, "concurrency")
    plan.real("--burst", "burst_factor", r.burst, "burst")
    plan.integer("--size-limit", "max_queue_size" if r.queue is None else "max_size",
                 r.size_limit, "size limit")  # fmt: skip
    for name, raw in (("order", r.order), ("join", r.join), ("charge", r.charge)):
        plan.word(name, raw)
    plan.integer("--max-per-key", "max_per_key", r.max_per_key, "max per key")
    plan.integer("--window", "window", r.window, "window")
    plan.real("--quantum", "quantum", r.quantum, "quantum")
    plan.real("--arrival-cap", "arrival_cap", r.arrival_cap, "arrival cap")
    plan.integer("--total", "total", r.total, "total")
    plan.rate(r.rate, r.rate_burst)
    if r.rate_burst is not None:
        plan.add("rate_burst", r.rate_burst, f"rate burst {r.rate_burst}")
    if r.borrow is not None:
        plan.add("borrow", True if r.borrow else None,
                 "borrowing on" if r.borrow else "borrowing off")  # fmt: skip
    return plan


async def _configure(url: str | None, env: Environment, changes: list[Change]) -> None:
    """Apply validated changes in one atomic step."""
    rq = await open_queue(url)
    try:
        await rq.configure(env, changes)
    finally:
        await rq.close()


@command.command(name="pause")
@click.argument("env_name", metavar="ENV")
@click.argument("queue")
@url_option
@run_async
async def pause(env_name: str, queue: str, url: str | None) -> None:
    """Pause a queue: its runs stay queued, none starts (running ones finish); its
    limits are kept."""
    env = _env(env_name)
    change = _change(queue, "paused", True)
    rq = await open_queue(url)
    try:
        await rq.configure(env, [change])
    finally:
        await rq.close()
    click.echo(f"{env} {queue}: paused")


@command.command(name="resume")
@click.argument("env_name", metavar="ENV")
@click.argument("queue")
@click.option("--concurrency", type=int, default=None, help="Also set this limit.")
@url_option
@run_async
async def resume(env_name: str, queue: str, concurrency: int | None, url: str | None) -> None:
    """Resume a paused queue (it keeps its concurrency limit unless --concurrency)."""
    env = _env(env_name)
    changes = [_change(queue, "paused", None)]
    if concurrency is not None:
        changes.append(_change(queue, "concurrency", concurrency))
    rq = await open_queue(url)
    try:
        await rq.configure(env, changes)
    finally:
        await rq.close()
    click.echo(
        f"{env} {queue}: resumed"
        + (f", concurrency {concurrency}" if concurrency is not None else "")
    )


def _weight_value(raw: str | None) -> float | None:
    try:
        return None if raw is None or _cleared(raw) else float(raw)
    except ValueError:
        raise click.BadParameter(
            f"{raw!r} is not a number or 'none'", param_hint="WEIGHT"
        ) from None


def _cap_value(raw: str) -> int | None:
    if _cleared(raw):
        return None
    try:
        return int(raw)
    except ValueError:
        raise click.BadParameter(f"{raw!r} is not an integer or 'none'", param_hint="N") from None


@command.command(name="weight")
@click.argument("env_name", metavar="ENV")
@click.argument("args", nargs=-1, metavar="[QUEUE KEY] [WEIGHT]")
@click.option("--tenant", default=None, help="Weight this tenant (environment-wide) instead.")
@url_option
@run_async
async def weight(env_name: str, args: tuple[str, ...], tenant: str | None, url: str | None) -> None:
    """Weight a concurrency key of a queue, or a tenant across the environment, in the
    fair order (2 = twice the share; omit WEIGHT or give 'none' to reset to 1).

    \b
    fairq limits weight acme:shop:prod emails tenant-42 2
    fairq limits weight acme:shop:prod --tenant acme 3
    """
    env = _env(env_name)
    if tenant is not None:
        if len(args) > 1:
            raise click.UsageError("with --tenant give only ENV [WEIGHT]")
        value = _weight_value(args[0] if args else None)
    else:
        if len(args) not in (2, 3):
            raise click.UsageError("give ENV QUEUE KEY [WEIGHT], or ENV --tenant T [WEIGHT]")
        value = _weight_value(args[2] if len(args) == 3 else None)
    rq = await open_queue(url)
    try:
        if tenant is not None:
            await rq.set_tenant_weight(env, tenant, value)
        else:
            await rq.set_concurrency_key_weight(env, args[0], args[1], value)
    finally:
        await rq.close()
    shown = value if value is not None else 1
    if tenant is not None:
        click.echo(f"{env} tenant {tenant!r}: weight {shown:g}")
    else:
        click.echo(f"{env} {args[0]} key {args[1]!r}: weight {shown:g}")


@command.command(name="key-cap")
@click.argument("env_name", metavar="ENV")
@click.argument("queue")
@click.argument("key")
@click.argument("cap", metavar="N|none")
@url_option
@run_async
async def key_cap(env_name: str, queue: str, key: str, cap: str, url: str | None) -> None:
    """Cap one concurrency key's runs in flight (an override of the queue's per-key
    limit); 'none' restores the queue's limit."""
    env = _env(env_name)
    value = _cap_value(cap)
    rq = await open_queue(url)
    try:
        await rq.set_key_concurrency(env, queue, key, value)
    finally:
        await rq.close()
    said = "the queue's limit" if value is None else str(value)
    click.echo(f"{env} {queue} key {key!r}: cap {said}")


@command.command(name="tenant-cap")
@click.argument("env_name", metavar="ENV")
@click.argument("queue")
@click.argument("tenant")
@click.argument("cap", metavar="N|none")
@url_option
@run_async
async def tenant_cap(env_name: str, queue: str, tenant: str, cap: str, url: str | None) -> None:
    """Cap one tenant's runs in flight in a queue, across its keys; 'none' removes it."""
    env = _env(env_name)
    value = _cap_value(cap)
    rq = await open_queue(url)
    try:
        await rq.set_tenant_concurrency(env, queue, tenant, value)
    finally:
        await rq.close()
    said = "none" if value is None else str(value)
    click.echo(f"{env} {queue} tenant {tenant!r}: cap {said}")
