"""The test database's URL, for a process a test starts (with the role's password, which
run.py sets: tests/settings.py)."""

from __future__ import annotations

from urllib.parse import quote

from django.db import connection


def database_url(host: str | None = None, port: int | None = None, name: str | None = None) -> str:
    db = connection.settings_dict
    login = quote(db["USER"], safe="")
    if db.get("PASSWORD"):
        login += ":" + quote(db["PASSWORD"], safe="")
    host = host or db["HOST"] or "127.0.0.1"
    return f"postgres://{login}@{host}:{port or db['PORT'] or 5432}/{name or db['NAME']}"
