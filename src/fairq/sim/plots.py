"""PNG plots of simulated runs (matplotlib, Agg backend): per scenario, one column per
discipline (e.g. the flag off vs on), the per-group wait distribution on top and each
group's share of the serves over time below."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from fairq.sim.driver import Trace


def plot_scenario(scenario: str, traces: dict[str, Trace], out_dir: Path) -> Path:
    """Write ``out_dir/<scenario>.png`` for ``{discipline label: trace}``; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    columns = list(traces)
    fig, axes = plt.subplots(
        2, len(columns), figsize=(4.2 * len(columns), 7.0), squeeze=False, sharey="row"
    )
    for col, label in enumerate(columns):
        trace = traces[label]
        w = trace.workload
        groups = list(dict.fromkeys(w.key_group.values()))
        waits: dict[str, list[int]] = {g: [] for g in groups}
        per_step: dict[int, Counter[str]] = {}
        for m in w.messages:
            step = trace.serve_step.get(m.run_id)
            if step is None:
                continue
            waits[m.group].append(step - m.arrival_step)
            per_step.setdefault(step, Counter())[m.group] += 1
        top = axes[0][col]
        top.boxplot([waits[g] or [0] for g in groups], showfliers=True)
        top.set_xticks(range(1, len(groups) + 1), groups, rotation=30, fontsize=8)
        top.set_title(label if len(label) <= 40 else label[:37] + "...", fontsize=9)
        if col == 0:
            top.set_ylabel("wait (steps)")
        bottom = axes[1][col]
        last = max(per_step, default=0)
        width = max(1, (last + 1) // 40)
        bins = list(range(0, last + 1, width))
        totals = [0] * len(bins)
        shares: dict[str, list[float]] = {g: [0.0] * len(bins) for g in groups}
        for step, counts in per_step.items():
            b = min(step // width, len(bins) - 1)
            for g, n in counts.items():
                shares[g][b] += n
                totals[b] += n
        for g in groups:
            bottom.plot(bins, [s / t if t else 0.0 for s, t in zip(shares[g], totals, strict=True)],
                        label=g, drawstyle="steps-post")  # fmt: skip
        bottom.set_xlabel(f"step (bins of {width})")
        bottom.set_ylim(0, 1.05)
        if col == 0:
            bottom.set_ylabel("share of serves")
            bottom.legend(fontsize=8)
    fig.suptitle(f"{scenario}: wait per group (top), served share over time (bottom)")
    fig.tight_layout()
    path = out_dir / f"{scenario}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
