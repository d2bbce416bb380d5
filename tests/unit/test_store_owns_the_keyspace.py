"""Only the store touches the Redis client: no other module reads or writes keys.

Checked on the source (AST), so a leak through an attribute (``rq.client``) is caught as
well as an import. ``server.py`` and ``cluster.py`` manage server processes (they talk
to a server, never to fairq's keys) and ``packing.py`` how connections pack commands;
they may import redis-py. Other modules may import only ``redis.exceptions`` (to name
an error type).
"""

from __future__ import annotations

import ast
from pathlib import Path

import fairq

ROOT = Path(fairq.__file__).parent
STORE = ROOT / "store"
SERVER_MODULES = {ROOT / "server.py", ROOT / "cluster.py", ROOT / "packing.py"}


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if STORE not in p.parents)


def test_no_module_outside_the_store_uses_a_client_attribute() -> None:
    leaks = []
    for path in _modules():
        if path in SERVER_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("client", "pipeline"):
                leaks.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert leaks == []


def test_no_module_outside_the_store_imports_a_redis_client() -> None:
    leaks = []
    for path in _modules():
        if path in SERVER_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if (name == "redis" or name.startswith("redis.")) and name != "redis.exceptions":
                    leaks.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert leaks == []


def test_the_check_finds_a_leak() -> None:
    """The checks above can fail: they flag a module that reaches for the client."""
    tree = ast.parse("async def f(rq):\n    await rq.client.get('k')\n")
    assert any(isinstance(n, ast.Attribute) and n.attr == "client" for n in ast.walk(tree))
