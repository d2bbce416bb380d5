"""The live web dashboard (``fairq dashboard``): see :mod:`fairq.dashboard.app`."""

from fairq.dashboard.app import create_app, create_server

__all__ = ["create_app", "create_server"]
