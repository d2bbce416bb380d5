"""Fairness benchmark: every built-in scenario under its own table of disciplines.

    python bench/fairness.py [--seeds 3] [--scenario NAME ...] [--markdown FILE]

Prints the simulator's JSON records (a list) on stdout. ``--markdown`` also writes the
per-scenario tables of docs/fairness.md, ours next to the seed's published figures.
Without FAIRQ_REDIS_URL it runs on a private embedded Valkey.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from fairq.sim.runner import plan, run_all
from fairq.sim.scenario import builtin_scenarios

#: Seed treatment name for each of our discipline labels.
SEED_NAMES = {
    "age": "baseline",
    "sfq": "sfq",
    "drr": "drr",
    "stride": "stride",
    "codel:sfq": "codel(sfq)",
    "codel:age": "codel(baseline)",
    "age:per_key_cap=2": "perKeyCap",
    "age:total_cap=2": "totalCap",
    "age:per_key_cap=2,total_cap=2": "total+perKey",
    "sfq:per_key_cap=2": "perKeyCap+sfq",
    "sfq:per_key_cap=2,total_cap=2": "total+perKey+sfq",
}

#: The group whose wait is the headline (the key the seed calls light / starved).
LIGHT_GROUP = {
    "adversarialSkew": "light",
    "trickleStale": "trickle",
    "weighted": "w4",
    "burst": "steady",
    "longHold": "long",
    "ckSkew": "light",
    "ckTrickle": "trickle",
    "ckSybil": "light",
    "ckHeavyIdle": "heavy",
    "ckManyKeys": "light",
    "ckStalledNewcomer": "newcomer",
    "ckLateLight": "light",
    "ckFreshKeyFlood": "steady",
    "tenantManyKeys": "narrow",
    "tenantKeyFlood": "newcomer",
    "tenantQueues": "single",
    "tenantTenThousandKeys": "light",
    "tenantWeighted": "highEarly",
    "capHiddenKeys": "zquick",
    "borrowLoneKey": "lone",
    "chargeLongShort": "short",
    "rateLimited": "free",
}

# The seed's published figures (findings reports; logical ms, 3 seeds, max_count 1).
# contWorstS/W (mean over 3 seeds) per treatment.
SEED_SHARE: dict[str, dict[str, float]] = {
    "balanced": {"baseline": 0.889, "sfq": 0.985, "drr": 0.954, "stride": 0.985,
                 "codel(sfq)": 0.985, "codel(baseline)": 0.889},
    "adversarialSkew": {"baseline": 0.288, "sfq": 1.000, "drr": 0.978, "stride": 1.000,
                        "codel(sfq)": 1.000, "codel(baseline)": 0.288},
    "weighted": {"baseline": 0.703, "sfq": 1.000, "drr": 0.990, "stride": 1.000,
                 "codel(sfq)": 1.000, "codel(baseline)": 0.703},
    "burst": {"baseline": 0.978, "sfq": 0.992, "drr": 0.958, "stride": 0.992,
              "codel(sfq)": 0.992, "codel(baseline)": 0.978},
    "longHold": {"baseline": 0.828, "sfq": 0.981, "drr": 0.981, "stride": 0.981,
                 "codel(sfq)": 0.981, "codel(baseline)": 0.828},
    "trickleStale": {"baseline": 0.208, "sfq": 0.804, "drr": 0.776, "stride": 0.804,
                     "codel(sfq)": 0.366, "codel(baseline)": 0.195},
    "ckSkew": {"baseline": 0.187, "sfq": 0.723, "drr": 0.608, "stride": 0.723,
               "codel(sfq)": 0.723, "codel(baseline)": 0.104, "perKeyCap": 0.814,
               "totalCap": 0.213, "total+perKey": 0.213, "perKeyCap+sfq": 0.800,
               "total+perKey+sfq": 0.803},
    "ckTrickle": {"baseline": 0.279, "sfq": 0.909, "drr": 0.790, "stride": 0.909,
                  "codel(sfq)": 0.909, "codel(baseline)": 0.018, "perKeyCap": 0.922,
                  "totalCap": 0.279, "total+perKey": 0.279, "perKeyCap+sfq": 0.658,
                  "total+perKey+sfq": 0.883},
    "ckBalanced": {"baseline": 0.515, "sfq": 0.611, "drr": 0.730, "stride": 0.611,
                   "codel(sfq)": 0.611, "codel(baseline)": 0.464},
    "ckSybil": {"baseline": 0.000, "perKeyCap": 0.403, "totalCap": 0.000, "total+perKey": 0.000,
                "sfq": 1.000, "drr": 0.994, "perKeyCap+sfq": 1.000, "total+perKey+sfq": 1.000},
    "ckHeavyIdle": {k: 1.0 for k in ("baseline", "perKeyCap", "totalCap", "total+perKey",
                                     "sfq", "drr", "perKeyCap+sfq", "total+perKey+sfq")},
}  # fmt: skip
# (light-key mean wait, worst group mean wait, makespan) from the caps findings, and the
# light / starved key's wait from the two other reports where that one has none.
SEED_WAIT: dict[str, dict[str, tuple[float | None, float | None, float | None]]] = {
    "ckSkew": {"baseline": (1098, 1261, 2083), "perKeyCap": (20, 1555, 3038),
               "totalCap": (2840, 2974, 3947), "total+perKey": (2840, 2974, 3947),
               "sfq": (14, 1069, 2083), "drr": (17, 1067, 2083),
               "perKeyCap+sfq": (7, 1628, 3114), "total+perKey+sfq": (52, 2363, 3939)},
    "ckTrickle": {"baseline": (1107, 1134, 1940), "perKeyCap": (19, 1555, 3038),
                  "totalCap": (2852, 2861, 3905), "total+perKey": (2852, 2861, 3905),
                  "sfq": (17, 1070, 1942), "drr": (23, 1069, 1941),
                  "perKeyCap+sfq": (8, 1606, 3097), "total+perKey+sfq": (106, 2337, 3911)},
    "ckSybil": {"baseline": (1765, 1876, 2070), "perKeyCap": (1776, 1869, 2128),
                "totalCap": (3793, 3801, 4147), "total+perKey": (3793, 3801, 4147),
                "sfq": (1009, 1019, 2065), "drr": (1061, 1068, 2055),
                "perKeyCap+sfq": (1010, 1019, 2072), "total+perKey+sfq": (2292, 2292, 4146)},
    "ckHeavyIdle": {"baseline": (633, 633, 1240), "perKeyCap": (1291, 1291, 2507),
                    "totalCap": (1291, 1291, 2507), "total+perKey": (1291, 1291, 2507),
                    "sfq": (633, 633, 1240), "drr": (633, 633, 1240),
                    "perKeyCap+sfq": (1291, 1291, 2507), "total+perKey+sfq": (1291, 1291, 2507)},
    "adversarialSkew": {"baseline": (1380, 1380, None), "sfq": (319, 1324, None)},
    "trickleStale": {"baseline": (1359, 1359, None), "sfq": (19, 1353, None),
                     "codel(sfq)": (213, 1315, None)},
}  # fmt: skip


def _mean_range(values: list[float], digits: int) -> str:
    mean = sum(values) / len(values)
    lo, hi = min(values), max(values)
    if round(lo, digits) == round(hi, digits):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ({lo:.{digits}f}..{hi:.{digits}f})"


def _seed_cell(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def markdown(records: list[dict[str, Any]]) -> str:
    """The per-scenario tables: ours (mean and min..max over seeds) beside the seed's."""
    by: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        by[r["scenario"]][r["discipline"]].append(r)
    out: list[str] = []
    for scenario, per in by.items():
        light = LIGHT_GROUP.get(scenario)
        out.append(f"### {scenario}\n")
        head = "| discipline | seed name |"
        head += f" {light} wait | {light} first serve |" if light else ""
        head += " worst group wait | makespan | worst S/W | cmds/serve |"
        head += " seed light wait | seed worst wait | seed makespan | seed worst S/W |"
        out.append(head)
        out.append("|" + "---|" * (head.count("|") - 1))
        for label, rs in per.items():
            seed_name = SEED_NAMES.get(label, "")
            row = f"| `{label}` | {seed_name} |"
            if light:
                row += f" {_mean_range([r['groups'][light]['mean_wait'] for r in rs], 1)} |"
                firsts = [float(r["groups"][light]["first_serve_step"] or -1) for r in rs]
                row += f" {_mean_range(firsts, 0)} |"
            worst = [max(g["mean_wait"] for g in r["groups"].values()) for r in rs]
            row += f" {_mean_range(worst, 1)} |"
            row += f" {_mean_range([float(r['makespan']) for r in rs], 0)} |"
            row += f" {_mean_range([r['contention_worst_share'] for r in rs], 3)} |"
            row += f" {_mean_range([r['commands_per_serve'] for r in rs], 1)} |"
            sw = SEED_WAIT.get(scenario, {}).get(seed_name, (None, None, None))
            share = SEED_SHARE.get(scenario, {}).get(seed_name)
            row += f" {_seed_cell(sw[0], 0)} | {_seed_cell(sw[1], 0)} | {_seed_cell(sw[2], 0)} |"
            row += f" {_seed_cell(share, 3)} |"
            out.append(row)
        out.append("")
    return "\n".join(out)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--scenario", action="append", help="only these (default: all)")
    parser.add_argument("--markdown", type=Path, help="write the docs tables here")
    parser.add_argument("--from-json", type=Path, help="only rebuild --markdown from records")
    args = parser.parse_args()
    if args.from_json:
        records = json.loads(args.from_json.read_text())
        args.markdown.write_text(markdown(records))
        return
    scenarios = [s for s in builtin_scenarios() if not args.scenario or s.name in args.scenario]
    runs = plan(scenarios, None, args.seeds)
    started = time.monotonic()

    def done(spec: Any, record: dict[str, Any]) -> None:
        print(f"{time.monotonic() - started:7.1f}s {record['scenario']} {record['discipline']} "
              f"seed {record['seed']}", file=sys.stderr)  # fmt: skip

    records, _ = await run_all(os.environ.get("FAIRQ_REDIS_URL"), runs, on_done=done)
    elapsed = time.monotonic() - started
    print(f"{len(records)} runs in {elapsed:.1f}s", file=sys.stderr)
    json.dump(records, sys.stdout, indent=1)
    sys.stdout.write("\n")
    if args.markdown:
        args.markdown.write_text(
            f"<!-- bench/fairness.py --seeds {args.seeds}: {len(records)} runs in "
            f"{elapsed:.0f}s -->\n\n" + markdown(records)
        )


if __name__ == "__main__":
    asyncio.run(main())
