"""Shared fixtures: one real server per test session (embedded Valkey, or FAIRQ_REDIS_URL),
and a fresh key prefix per test.

``FAIRQ_TEST_CLUSTER=N`` runs the session against an N-master embedded Redis/Valkey
Cluster instead (``redis_url`` is then a ``redis+cluster://`` URL)."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import hypothesis  # noqa: F401 - imported (and rewritten by pytest) here, at the start
import pytest

from fairq.config import RunQueueConfig
from fairq.keys import Environment
from fairq.server import EmbeddedServer, connect
from fairq.store import RunQueue

_counter = itertools.count()


#: Environment variable: run the session against an embedded cluster of this many masters.
CLUSTER_ENV = "FAIRQ_TEST_CLUSTER"


def cluster_masters() -> int:
    """Masters of the session's embedded cluster (0: a single server)."""
    raw = os.environ.get(CLUSTER_ENV, "").strip()
    if not raw or raw == "0":
        return 0
    if not raw.isdigit():
        raise pytest.UsageError(f"{CLUSTER_ENV}={raw!r}: expected a number of masters")
    return int(raw)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The session's server: FAIRQ_REDIS_URL, an embedded cluster (FAIRQ_TEST_CLUSTER=N),
    or one embedded Valkey."""
    url = os.environ.get("FAIRQ_REDIS_URL")
    if url:
        yield url
        return
    masters = cluster_masters()
    if masters:
        from fairq.cluster import EmbeddedCluster

        with EmbeddedCluster(masters) as cluster:
            yield cluster.url
        return
    with EmbeddedServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def cluster_url(redis_url: str) -> Iterator[str]:
    """A Redis Cluster for tests that need one in any run: the session's own under
    FAIRQ_TEST_CLUSTER, else a 2-master embedded cluster started once for the session."""
    from fairq.cluster import EmbeddedCluster
    from fairq.server import is_cluster_url

    if is_cluster_url(redis_url):
        yield redis_url
        return
    with EmbeddedCluster(2) as cluster:
        yield cluster.url


@pytest.fixture
def prefix() -> str:
    return f"t{os.getpid()}x{next(_counter)}"


@pytest.fixture
def env() -> Environment:
    return Environment("org1", "proj1", "prod")


@pytest.fixture
async def make_queue(redis_url: str, prefix: str) -> AsyncIterator[Callable[..., object]]:
    """Factory: ``await make_queue(**config_overrides)`` -> RunQueue on the test prefix."""
    made: list[RunQueue] = []

    async def factory(**overrides: object) -> RunQueue:
        import random

        vtime = overrides.pop("vtime", None)
        config = RunQueueConfig(prefix=prefix, **overrides)  # type: ignore[arg-type]
        if vtime is not None:
            config = config.with_vtime(**vtime)  # type: ignore[arg-type]
        rq = RunQueue(await connect(redis_url), config, rng=random.Random(7))
        made.append(rq)
        return rq

    yield factory
    for rq in made:
        await rq.close()


#: The marker of each test directory: what its tests need (unit: no server; integration:
#: the real server; acceptance: workers, the CLI and the web end to end; faults: processes
#: and servers killed on purpose).
TIER_MARKERS = {
    "unit": "unit",
    "integration": "integration",
    "acceptance": "acceptance",
    "faults": "faults",
}

#: Modules whose tests need a Redis Cluster (the session's, or one they start).
CLUSTER_MODULES = frozenset(
    {"test_cluster.py", "test_cluster_resilience.py", "test_cluster_routing.py"}
)

#: Tests that take about a second or more here (``pytest --durations``): out of the fast
#: loop (``pytest -m "not slow"``), in every full run. A node id each, or ``name[`` for
#: every parameter set of a test. One that names no collected test is reported at the
#: end of a full run (a renamed test would otherwise leave the list silently).
SLOW_TESTS = frozenset(
    {
        "tests/acceptance/test_cancel_running.py::test_a_run_that_ignores_its_cancellation_is_abandoned_at_the_grace_deadline",
        "tests/acceptance/test_cancel_running.py::test_an_abandoned_async_run_gives_its_worker_slot_back",
        "tests/acceptance/test_cancel_running.py::test_an_async_run_that_swallows_cancelled_error_is_abandoned_too",
        "tests/acceptance/test_cancel_running.py::test_fairq_cancel_stops_a_running_run",
        "tests/acceptance/test_cli.py::test_a_bad_limit_is_one_clear_error",
        "tests/acceptance/test_cli.py::test_cancel_a_queued_run",
        "tests/acceptance/test_cli.py::test_dlq_list_and_redrive",
        "tests/acceptance/test_cli.py::test_limits_set_get_pause_resume",
        "tests/acceptance/test_cli.py::test_limits_set_is_validated_whole_and_applied_at_once",
        "tests/acceptance/test_cli.py::test_stats_shows_ck_aware_counts",
        "tests/acceptance/test_cli.py::test_worker_refuses_what_is_not_an_app",
        "tests/acceptance/test_cli.py::test_worker_starts_runs_tasks_and_stops_on_sigterm",
        "tests/acceptance/test_cli_operating.py::test_limits_set_every_option_caps_and_weights",
        "tests/acceptance/test_cli_operating.py::test_runs_show_recent_and_dead_letters_with_tracebacks",
        "tests/acceptance/test_cli_operating.py::test_unknown_names_get_a_warning_with_a_suggestion",
        "tests/acceptance/test_position_cli.py::test_handle_and_cli_show_where_a_run_stands",
        "tests/acceptance/test_dashboard.py::test_a_queue_named_like_a_path_opens_its_own_page_in_the_browser",
        "tests/acceptance/test_dashboard.py::test_cli_refuses_to_bind_beyond_loopback_without_a_token",
        "tests/acceptance/test_dashboard.py::test_cli_serves_with_a_token_and_stops_cleanly_on_ctrl_c",
        "tests/acceptance/test_dashboard.py::test_render_the_readme_screenshot",
        "tests/acceptance/test_dashboard.py::test_the_page_says_when_the_server_is_not_answering_and_comes_back_by_itself",
        "tests/acceptance/test_dashboard.py::test_the_page_shows_ck_counts_live_and_redrive_empties_the_dlq",
        "tests/acceptance/test_dashboard.py::test_the_pages_work_under_their_csp_and_nothing_can_frame_them",
        "tests/acceptance/test_dashboard_hardening.py::test_a_server_that_stops_answering_gets_503_after_the_store_timeout",
        "tests/acceptance/test_demo.py::test_demo_fair_order_cuts_light_tenants_mean_wait_at_least_5x",
        "tests/acceptance/test_examples.py::test_the_django_command_triggers_and_waits_while_a_worker_runs",
        "tests/acceptance/test_examples.py::test_the_fastapi_example_triggers_a_task_that_a_worker_runs",
        "tests/acceptance/test_observability.py::test_a_workers_metrics_and_json_logs_after_a_drain",
        "tests/acceptance/test_operating_dashboard.py::test_operating_a_fair_queue_in_the_browser",
        "tests/acceptance/test_progress.py::test_progress_is_stored_with_the_run_and_coalesced_into_heartbeats",
        "tests/acceptance/test_readme.py::test_the_use_it_snippet_runs_as_written",
        "tests/acceptance/test_schedules.py::test_fairq_schedules_lists_schedules_and_next_runs",
        "tests/acceptance/test_schedules.py::test_three_workers_run_each_tick_of_a_schedule_once",
        "tests/acceptance/test_shares_views.py::test_stats_tenants_the_queue_page_and_the_store_agree",
        "tests/acceptance/test_shares_views.py::test_stats_tenants_needs_an_environment",
        "tests/acceptance/test_stats_views.py::test_stats_json_and_the_dashboard_overview_agree",
        "tests/acceptance/test_stats_views.py::test_stats_refuses_a_watch_interval_that_is_not_positive",
        "tests/acceptance/test_stats_views.py::test_stats_table_shows_the_same_rows",
        "tests/acceptance/test_supervisor.py::test_the_supervisor_restarts_a_killed_child_and_stops_all_gracefully",
        "tests/acceptance/test_testing_plugin.py::test_the_plugin_gives_tests_a_private_server_and_workers",
        "tests/acceptance/test_worker.py::test_runs_of_a_killed_worker_complete_in_another_worker",
        "tests/acceptance/test_worker.py::test_sigterm_lets_in_flight_runs_finish_and_leaves_the_rest_queued",
        "tests/acceptance/test_worker.py::test_sigterm_returns_runs_that_outlive_the_grace_period",
        "tests/acceptance/test_worker_loops.py::test_a_progress_note_with_a_lone_surrogate_is_refused_and_the_leases_renewed",
        "tests/acceptance/test_worker_loops.py::test_the_heartbeat_drops_a_bad_note_and_still_renews_every_lease[",
        "tests/acceptance/test_worker_loops.py::test_the_heartbeat_loop_survives_a_call_that_raises",
        "tests/acceptance/test_worker_loops.py::test_the_schedule_loop_survives_a_pass_that_raises",
        "tests/faults/test_clock_skew.py::test_a_consumer_30_s_ahead_steals_no_lease_and_keeps_its_own",
        "tests/faults/test_server_kill.py::test_kill_9_of_the_server_loses_no_acknowledged_enqueue_and_workers_resume",
        "tests/faults/test_worker_kills.py::test_kill_9_of_workers_loses_nothing_and_explains_every_duplicate",
        "tests/integration/test_borrow_and_charge.py::test_charging_by_duration_equalises_slot_time",
        "tests/integration/test_cancel_wins.py::test_cancel_interleaved_with_every_other_operation_matches_the_model",
        "tests/integration/test_ck_counters_random.py::test_every_reader_matches_ground_truth[",
        "tests/integration/test_cluster.py::test_consumers_cover_every_shard_exactly_once",
        "tests/integration/test_cluster.py::test_every_operation_runs_on_a_three_master_cluster[",
        "tests/integration/test_cluster_resilience.py::test_consumers_ride_out_a_master_restart_without_loss_or_double_delivery[",
        "tests/integration/test_cluster_routing.py::test_script_calls_on_a_cluster_ask_no_node_for_their_keys",
        "tests/integration/test_consumer.py::test_a_long_interval_consumer_does_not_hold_off_maintenance",
        "tests/integration/test_consumer.py::test_an_idle_consumer_costs_the_server_almost_nothing",
        "tests/integration/test_fairness_attacks.py::test_a_lapsed_lease_is_charged_its_lease_time",
        "tests/integration/test_function_libraries.py::test_an_older_process_still_running_reloads_and_deletes_nothing_newer",
        "tests/integration/test_function_libraries.py::test_libraries_of_a_fairq_without_manifests_count_as_the_oldest_build",
        "tests/integration/test_function_libraries.py::test_the_shipped_build_prunes_once_and_keeps_working",
        "tests/integration/test_function_libraries.py::test_three_builds_keep_the_two_newest_and_delete_the_oldest",
        "tests/integration/test_limits_processes.py::test_total_cap_holds_under_four_consumer_processes[",
        "tests/integration/test_limits_random.py::test_total_cap_and_counters_match_the_model[",
        "tests/integration/test_lua_contracts.py::test_no_constant_is_defined_on_both_sides_by_hand",
        "tests/integration/test_multiprocess.py::test_a_consumer_killed_mid_lease_loses_nothing",
        "tests/integration/test_multiprocess.py::test_four_consumer_processes_get_every_message_exactly_once",
        "tests/integration/test_partition_fairness.py::test_a_9_key_tenant_gets_what_a_1_key_tenant_gets_across_partitions[",
        "tests/integration/test_partition_fairness.py::test_a_tenant_joining_a_lagging_partition_gets_no_credit",
        "tests/integration/test_partition_fairness.py::test_round_robin_over_partitions_misses_the_bound",
        "tests/integration/test_partition_fairness.py::test_weights_1_2_4_hold_across_partitions[",
        "tests/integration/test_partition_processes.py::test_the_cap_holds_under_four_processes_and_kills",
        "tests/integration/test_partition_quotas.py::test_the_environment_limit_holds_across_partitions[",
        "tests/integration/test_partitions.py::test_the_cli_spreads_an_environment_and_shows_its_partitions",
        "tests/integration/test_purge.py::test_purge_deletes_every_key_of_the_prefix_on_a_cluster",
        "tests/integration/test_queue_size_limit_concurrency.py::test_four_processes_never_overshoot_the_limit",
        "tests/integration/test_rates.py::test_a_consumer_waiting_on_a_bucket_does_not_poll[",
        "tests/integration/test_priority_model.py::test_tiered_order_matches_one_fair_model_per_level[",
        "tests/integration/test_rates.py::test_starts_follow_the_rate_after_the_burst[",
        "tests/integration/test_rates.py::test_the_per_key_default_limits_every_key_on_its_own[",
        "tests/integration/test_script_maxima.py::test_dequeue_1000_from_12000_keys_and_finish_1000_at_once[",
        "tests/integration/test_script_maxima.py::test_enqueue_many_10000_in_one_call_and_1000_in_one_script_call",
        "tests/integration/test_scripts.py::test_processes_with_different_settings_each_get_their_own_context",
        "tests/integration/test_server.py::test_the_embedded_server_never_outlives_its_owner[",
        "tests/integration/test_server_heal.py::test_heal_after_kill_9_from_two_processes_gives_one_server_with_the_data",
        "tests/integration/test_server_state.py::test_a_server_that_no_longer_answers_gets_sigterm_only_after_the_proc_check",
        "tests/integration/test_sim_admission.py::test_a_flood_of_fresh_tenants_meets_the_bound_only_with_the_budget",
        "tests/integration/test_sim_admission.py::test_fair_state_per_pool_serves_each_pools_tenants_in_turn",
        "tests/integration/test_sim.py::test_ck_skew_sfq_cuts_the_light_keys_wait_as_the_seed_reports",
        "tests/integration/test_sim.py::test_duration_charging_shares_slot_time",
        "tests/integration/test_sim.py::test_every_builtin_scenario_serves_every_message_once_under_its_table[",
        "tests/integration/test_sim.py::test_the_cli_lists_runs_and_writes_json_and_plots",
        "tests/integration/test_tenants.py::test_balanced_arrivals_no_key_waits_more_than_125_percent_of_age",
        "tests/integration/test_tenants.py::test_key_flood_does_not_hurt_a_steady_tenant",
        "tests/integration/test_tenants.py::test_light_tenant_among_10000_busy_keys_is_served_within_2_steps",
        "tests/integration/test_tenants.py::test_tenant_shares_over_keys_one_key_vs_nine",
        "tests/integration/test_tenants.py::test_tenant_shares_over_queues_one_queue_vs_nine",
        "tests/integration/test_tenants.py::test_tenant_shares_with_a_fresh_key_per_message",
        "tests/integration/test_tenants.py::test_tenant_weights_1_2_4_at_default_settings",
        "tests/integration/test_vtime_concurrency.py::test_op_count_budget_per_dequeue_call[",
        "tests/integration/test_vtime_concurrency.py::test_two_consumer_processes_one_base_queue_no_corruption",
        "tests/integration/test_vtime_fairness.py::test_ck_balanced_no_harm",
        "tests/integration/test_vtime_fairness.py::test_ck_skew_light_keys_wait_far_less[",
        "tests/integration/test_vtime_fairness.py::test_ck_sybil_light_key_gets_its_turn_within_one_round[",
        "tests/integration/test_vtime_fairness.py::test_ck_trickle_trickle_keys_wait_far_less[",
        "tests/integration/test_vtime_fairness.py::test_join_policy_trade_off_fresh_key_flood",
        "tests/integration/test_vtime_fairness.py::test_join_policy_trade_off_light_key_behind_a_sharded_backlog",
        "tests/integration/test_vtime_model.py::test_every_queued_flow_is_registered_or_parked",
        "tests/integration/test_vtime_model.py::test_lua_fair_order_matches_reference_model[",
        "tests/unit/test_deploy_examples.py::test_hadolint_finds_nothing_in_the_dockerfile",
        "tests/unit/test_typed.py::test_payload_and_result_types_flow_through_trigger_and_wait",
    }
)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test by its directory (tier), its need of a cluster or a browser, and
    its speed; in the cluster run, skip the long tests that prove topology-independent
    logic (they run on the single server; every script keeps its keys in one slot either
    way)."""
    unmatched = set(SLOW_TESTS)
    for item in items:
        for marker in _markers_of(item, unmatched):
            item.add_marker(marker)
    if unmatched and _collected_everything(config):
        config.stash[_UNMATCHED_SLOW] = sorted(unmatched)
    if cluster_masters():
        skip = pytest.mark.skip(reason="single_server: topology-independent; run on one server")
        for item in items:
            if item.get_closest_marker("single_server"):
                item.add_marker(skip)


#: SLOW_TESTS entries that matched no collected test in this run.
_UNMATCHED_SLOW = pytest.StashKey[list[str]]()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    unmatched = config.stash.get(_UNMATCHED_SLOW, [])
    if unmatched:
        terminalreporter.write_sep("-", "SLOW_TESTS entries that match no test (renamed?)")
        for name in unmatched:
            terminalreporter.write_line(name)


def _markers_of(item: pytest.Item, unmatched: set[str]) -> list[str]:
    path = item.path
    markers = [TIER_MARKERS[d] for d in path.parent.parts[-1:] if d in TIER_MARKERS]
    if path.name in CLUSTER_MODULES:
        markers.append("cluster")
    if "chromium" in getattr(item, "fixturenames", ()):
        markers.append("browser")
    family = item.nodeid.split("[", 1)[0] + "["
    slow = {name for name in (item.nodeid, family) if name in SLOW_TESTS}
    if slow:
        unmatched.difference_update(slow)
        markers.append("slow")
    return markers


def _collected_everything(config: pytest.Config) -> bool:
    """Whether the run collected the whole suite (its test paths, no -k, no -m), so that
    every entry of SLOW_TESTS should have matched a test."""
    return (
        config.args_source is pytest.Config.ArgsSource.TESTPATHS
        and not config.option.keyword
        and not config.option.markexpr
    )
