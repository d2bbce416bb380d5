"""``python manage.py run_fairq_worker``: a fairq worker inside Django (tasks may use the
ORM and settings). SIGTERM / Ctrl-C stops it gracefully."""

from __future__ import annotations

import asyncio
from typing import Any

from django.core.management.base import BaseCommand, CommandParser  # type: ignore[import-untyped]

from fairq import Worker
from reports.tasks import app


class Command(BaseCommand):  # type: ignore[misc]
    help = "Run the reports app's fairq tasks."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--concurrency", type=int, default=4)
        parser.add_argument("--burst", action="store_true", help="Exit once idle.")

    def handle(self, *args: Any, **options: Any) -> None:
        worker = Worker(
            app,
            concurrency=options["concurrency"],
            burst=options["burst"],
            install_signal_handlers=True,
        )

        async def main() -> None:
            try:
                stats = await worker.run()
            finally:
                await app.aclose()
            self.stdout.write(f"worker stopped: {stats.completed} completed, {stats.failed} failed")

        asyncio.run(main())
