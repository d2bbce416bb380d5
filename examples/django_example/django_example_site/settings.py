"""Minimal settings: no database, one app ("reports") with fairq tasks and commands."""

from __future__ import annotations

SECRET_KEY = "example-only-not-secret"
DEBUG = True
INSTALLED_APPS = ["reports"]
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True
TIME_ZONE = "UTC"
