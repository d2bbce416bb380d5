"""docs/design.md names the files a reader should open: every one it names must exist.

A name with a directory (``store/wire.py``, ``include/order_fair.lua``, ``bench/``) is
looked up under the repository root, ``src/fairq``, ``src/fairq/store`` and
``src/fairq/store/lua``; a bare file name (``views.py`` in the dashboard's row of the
table) may be any file of that name in the repository. Globs must match something;
placeholders (``<operation>.lua``) are not file names and are left alone.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DESIGN = REPO / "docs" / "design.md"

#: Where a name with a directory part may be rooted.
ROOTS = (REPO, REPO / "src/fairq", REPO / "src/fairq/store", REPO / "src/fairq/store/lua")

#: Folders whose files a bare file name may name.
SEARCHED = ("src", "tests", "bench", "examples", "docs")

#: A code span that names a file (by its extension) or a directory (a trailing slash).
FILE_NAME = re.compile(
    r"[\w.*/-]+\.(?:py|lua|json|md|toml|js|css|html|yml|yaml)|[\w.-]+/(?:[\w.-]+/)*"
)


def named_paths(markdown: str) -> list[str]:
    """The file and directory names in a Markdown text's code spans, in order, once each."""
    names = [m.group(1) for m in re.finditer(r"`([^`\s]+)`", markdown)]
    return list(dict.fromkeys(n for n in names if FILE_NAME.fullmatch(n)))


def exists(name: str) -> bool:
    if "*" in name:
        return any(any(root.glob(name)) for root in ROOTS)
    if "/" in name.rstrip("/"):
        return any((root / name).exists() for root in ROOTS)
    if name.endswith("/"):
        return any((root / name).is_dir() for root in ROOTS)
    return any(any((REPO / folder).rglob(name)) for folder in SEARCHED)


def missing(markdown: str) -> list[str]:
    return [name for name in named_paths(markdown) if not exists(name)]


def test_every_file_design_md_names_exists() -> None:
    names = named_paths(DESIGN.read_text())
    assert len(names) > 40, names  # the reader finds the table of modules
    assert missing(DESIGN.read_text()) == []


def test_a_file_that_does_not_exist_is_reported() -> None:
    text = "The loader (`store/scripts.py`) checks `context.lua` and `lua/gone/`; `<op>.lua`."
    assert named_paths(text) == ["store/scripts.py", "context.lua", "lua/gone/"]
    assert missing(text) == ["context.lua", "lua/gone/"]
