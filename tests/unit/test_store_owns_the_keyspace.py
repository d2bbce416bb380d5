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


def client_attribute_uses(source: str, name: str) -> list[str]:
    """Where a module's source reaches for a client (``.client`` / ``.pipeline``)."""
    return [
        f"{name}:{node.lineno} .{node.attr}"
        for node in ast.walk(ast.parse(source, name))
        if isinstance(node, ast.Attribute) and node.attr in ("client", "pipeline")
    ]


def redis_client_imports(source: str, name: str) -> list[str]:
    """Where a module's source imports redis-py beyond ``redis.exceptions``."""
    leaks = []
    for node in ast.walk(ast.parse(source, name)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for imported in names:
            is_redis = imported == "redis" or imported.startswith("redis.")
            if is_redis and imported != "redis.exceptions":
                leaks.append(f"{name}:{node.lineno} imports {imported}")
    return leaks


def _checked_modules() -> list[tuple[str, str]]:
    """(source, name) of every module outside the store and the server modules."""
    return [
        (path.read_text(), str(path.relative_to(ROOT)))
        for path in _modules()
        if path not in SERVER_MODULES
    ]


def test_no_module_outside_the_store_uses_a_client_attribute() -> None:
    modules = _checked_modules()
    assert len(modules) > 30  # the walk finds the package
    assert [leak for m in modules for leak in client_attribute_uses(*m)] == []


def test_no_module_outside_the_store_imports_a_redis_client() -> None:
    assert [leak for m in _checked_modules() for leak in redis_client_imports(*m)] == []


def test_the_checks_find_a_leak() -> None:
    """The checks above can fail: they flag a module that reaches for the client or
    imports it, and leave a module that only names an error type alone."""
    leaking = (
        "import redis.asyncio\n"
        "from redis import Redis\n"
        "from redis.exceptions import ResponseError\n"
        "async def f(rq):\n"
        "    await rq.client.get('k')\n"
        "    rq.store.pipeline()\n"
    )
    assert sorted(client_attribute_uses(leaking, "m.py")) == ["m.py:5 .client", "m.py:6 .pipeline"]
    assert redis_client_imports(leaking, "m.py") == [
        "m.py:1 imports redis.asyncio",
        "m.py:2 imports redis",
    ]
    clean = "from redis.exceptions import ResponseError\nasync def f(rq):\n    await rq.ack([])\n"
    assert client_attribute_uses(clean, "m.py") == []
    assert redis_client_imports(clean, "m.py") == []
