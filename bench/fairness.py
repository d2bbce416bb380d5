"""Fairness benchmark: every built-in scenario under its own table of disciplines.

    python bench/fairness.py [--seeds 3] [--scenario NAME ...] [--markdown FILE]
                             [--doc docs/fairness.md] [--from-json RECORDS]

Prints the simulator's JSON records (a list) on stdout. ``--markdown`` also writes the
tables of docs/fairness.md (a headline table, the tenant tables, the caps-vs-scheduling
table and one table per scenario), ours next to the design study's published figures;
``--doc`` replaces the generated blocks of a document in place (each between
``<!-- bench/fairness.py:NAME -->`` and ``<!-- /bench/fairness.py:NAME -->``).
``--from-json`` rebuilds the tables from saved records instead of running anything.
Without FAIRQ_REDIS_URL it runs on a private embedded Valkey.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from fairq.sim.runner import plan, run_all
from fairq.sim.scenario import builtin_scenarios

#: The design study's treatment name for each of our discipline labels.
STUDY_NAMES = {
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

#: Rows of the caps-vs-scheduling table: (our label, the row's name). The first eight
#: are the design study's treatments; the rest are fairq's additions (borrowing,
#: charging by duration), which the study did not measure.
CAPS_ROWS: list[tuple[str, str]] = [
    ("age", "baseline"),
    ("age:per_key_cap=2", "perKeyCap"),
    ("age:total_cap=2", "totalCap"),
    ("age:per_key_cap=2,total_cap=2", "total+perKey"),
    ("sfq", "sfq"),
    ("drr", "drr"),
    ("sfq:per_key_cap=2", "perKeyCap+sfq"),
    ("sfq:per_key_cap=2,total_cap=2", "total+perKey+sfq"),
    ("age:borrow=true,per_key_cap=2", "perKeyCap+borrow"),
    ("sfq:borrow=true,per_key_cap=2", "perKeyCap+sfq+borrow"),
    ("sfq:borrow=true,per_key_cap=2,total_cap=2", "total+perKey+sfq+borrow"),
    ("sfq:charge=duration", "sfq, charged by duration"),
]
CAPS_SCENARIOS = ("ckSkew", "ckTrickle", "ckSybil", "ckHeavyIdle")

#: The group whose wait is the headline (the key the design study calls light / starved;
#: for fairq's own scenarios the group the scenario is about).
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
    "tenantJoinPolicy": "fresh",
    "capHiddenKeys": "zquick",
    "borrowLoneKey": "lone",
    "chargeLongShort": "short",
    "rateLimited": "free",
    "floodFreshFlows": "steady",
    "floodLateNewcomer": "newcomer",
    "floodSybil": "light",
    "splitPools": "light",
}

# The design study's published figures (its three findings reports; logical ms, 3 seeds,
# one key per dequeue call). contWorstS/W (mean over 3 seeds) per treatment.
STUDY_SHARE: dict[str, dict[str, float]] = {
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
STUDY_WAIT: dict[str, dict[str, tuple[float | None, float | None, float | None]]] = {
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


Records = list[dict[str, Any]]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _mean_range(values: list[float], digits: int) -> str:
    """The mean over seeds, with (min..max) when the seeds differ at this precision."""
    mean = _mean(values)
    lo, hi = min(values), max(values)
    if round(lo, digits) == round(hi, digits):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ({lo:.{digits}f}..{hi:.{digits}f})"


def _cell(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _shares(values: list[float | None], digits: int = 3) -> str:
    present = [v for v in values if v is not None]
    return _mean_range(present, digits) if present else "n/a"


def _by(records: Records) -> dict[str, dict[str, Records]]:
    by: dict[str, dict[str, Records]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        by[r["scenario"]][r["discipline"]].append(r)
    return by


def _first(rs: Records, group: str) -> str:
    firsts = [r["groups"][group]["first_serve_step"] for r in rs]
    if any(f is None for f in firsts):
        return "never"
    return _mean_range([float(f) for f in firsts], 0)


def _group_wait(rs: Records, group: str) -> float:
    return _mean([r["groups"][group]["mean_wait"] for r in rs])


def _worst_group(r: dict[str, Any]) -> float:
    return float(max(g["mean_wait"] for g in r["groups"].values()))


def headline_table(records: Records) -> str:
    """One row per scenario: the headline group's wait, the worst key's wait and the
    makespan, age order vs fair order, with the design study's baseline -> sfq."""
    out = [
        "| scenario | headline group | its mean wait: age → sfq | worst key's mean wait: "
        "age → sfq | makespan: age → sfq | worst key S/W: age → sfq | the design study: "
        "light wait, baseline → sfq | the design study: S/W, baseline → sfq |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for scenario, per in _by(records).items():
        age, sfq = per.get("age"), per.get("sfq")
        if not age or not sfq:
            continue
        light = LIGHT_GROUP.get(scenario)
        cells = [scenario, light or "(all)"]
        if light:
            cells.append(f"{_group_wait(age, light):.1f} → {_group_wait(sfq, light):.1f}")
        else:
            cells.append(
                f"{_mean([_worst_group(r) for r in age]):.1f} → "
                f"{_mean([_worst_group(r) for r in sfq]):.1f} (worst group)"
            )
        for field, digits in (("worst_key_mean_wait", 1), ("makespan", 0)):
            a = _mean([float(r[field]) for r in age])
            b = _mean([float(r[field]) for r in sfq])
            cells.append(f"{a:.{digits}f} → {b:.{digits}f}")
        a = _mean([r["contention_worst_share"] for r in age])
        b = _mean([r["contention_worst_share"] for r in sfq])
        cells.append(f"{a:.3f} → {b:.3f}")
        base = STUDY_WAIT.get(scenario, {})
        bw, sw = base.get("baseline", (None,))[0], base.get("sfq", (None,))[0]
        cells.append(f"{bw:.0f} → {sw:.0f}" if bw is not None and sw is not None else "")
        share = STUDY_SHARE.get(scenario, {})
        bs, ss = share.get("baseline"), share.get("sfq")
        cells.append(f"{bs:.3f} → {ss:.3f}" if bs is not None and ss is not None else "")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def tenant_tables(records: Records) -> str:
    """Per tenant, for every scenario with named tenants: weight, keys, wait, first
    serve, contention share and slot share (over weight) under each discipline."""
    out: list[str] = []
    for scenario, per in _by(records).items():
        sample = next(iter(per.values()))[0]
        tenants = sample["tenants"]
        if len(tenants) > 8 or all(t["keys"] == 1 for t in tenants.values()):
            continue  # every key its own tenant: the per-scenario table says it all
        out.append(f"#### {scenario}\n")
        out.append(
            "| discipline | tenant | weight | keys | mean wait | p95 wait | first serve | "
            "contention share | slot share |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|")
        for label, rs in per.items():
            for name, t in tenants.items():
                ts = [r["tenants"][name] for r in rs]
                firsts = [x["first_serve_step"] for x in ts]
                first = (
                    "never"
                    if any(f is None for f in firsts)
                    else _mean_range([float(f) for f in firsts], 0)
                )
                out.append(
                    f"| `{label}` | {name} | {t['weight']:g} | {t['keys']} | "
                    f"{_mean_range([x['mean_wait'] for x in ts], 1)} | "
                    f"{_mean_range([float(x['p95_wait']) for x in ts], 0)} | {first} | "
                    f"{_shares([x['contention_share'] for x in ts])} | "
                    f"{_shares([x['slot_share'] for x in ts])} |"
                )
        out.append("")
    return "\n".join(out)


def caps_table(records: Records) -> str:
    """The design study's caps-vs-scheduling table through the real gates, its figures
    beside ours, plus fairq's borrowing and duration-charging rows. ``× base`` is the
    light wait (makespan) over the baseline's, ours and the study's, which compares
    across the different time units."""
    by = _by(records)
    out = [
        "| scenario | treatment | light wait | × base | worst group wait | makespan | × base "
        "| worst S/W | the study: light wait | × base | worst wait | makespan | × base "
        "| worst S/W |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario in CAPS_SCENARIOS:
        per = by.get(scenario)
        if not per or "age" not in per:
            continue
        light = LIGHT_GROUP[scenario]
        base_wait = _group_wait(per["age"], light)
        base_span = _mean([float(r["makespan"]) for r in per["age"]])
        study = STUDY_WAIT.get(scenario, {})
        study_base = study.get("baseline", (None, None, None))
        for label, name in CAPS_ROWS:
            rs = per.get(label)
            if not rs:
                continue
            wait = _group_wait(rs, light)
            span = _mean([float(r["makespan"]) for r in rs])
            cells = [
                scenario,
                name,
                _mean_range([r["groups"][light]["mean_wait"] for r in rs], 1),
                f"{wait / base_wait:.2f}" if base_wait else "",
                _mean_range([_worst_group(r) for r in rs], 1),
                _mean_range([float(r["makespan"]) for r in rs], 0),
                f"{span / base_span:.2f}" if base_span else "",
                _mean_range([r["contention_worst_share"] for r in rs], 3),
            ]
            sw = study.get(name)
            share = STUDY_SHARE.get(scenario, {}).get(name)
            if sw is None:
                cells += ["—"] * 5 + [_cell(share, 3) or "—"]
            else:
                lw, ww, ms = sw
                cells += [
                    _cell(lw, 0),
                    f"{lw / study_base[0]:.2f}" if lw is not None and study_base[0] else "",
                    _cell(ww, 0),
                    _cell(ms, 0),
                    f"{ms / study_base[2]:.2f}" if ms is not None and study_base[2] else "",
                    _cell(share, 3),
                ]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def scenario_tables(records: Records) -> str:
    """One table per scenario: ours (mean and min..max over seeds) beside the design
    study's figures where it published some."""
    out: list[str] = []
    for scenario, per in _by(records).items():
        light = LIGHT_GROUP.get(scenario)
        out.append(f"#### {scenario}\n")
        head = "| discipline | study name |"
        head += f" {light} wait | {light} first serve | {light} slot share |" if light else ""
        head += " worst key wait | worst group wait | makespan | worst key S/W | cmds/serve |"
        head += " study: light wait | study: worst wait | study: makespan | study: worst S/W |"
        out.append(head)
        out.append("|" + "---|" * (head.count("|") - 1))
        for label, rs in per.items():
            study_name = STUDY_NAMES.get(label, "")
            row = f"| `{label}` | {study_name} |"
            if light:
                row += f" {_mean_range([r['groups'][light]['mean_wait'] for r in rs], 1)} |"
                row += f" {_first(rs, light)} |"
                row += f" {_shares([r['groups'][light]['slot_share'] for r in rs])} |"
            row += f" {_mean_range([r['worst_key_mean_wait'] for r in rs], 1)} |"
            row += f" {_mean_range([_worst_group(r) for r in rs], 1)} |"
            row += f" {_mean_range([float(r['makespan']) for r in rs], 0)} |"
            row += f" {_mean_range([r['contention_worst_share'] for r in rs], 3)} |"
            row += f" {_mean_range([r['commands_per_serve'] for r in rs], 1)} |"
            sw = STUDY_WAIT.get(scenario, {}).get(study_name, (None, None, None))
            share = STUDY_SHARE.get(scenario, {}).get(study_name)
            row += f" {_cell(sw[0], 0)} | {_cell(sw[1], 0)} | {_cell(sw[2], 0)} |"
            row += f" {_cell(share, 3)} |"
            out.append(row)
        out.append("")
    return "\n".join(out)


def group_table(records: Records, scenarios: tuple[str, ...]) -> str:
    """Per group of the given scenarios, under each discipline: mean and max wait, first
    serve, contention share and slot share."""
    by = _by(records)
    out = [
        "| scenario | discipline | group | mean wait | max wait | first serve | "
        "contention share | slot share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for scenario in scenarios:
        for label, rs in by.get(scenario, {}).items():
            for name in rs[0]["groups"]:
                gs = [r["groups"][name] for r in rs]
                out.append(
                    f"| {scenario} | `{label}` | {name} | "
                    f"{_mean_range([g['mean_wait'] for g in gs], 1)} | "
                    f"{_mean_range([float(g['max_wait']) for g in gs], 0)} | "
                    f"{_first(rs, name)} | "
                    f"{_shares([g['contention_share'] for g in gs])} | "
                    f"{_shares([g['slot_share'] for g in gs])} |"
                )
    return "\n".join(out) + "\n"


#: Scenarios of the charging and join-policy blocks.
CHARGE_SCENARIOS = ("chargeLongShort", "longHold")
JOIN_SCENARIOS = ("tenantJoinPolicy", "ckFreshKeyFlood", "ckLateLight")


def sections(records: Records) -> dict[str, str]:
    """The generated blocks of docs/fairness.md, by name (``how`` holds only the note
    of how and when the records were made)."""
    return {
        "how": "",
        "headline": headline_table(records),
        "tenants": tenant_tables(records),
        "caps": caps_table(records),
        "charge": group_table(records, CHARGE_SCENARIOS),
        "join": group_table(records, JOIN_SCENARIOS),
        "scenarios": scenario_tables(records),
    }


def markdown(records: Records) -> str:
    """Every generated block, one after the other."""
    return "\n".join(f"### {name}\n\n{text}" for name, text in sections(records).items() if text)


def update_doc(path: Path, records: Records, run: str) -> None:
    """Replace each generated block of ``path`` (between its markers) with a fresh one;
    ``run`` says how and when the records were made (shown in the ``how`` block, and as
    a comment at the top of the others)."""
    text = path.read_text()
    for name, block in sections(records).items():
        pattern = re.compile(
            rf"(<!-- bench/fairness\.py:{name} -->\n).*?(<!-- /bench/fairness\.py:{name} -->)",
            re.S,
        )
        found = pattern.search(text)
        if found is None:
            raise SystemExit(f"{path}: no block <!-- bench/fairness.py:{name} --> ... end")
        fresh = f"{run}\n" if name == "how" else f"<!-- {run} -->\n\n{block}"
        text = text[: found.end(1)] + fresh + text[found.start(2) :]
    path.write_text(text)


def _lost(records: Records) -> str:
    lost = sum(r["enqueued"] - r["served"] for r in records)
    dup = sum(r["duplicates"] for r in records)
    return f"{lost} lost, {dup} duplicates in {len(records)} runs"


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--scenario", action="append", help="only these (default: all)")
    parser.add_argument("--markdown", type=Path, help="write the docs tables here")
    parser.add_argument("--doc", type=Path, help="replace the generated blocks of this file")
    parser.add_argument("--from-json", type=Path, help="only rebuild the tables from records")
    args = parser.parse_args()
    if args.from_json:
        records = json.loads(args.from_json.read_text())
        seeds = max(r["seed"] for r in records) + 1
        made = time.strftime("%Y-%m-%d", time.localtime(args.from_json.stat().st_mtime))
        run = (
            f"Measured with `python bench/fairness.py --seeds {seeds}` on {made} "
            f"(seeds 0..{seeds - 1}, a private Valkey; tables rebuilt from the saved "
            f"records): {len(records)} runs; {_lost(records)}."
        )
    else:
        scenarios = [s for s in builtin_scenarios() if not args.scenario or s.name in args.scenario]
        runs = plan(scenarios, None, args.seeds)
        started = time.monotonic()

        def done(spec: Any, record: dict[str, Any]) -> None:
            print(f"{time.monotonic() - started:7.1f}s {record['scenario']} "
                  f"{record['discipline']} seed {record['seed']}", file=sys.stderr)  # fmt: skip

        records, _ = await run_all(os.environ.get("FAIRQ_REDIS_URL"), runs, on_done=done)
        elapsed = time.monotonic() - started
        print(f"{len(records)} runs in {elapsed:.1f}s", file=sys.stderr)
        json.dump(records, sys.stdout, indent=1)
        sys.stdout.write("\n")
        where = "FAIRQ_REDIS_URL" if os.environ.get("FAIRQ_REDIS_URL") else "a private Valkey"
        run = (
            f"Measured with `python bench/fairness.py --seeds {args.seeds}` on "
            f"{time.strftime('%Y-%m-%d')} (seeds 0..{args.seeds - 1}, {where}): "
            f"{len(records)} runs in {elapsed:.0f} s; {_lost(records)}."
        )
    if args.markdown:
        args.markdown.write_text(f"{run}\n\n{markdown(records)}")
    if args.doc:
        update_doc(args.doc, records, run)


if __name__ == "__main__":
    asyncio.run(main())
