"""The live web dashboard (``fairq dashboard``): see :mod:`fairq.dashboard.app`.

:mod:`fairq.dashboard.views` (the view models ``fairq stats`` shares) imports no web
framework; the app itself is loaded on first use of :func:`create_app` or
:func:`create_server`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fairq.dashboard.app import create_app, create_server

__all__ = ["create_app", "create_server"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from fairq.dashboard import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
