"""The design study's admission rules and pool state, side by side on every scenario.

Runs each built-in scenario (or ``--scenario`` ones) under the age order, the real fair
order (``sfq``) and the driver-side two-level model (``tsfq``) with each admission rule
for new tenants (floor, clock, epoch, budget) and, on scenarios with consumer pools,
fair state per pool; prints every record (without its per-tenant figures) as JSON on
stdout, and with ``--markdown FILE`` a table per scenario: the headline group's mean
wait and first serve, the worst key's mean wait, the makespan, and each rule's headline
wait over the floor join's (the ratio the design study compares). Example::

    python bench/admission.py --seeds 3 --markdown admission.md > records.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from fairq.sim.runner import plan, run_all
from fairq.sim.scenario import Scenario, builtin_scenarios

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fairness import LIGHT_GROUP

RULES = [
    "age",
    "sfq",
    "tsfq",
    "tsfq:admit=clock",
    "tsfq:admit=epoch",
    "tsfq:admit=budget",
]
POOL_RULES = ["tsfq:state=pool", "tsfq:admit=budget,state=pool"]

Records = list[dict[str, Any]]


#: The driver-side model looks at every key on every pick: scenarios with more keys than
#: this run only the real scripts (age, sfq).
MODEL_KEYS = 2000


def disciplines_for(s: Scenario) -> list[str]:
    if sum(g.keys for g in s.groups) > MODEL_KEYS:
        return RULES[:2]
    return RULES + (POOL_RULES if s.pools else [])


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def table(name: str, records: Records) -> str:
    """One scenario's rows (means over the seeds)."""
    group = LIGHT_GROUP.get(name)
    by: dict[str, Records] = {}
    for r in records:
        by.setdefault(r["discipline"], []).append(r)

    def wait(rs: Records) -> float | None:
        if group is None:
            return None
        return _mean([r["groups"][group]["mean_wait"] for r in rs])

    base = wait(by["tsfq"]) if "tsfq" in by else None
    lines = [
        f"#### {name} (headline group: {group or 'none'})",
        "",
        "| discipline | headline wait | first serve | ÷ tsfq (floor) | worst key wait | makespan |",
        "|---|---|---|---|---|---|",
    ]
    for d, rs in by.items():
        w = wait(rs)
        first = "" if group is None else str(rs[0]["groups"][group]["first_serve_step"])
        ratio = f"{w / base:.2f}" if w is not None and base else ""
        lines.append(
            f"| `{d}` | {'' if w is None else f'{w:.1f}'} | {first} | {ratio} | "
            f"{_mean([r['worst_key_mean_wait'] for r in rs]):.1f} | "
            f"{_mean([r['makespan'] for r in rs]):.0f} |"
        )
    return "\n".join(lines) + "\n"


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--scenario", action="append", help="only these (default: all)")
    parser.add_argument("--markdown", type=Path, help="write the tables here")
    args = parser.parse_args()
    scenarios = [s for s in builtin_scenarios() if not args.scenario or s.name in args.scenario]
    runs = []
    for s in scenarios:
        runs += plan([s], disciplines_for(s), args.seeds)
    started = time.monotonic()

    def done(spec: Any, record: dict[str, Any]) -> None:
        print(f"{time.monotonic() - started:7.1f}s {record['scenario']} "
              f"{record['discipline']} seed {record['seed']}", file=sys.stderr)  # fmt: skip

    records, _ = await run_all(os.environ.get("FAIRQ_REDIS_URL"), runs, on_done=done)
    print(f"{len(records)} runs in {time.monotonic() - started:.1f}s", file=sys.stderr)
    # per-tenant figures left out: a flood of fresh keys is hundreds of tenants
    json.dump(
        [{k: v for k, v in r.items() if k != "tenants"} for r in records], sys.stdout, indent=1
    )
    sys.stdout.write("\n")
    if args.markdown:
        parts = [table(s.name, [r for r in records if r["scenario"] == s.name]) for s in scenarios]
        args.markdown.write_text("\n".join(parts))


if __name__ == "__main__":
    asyncio.run(main())
