#!/usr/bin/env python
"""Django's command line for the example project (run from this directory)::

python manage.py run_fairq_worker            # a worker, inside Django
python manage.py request_report acme --wait  # trigger a report and wait for it
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_example_site.settings")
    from django.core.management import execute_from_command_line  # type: ignore[import-untyped]

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
