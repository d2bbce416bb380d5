"""The ``fairq`` command line. Each command lives in ``fairq/commands/<name>.py`` (a
``click`` command named ``command``) and is imported only when used, so ``fairq --help``
stays fast and one command's dependencies never slow another."""

from __future__ import annotations

import importlib

import click

#: command name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "fairq.commands.demo",
        "Run a multi-tenant workload twice: age order, then fair order.",
    ),
    "worker": ("fairq.commands.worker", "Run tasks of an app: fairq worker module:app."),
    "dashboard": ("fairq.commands.dashboard", "Serve the live dashboard on 127.0.0.1."),
    "sim": ("fairq.commands.sim", "Run fairness scenarios through the real scripts."),
    "bench": ("fairq.commands.bench", "Measure throughput (JSON)."),
    "stats": ("fairq.commands.stats", "Show queues: Queued | Running | limit | paused."),
    "limits": (
        "fairq.commands.limits",
        "Get or set limits, scheduling options, caps and weights; pause and resume queues.",
    ),
    "partitions": (
        "fairq.commands.partitions",
        "Show or change how many partitions an environment is spread over.",
    ),
    "dlq": ("fairq.commands.dlq", "List, redrive and delete dead-lettered runs."),
    "runs": ("fairq.commands.runs", "Show one run, or a queue's recently finished runs."),
    "cancel": ("fairq.commands.cancel", "Cancel queued or dead-lettered runs."),
    "schedules": ("fairq.commands.schedules", "List an app's schedules and their next runs."),
    "server": ("fairq.commands.server", "Run, inspect or stop the embedded Valkey server."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module = importlib.import_module(COMMANDS[cmd_name][0])
        command: click.Command = module.command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in sorted(COMMANDS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup)
@click.version_option(package_name="fairq")
def main() -> None:
    """fairq: a run queue on Redis/Valkey whose dequeue order stays fair across tenants.

    Without FAIRQ_REDIS_URL every command uses one shared embedded Valkey server per user,
    started on first need (stop it with `fairq server stop`).
    """
