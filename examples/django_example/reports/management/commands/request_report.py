"""``python manage.py request_report ACCOUNT [--wait]``: trigger a report run."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser  # type: ignore[import-untyped]

from reports.tasks import build_report


class Command(BaseCommand):  # type: ignore[misc]
    help = "Trigger a report run (and optionally wait for its result)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("account")
        parser.add_argument("--wait", action="store_true", help="Wait for the result.")
        parser.add_argument("--timeout", type=float, default=30.0)

    def handle(self, *args: Any, **options: Any) -> None:
        # Django commands are blocking code: the *_sync API, one round trip per trigger
        handle = build_report.trigger_sync(
            {"account": options["account"]}, concurrency_key=options["account"]
        )
        self.stdout.write(f"run {handle.run_id} {handle.status.name.lower()}")
        if options["wait"]:
            report = handle.wait_sync(timeout=options["timeout"])
            self.stdout.write(json.dumps(report, sort_keys=True))
        build_report.app.close()
