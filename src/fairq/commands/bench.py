"""``fairq bench``: run the throughput benchmark (bench/throughput.py) of a source checkout."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import click

#: The benchmark script, relative to a source checkout's root.
SCRIPT = Path("bench") / "throughput.py"


def find_script() -> Path | None:
    """bench/throughput.py in the current directory or the checkout fairq is installed from."""
    import fairq

    candidates = [Path.cwd() / SCRIPT, Path(fairq.__file__).resolve().parents[2] / SCRIPT]
    return next((p for p in candidates if p.is_file()), None)


@click.command(
    name="bench", context_settings={"ignore_unknown_options": True, "allow_extra_args": True}
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args: tuple[str, ...]) -> None:
    """Measure throughput (JSON). Runs bench/throughput.py of the source checkout;
    every argument is passed on to it (try `fairq bench --help`)."""
    script = find_script()
    if script is None:
        raise click.ClickException(
            "the throughput benchmark (bench/throughput.py) is not available: it ships with "
            "the source checkout, not the package. Run `fairq bench` from a clone of fairq."
        )
    saved = sys.argv
    sys.argv = [str(script), *args]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = saved
