"""Read configuration from ``LLMGW_*`` environment variables, failing loudly on bad values.

Modelled on healthchecks' ``envbool``/``envint``: a value that cannot be read stops the
start with ``ImproperlyConfigured`` naming the variable, rather than falling back silently.
Every secret also accepts ``LLMGW_<NAME>_FILE``, a path to a file holding it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

from llmgw_core.dbbounds import bounded

PREFIX = "LLMGW_"


def _raw(name: str) -> str | None:
    return os.environ.get(PREFIX + name)


def envstr(name: str, default: str = "") -> str:
    """Return ``LLMGW_<name>`` as text, or the default when unset."""
    value = _raw(name)
    return default if value is None else value


def envbool(name: str, default: bool) -> bool:
    """Return ``LLMGW_<name>`` as a boolean: only ``true`` or ``false``, in any case."""
    value = _raw(name)
    if value is None or value == "":
        return default
    if value.lower() == "true":
        return True
    if value.lower() == "false":
        return False
    raise ImproperlyConfigured(f"{PREFIX}{name} is {value!r}: write true or false")


def envint(name: str, default: int) -> int:
    """Return ``LLMGW_<name>`` as a whole number."""
    value = _raw(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{PREFIX}{name} is {value!r}: write a whole number") from None


def envlist(name: str, default: list[str]) -> list[str]:
    """Return ``LLMGW_<name>`` split on commas, blanks dropped."""
    value = _raw(name)
    if value is None:
        return list(default)
    return [part.strip() for part in value.split(",") if part.strip()]


def envsecret(name: str, default: str = "") -> str:
    """Return a secret from ``LLMGW_<name>`` or the file named by ``LLMGW_<name>_FILE``."""
    value = _raw(name)
    path = _raw(name + "_FILE")
    if value is not None and path is not None:
        raise ImproperlyConfigured(f"{PREFIX}{name} and {PREFIX}{name}_FILE are both set: keep one")
    if path is not None:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(
                f"{PREFIX}{name}_FILE names {path!r}, which cannot be read: {exc}"
            ) from None
    return default if value is None else value


def database_from_url(
    url: str, *, connect: int, statement: int, pool_size: int
) -> dict[str, object]:
    """Return a Django DATABASES entry for a ``postgres://user:pw@host:port/name`` URL.

    ``connect`` and ``statement`` are the bounds in seconds on a connection and on a
    statement, ``pool_size`` the connections one process holds at most (the settings'
    ``LLMGW_DB_*``, read and checked in settings.py)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql", "postgresql+psycopg"):
        raise ImproperlyConfigured(
            f"{PREFIX}DATABASE_URL scheme {parts.scheme!r} is not supported: "
            "use postgres://user:password@host:5432/name, or unset it for SQLite"
        )
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfigured(f"{PREFIX}DATABASE_URL names no database after the host")

    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        # Pooled, not persistent: under ASGI every request runs in a thread of its own,
        # and a connection kept per thread ran PostgreSQL out of connections with 200
        # agents heartbeating (bench/agents.py). The pool caps what one process holds.
        "CONN_MAX_AGE": 0,
        # A pooled connection is checked (an empty query, bounded by the connect timeout)
        # before it is handed out: one the server stopped answering is thrown away.
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": {
            # A request waits for a connection at most the connect timeout: with the
            # server away or hung it gets an OperationalError (a 503 with Retry-After:
            # llmgw_admin.dbdown) in seconds, never a thread held.
            "pool": {
                "min_size": 2,
                "max_size": pool_size,
                "timeout": connect,
                # Every wait on the server bounded (llmgw_core.dbbounds).
                "connection_class": bounded(connect, statement + connect),
            },  # fmt: skip
            # A server that does not answer a new connection is given up on, not waited
            # for (libpq waits forever by default); keepalives find a dead peer.
            "connect_timeout": connect,
            # A statement the server still answers is ended by it past the bound.
            "options": f"-c statement_timeout={statement * 1000}",
            "keepalives": 1,
            "keepalives_idle": 30,
            "keepalives_interval": 10,
            "keepalives_count": 3,
        },
    }


def secret_key(data_dir: Path) -> str:
    """Return ``LLMGW_SECRET_KEY``, or one generated once and kept in the data folder."""
    configured = envsecret("SECRET_KEY")
    if configured:
        return configured
    path = data_dir / "secret_key"
    if path.exists():
        return path.read_text().strip()

    data_dir.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    # Written with owner-only permissions: anyone who reads it can forge sessions.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key)
    return key


def private_dir(path: Path) -> Path:
    """Make ``path`` (and missing parents) a folder only its owner may enter (mode 700).

    The data folder holds the secret key, the embedded database (sessions, password
    hashes) and the simulated nodes' tokens. A folder made by an earlier version with the
    umask's mode (755) is made private at the next start; one owned by another user keeps
    the mode its owner gave it.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _chmod_own(path, 0o700)
    return path


def private_file(path: Path) -> Path:
    """Make ``path`` a file only its owner may read (mode 600), creating it empty if missing.

    SQLite gives its journal and WAL files the database file's mode.
    """
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        _chmod_own(path, 0o600)
    return path


def _chmod_own(path: Path, mode: int) -> None:
    info = path.stat()
    if info.st_uid == os.getuid() and info.st_mode & 0o777 != mode:
        path.chmod(mode)
