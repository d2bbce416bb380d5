"""The dashboard's parts that need no server: the served-share chart, the view models,
the security rules, and the rule that the dashboard reads the store only through
RunQueue's public methods."""

from __future__ import annotations

import ast
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from starlette.datastructures import Headers

import fairq
from fairq.dashboard.app import display_url, queue_api_path, queue_path, redrive_path
from fairq.dashboard.security import cross_site_reason, local_path
from fairq.dashboard.served import OVERFLOW_TENANT, served_share
from fairq.dashboard.views import EnvView, QueueView, format_wait
from fairq.keys import Environment
from fairq.models import EnvStats, QueueStats, VariantStats

# ---------------------------------------------------------------------- served share


def test_the_served_share_has_no_in_memory_estimate_left() -> None:
    """Every dequeue records what it serves (the scripts' history), so the dashboard
    keeps no sampler of its own: the chart's one source is the history."""
    from fairq.dashboard import served

    assert not hasattr(served, "ServedSampler")
    assert served.SOURCE == "history"


def test_the_chart_shows_the_busiest_keys_and_sums_the_rest() -> None:
    counts: dict[str | None, int] = {f"k{i}": 10 + i for i in range(10)}
    counts[None] = 1
    chart = served_share([(0, counts), (10_000, {"k0": 5})], top=3)

    labels = [s["label"] for s in chart["series"]]
    assert labels == ["k9", "k8", "k7", "other (8 tenants)"]
    assert chart["total"] == sum(n for n in counts.values() if n) + 5
    assert chart["series"][-1]["counts"] == [10 + 11 + 12 + 13 + 14 + 15 + 16 + 1, 5]
    assert sum(s["share"] for s in chart["series"]) == pytest.approx(1.0)
    keyless = served_share([(0, {None: 2})])["series"]
    assert [(s["key"], s["label"], s["share"]) for s in keyless] == [(None, "(no key)", 1.0)]
    # a full history bucket counts further tenants together under "~"
    full = served_share([(0, {"acme": 3, OVERFLOW_TENANT: 1})])["series"]
    assert [(s["key"], s["label"]) for s in full] == [("acme", "acme"), ("~", "(more tenants)")]


# ---------------------------------------------------------------------- view models


def test_a_queue_view_lists_the_busiest_keys_first_and_reads_a_zero_cap_as_none(
    env: Environment,
) -> None:
    variants = [
        VariantStats("b", 1, 0, 900),
        VariantStats("a", 0, 1, None),
        VariantStats("c", 5, 2, 400),
    ]
    stats = QueueStats(env, "q", 9, 3, 0, 0, 400, variants)

    view = QueueView.of(stats, now_ms=1_400)

    assert [v.key for v in view.variants] == ["c", "a", "b"]  # 7, then 1 and 1 by name
    assert view.queue_size_limit is None and view.paused
    assert view.oldest_wait_s == 1.0 and view.variants[2].oldest_wait_s == 0.5
    row = view.to_json(keys=True)
    assert [k["key"] for k in row["keys"]] == ["c", "a", "b"]
    assert "keys" not in view.to_json()
    env_view = EnvView.of(EnvStats(env, 3, 10, 1.0, 0, 0), [stats, stats], now_ms=1_400)
    assert (env_view.queued, env_view.queue_size_limit) == (18, None)


def test_format_wait() -> None:
    assert [format_wait(s) for s in (None, 0, 1.25, 59.9, 60, 184, 3600, 7_500)] == [
        "—", "0.0 s", "1.2 s", "59.9 s", "1 m 00 s", "3 m 04 s", "1 h 00 m", "2 h 05 m",
    ]  # fmt: skip


# ---------------------------------------------------------------------- URLs and rules


def test_names_are_encoded_whole_in_urls() -> None:
    env = "org:proj:prod"
    assert queue_path(env, "a/../jobs") == "/queues/org%3Aproj%3Aprod/a%2F..%2Fjobs"
    assert queue_api_path(env, "video/encode") == "/api/queues/org%3Aproj%3Aprod/video%2Fencode"
    assert redrive_path(env, "r-1.2_x") == "/envs/org%3Aproj%3Aprod/dlq/r-1.2_x/redrive"


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/", "/"),
        ("/queues/o%3Ap%3Ae/a%2F..%2Fjobs?x=1", "/queues/o%3Ap%3Ae/a%2F..%2Fjobs?x=1"),
        ("//evil.example/x", None),
        ("/\\evil.example", None),
        ("/\t/evil.example", None),
        ("/ok\n", None),
        ("https://evil.example/", None),
        ("javascript:alert(1)", None),
        ("queues/x", None),
        ("", None),
    ],
)
def test_only_paths_on_this_site_are_redirect_targets(target: str, expected: str | None) -> None:
    assert local_path(target) == expected


@pytest.mark.parametrize(
    ("method", "headers", "refused"),
    [
        ("POST", {}, False),  # not a browser (curl, scripts): the token rule applies
        ("POST", {"sec-fetch-site": "same-origin", "origin": "http://dash:8765"}, False),
        ("POST", {"sec-fetch-site": "none"}, False),
        ("POST", {"origin": "http://DASH:8765"}, False),
        ("POST", {"sec-fetch-site": "cross-site"}, True),
        ("POST", {"sec-fetch-site": "same-site"}, True),
        ("POST", {"origin": "http://evil.example"}, True),
        ("POST", {"origin": "http://dash:9999"}, True),
        ("POST", {"origin": "null"}, True),
        ("DELETE", {"sec-fetch-site": "cross-site"}, True),
        ("GET", {"sec-fetch-site": "cross-site", "origin": "http://evil.example"}, False),
        ("HEAD", {"sec-fetch-site": "cross-site"}, False),
    ],
)
def test_cross_site_rule(method: str, headers: dict[str, str], refused: bool) -> None:
    reason = cross_site_reason(method, Headers({"host": "dash:8765", **headers}))
    assert (reason is not None) is refused, reason


def test_an_origin_without_a_host_header_is_refused() -> None:
    assert cross_site_reason("POST", Headers({"origin": "http://dash"})) is not None


def test_display_url_never_shows_credentials() -> None:
    assert display_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert display_url("rediss://admin:s3cret@db.example:6380/2") == "rediss://db.example:6380/2"
    assert display_url("redis://:s3cret@[::1]:6379") == "redis://[::1]:6379"
    assert display_url("redis://db.example/0?password=s3cret") == "redis://db.example/0"
    assert display_url("unix:///run/valkey.sock?db=1") == "unix:///run/valkey.sock"
    assert display_url("redis://u@db.example/0#x") == "redis://db.example/0"
    assert display_url("redis+cluster://n1.example:7000") == "redis+cluster://n1.example:7000"


# ---------------------------------------------------------------------- store access

SRC = Path(fairq.__file__).parent
#: The dashboard and the commands built on its views.
DASHBOARD_FILES = [
    *sorted((SRC / "dashboard").glob("*.py")),
    SRC / "commands" / "stats.py",
    SRC / "commands" / "dashboard.py",
]
#: RunQueue internals a reader outside the store must not touch.
STORE_INTERNALS = {"client", "keys", "pipeline", "_run", "_ctx", "_variants", "_scripts"}


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_dashboard_reads_the_store_through_public_methods_only(path: Path) -> None:
    # parsed on a fresh thread: CPython 3.11.7's AST constructor can raise a spurious
    # "recursion depth mismatch" SystemError when called deep in a long test session
    with ThreadPoolExecutor(1) as pool:
        tree = pool.submit(ast.parse, path.read_text(), str(path)).result()
    touched = [
        f"line {node.lineno}: .{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in STORE_INTERNALS
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            touched += [
                f"line {node.lineno}: import {a.name}" for a in node.names if a.name == "redis"
            ]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = {a.name for a in node.names}
            if node.module == "redis" and names != {"exceptions"}:
                touched.append(f"line {node.lineno}: from redis import {names}")
            if node.module.startswith("redis.") and node.module != "redis.exceptions":
                touched.append(f"line {node.lineno}: from {node.module}")
            if node.module == "fairq.keys" and names != {"Environment"}:
                touched.append(f"line {node.lineno}: from fairq.keys import {names}")
    assert touched == [], path


# ---------------------------------------------------------------------- received vs entitled


def _shares(window: int, rows: dict[str | None, tuple[float, float]], other: float = 0.0) -> Any:
    from fairq.models import KeyShare, TenantShare, TenantShares

    tenants = tuple(
        TenantShare(t, r, e, 0.5, (KeyShare(t, r, e),))
        for t, (r, e) in sorted(rows.items(), key=lambda kv: -kv[1][0])
    )
    return TenantShares(Environment("o", "p", "e"), "q", window, 0, "runs", sum(r for r, _ in
                        rows.values()) + other, 0.0, 6, tenants, other)  # fmt: skip


def test_the_shares_panel_ranks_by_five_minutes_and_sums_the_rest() -> None:
    from fairq.dashboard.shares import shares_panel

    five = {f"t{i}": (float(10 + i), 10.0) for i in range(5)}
    one = {"t0": (4.0, 2.0)}
    panel = shares_panel([_shares(60, one), _shares(300, five), _shares(900, five, other=3)], top=2)
    assert [r["label"] for r in panel["rows"]] == ["t4", "t3"]
    assert panel["rows"][0]["received"] == [0.0, 14.0, 14.0]
    assert panel["rows"][0]["ratio"] == [None, 1.4, 1.4]
    other = panel["other"]
    assert other["count"] == 3  # t0, t1, t2
    assert other["received"] == [4.0, 10 + 11 + 12, 10 + 11 + 12 + 3]
    assert other["ratio"][0] == 2.0
    assert panel["windows"] == [60, 300, 900] and panel["unit"] == "runs"


def test_the_share_gauges_have_bounded_labels() -> None:
    from fairq.dashboard.prometheus import OTHER_TENANTS, SnapshotCollector
    from fairq.dashboard.views import Overview

    many = {f"t{i:02d}": (float(100 - i), 50.0) for i in range(25)}
    many[None] = (0.5, 0.0)  # never backlogged: no ratio series
    collector = SnapshotCollector(
        Overview(now_ms=0, fair_order=True, environments=()), [_shares(300, many)]
    )
    families = {m.name: m for m in collector.collect()}
    received = families["fairq_tenant_received"].samples
    assert len(received) == 11
    labels = [s.labels["tenant"] for s in received]
    assert labels[:3] == ["t00", "t01", "t02"] and labels[-1] == OTHER_TENANTS
    other = received[-1].value
    assert other == sum(100 - i for i in range(10, 25)) + 0.5
    ratios = {s.labels["tenant"]: s.value for s in families["fairq_tenant_share_ratio"].samples}
    assert ratios["t00"] == 2.0 and len(ratios) == 11


def test_amounts_and_ratios_read_plainly() -> None:
    from fairq.dashboard.shares import format_amount, format_ratio

    assert [format_amount(3.0), format_amount(2.25)] == ["3", "2.2"]
    assert [format_ratio(None), format_ratio(1.0), format_ratio(0.456)] == ["—", "1.00", "0.46"]
