"""Configuration: LLMGW_* variables read strictly, and the documented list kept in step."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from gateway.path import holdback
from gateway.path.admission import Admission
from gateway.path.affinity import Sessions
from gateway.path.options import Options
from gateway.path.outliers import Rules
from gateway.records import history, refusals, usage
from guard.breaker import Config
from llmgw_core import env

ROOT = Path(__file__).resolve().parent.parent
# The settings' LLMGW_DB_CONNECT_TIMEOUT, _STATEMENT_TIMEOUT and _POOL_SIZE.
BOUNDS = {
    "connect": settings.LLMGW_DB_CONNECT_TIMEOUT,
    "statement": settings.LLMGW_DB_STATEMENT_TIMEOUT,
    "pool_size": settings.LLMGW_DB_POOL_SIZE,
}


def test_envbool_accepts_only_true_or_false(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_X", "TRUE")
    assert env.envbool("X", False) is True
    monkeypatch.setenv("LLMGW_X", "false")
    assert env.envbool("X", True) is False
    monkeypatch.setenv("LLMGW_X", "yes")
    with pytest.raises(ImproperlyConfigured, match="LLMGW_X is 'yes': write true or false"):
        env.envbool("X", False)


def test_envint_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_N", "ten")
    with pytest.raises(ImproperlyConfigured, match="LLMGW_N"):
        env.envint("N", 1)


def test_secret_from_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "s").write_text("hunter2\n")
    monkeypatch.setenv("LLMGW_S_FILE", str(tmp_path / "s"))
    assert env.envsecret("S") == "hunter2"
    monkeypatch.setenv("LLMGW_S", "other")
    with pytest.raises(ImproperlyConfigured, match="both set"):
        env.envsecret("S")


def test_secret_key_generated_once_with_private_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLMGW_SECRET_KEY", raising=False)
    first = env.secret_key(tmp_path / "data")
    assert len(first) >= 50
    assert env.secret_key(tmp_path / "data") == first
    assert (tmp_path / "data" / "secret_key").stat().st_mode & 0o777 == 0o600


def test_database_url_parsed_and_bad_scheme_refused() -> None:
    db = env.database_from_url("postgres://u:p%40ss@db.local:6543/llmgw", **BOUNDS)
    assert (db["NAME"], db["USER"], db["PASSWORD"], db["HOST"], db["PORT"]) == (
        "llmgw", "u", "p@ss", "db.local", "6543",
    )  # fmt: skip
    with pytest.raises(ImproperlyConfigured, match="mysql"):
        env.database_from_url("mysql://x/y", **BOUNDS)


def test_a_database_that_does_not_answer_a_connection_is_given_up_on() -> None:
    """A server behind a hung link: connecting fails after LLMGW_DB_CONNECT_TIMEOUT with an
    error, never waits forever (libpq's default)."""
    import psycopg

    from tests.faultproxy import fault_proxy

    with fault_proxy(("127.0.0.1", 5432)) as proxy:
        proxy.hang()
        db = env.database_from_url(
            f"postgres://postgres@127.0.0.1:{proxy.port}/postgres", **{**BOUNDS, "connect": 1}
        )
        options = {k: v for k, v in db["OPTIONS"].items() if k != "pool"}
        with pytest.raises(psycopg.OperationalError, match="timeout"):
            psycopg.connect(host="127.0.0.1", port=proxy.port, user="postgres",
                            dbname="postgres", **options)  # fmt: skip


def test_env_example_lists_every_variable_the_code_reads() -> None:
    read = set()
    for path in [*ROOT.glob("llmgw_admin/*.py"), *ROOT.glob("llmgw_core/*.py"), ROOT / "run.py"]:
        text = path.read_text()
        read |= set(re.findall(r'env(?:str|bool|int|list|secret)\("([A-Z_]+)"', text))
        read |= set(re.findall(r'"LLMGW_([A-Z_]+)"', text))
    read -= {
        "TEST_DATABASE_URL",
        "TEST_DATABASE_SERVER",
        "TEST_REDIS_URL",
        "TEST_RUN_LIMIT",
        "TEST_WORKERS",
        "CACHE",  # run.py test: where llama-server is built (docs/configuration.md)
        "LLAMA_SERVER_BUILD",  # run.py test: the build's status file, for the tests
    }
    example = {
        line.split("=", 1)[0].removeprefix("LLMGW_")
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line.startswith("LLMGW_")
    }
    documented = set(re.findall(r"`LLMGW_([A-Z_]+)`", (ROOT / "docs/configuration.md").read_text()))
    assert read - {"SECRET_KEY_FILE"} <= example, read - example
    assert example <= documented | {"SECRET_KEY_FILE"}, example - documented


def test_a_connection_whose_server_stops_answering_fails_a_statement_within_its_bound() -> None:
    """A connection open when the link hangs (its peer still acknowledging the packets, so
    TCP never gives up): the pool's check of it fails after the connect timeout, a
    statement after its bound, each with an OperationalError, never a thread held."""
    import time

    import psycopg

    from tests.faultproxy import fault_proxy

    with fault_proxy(("127.0.0.1", 5432)) as proxy:
        db = env.database_from_url(
            f"postgres://postgres@127.0.0.1:{proxy.port}/postgres",
            connect=1, statement=1, pool_size=10,
        )  # fmt: skip
        options = dict(db["OPTIONS"])
        pool = options.pop("pool")
        assert pool["timeout"] == 1 and db["CONN_HEALTH_CHECKS"] is True
        assert options["options"] == "-c statement_timeout=1000"
        kind = pool["connection_class"]
        conns = [kind.connect(host="127.0.0.1", port=proxy.port, user="postgres",
                              dbname="postgres", autocommit=True, **options)
                 for _ in range(2)]  # fmt: skip
        assert conns[0].execute("select 1").fetchone() == (1,)
        proxy.hang()
        for conn, query, bound in ((conns[0], "", 1), (conns[1], "select 1", 2)):
            started = time.monotonic()
            with pytest.raises(psycopg.OperationalError):
                conn.execute(query)
            assert time.monotonic() - started < bound + 3
            conn.close()


def test_only_errors_saying_the_database_is_away_are_answered_503() -> None:
    import psycopg
    from django.db import OperationalError, ProgrammingError

    from llmgw_admin.dbdown import is_database_down

    def wrapped(cause: BaseException, outer: type[Exception]) -> Exception:
        try:
            try:
                raise cause
            except Exception as e:
                raise outer(str(e)) from e
        except Exception as e:  # noqa: BLE001 - the chain is what is judged
            return e

    assert is_database_down(wrapped(psycopg.OperationalError("timeout expired"), OperationalError))
    assert is_database_down(psycopg.OperationalError("server closed the connection"))
    # SQLite's own (the embedded mode), a missing table, anything else: not this.
    import sqlite3

    assert not is_database_down(wrapped(sqlite3.OperationalError("no such table"),
                                        OperationalError))  # fmt: skip
    assert not is_database_down(wrapped(psycopg.ProgrammingError("x"), ProgrammingError))
    assert not is_database_down(ValueError("x"))
    assert not is_database_down(None)


# Where an LLMGW_* variable may be read with a default of its own outside settings.py, and
# why. The agent is a program of its own on each node (no Django, its own variables, read
# in agent/); run.py starts before Django can be imported (its defaults are held equal to
# the settings' below; its LLMGW_TEST_* are the test run's own).
OWN_READERS = ("agent/", "bench/", "scripts/", "tests/", "run.py", "llmgw_admin/settings.py")


def _reads_with_default(tree: ast.AST) -> list[tuple[int, str]]:
    """The LLMGW_* reads in ``tree`` that carry a default: ``getattr(settings, "LLMGW_X",
    d)``, ``os.environ.get("LLMGW_X", d)``, ``os.getenv("LLMGW_X", d)``, ``envint("X", d)``
    and its kind."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or len(node.args) < 2:
            continue
        name = ast.unparse(node.func)
        first = node.args[0] if name != "getattr" else node.args[1]
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            continue
        defaulted = name.endswith(("environ.get", "getenv")) or (
            name == "getattr" and len(node.args) == 3
        )
        if name.startswith("env") and name[3:] in ("str", "bool", "int", "list"):
            found.append((node.lineno, "LLMGW_" + first.value))
        elif defaulted and first.value.startswith("LLMGW_"):
            found.append((node.lineno, first.value))
    return found


def test_every_llmgw_default_is_written_in_settings() -> None:
    """A variable's default is written once, in settings.py; code reads ``settings.X``."""
    elsewhere = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith((".venv/", "var/")) or "/migrations/" in rel:
            continue
        if rel.startswith(OWN_READERS):
            continue
        if rel == "llmgw_core/env.py":
            continue  # the readers themselves
        elsewhere += [f"{rel}:{line} {var}" for line, var in _reads_with_default(
            ast.parse(path.read_text()))]  # fmt: skip
    assert elsewhere == [], elsewhere


def test_the_probe_finds_a_default_written_outside_settings() -> None:
    tree = ast.parse(
        'getattr(settings, "LLMGW_X", 5)\nos.environ.get("LLMGW_Y", "1")\nenvint("Z", 3)\n'
        "settings.LLMGW_W\n"
    )
    assert _reads_with_default(tree) == [(1, "LLMGW_X"), (2, "LLMGW_Y"), (3, "LLMGW_Z")]


def test_run_py_serves_where_the_settings_say() -> None:
    """run.py (no Django yet) writes LLMGW_BIND's and LLMGW_PORT's defaults again: the same."""
    run = {
        node.args[0].value: node.args[1].value
        for node in ast.walk(ast.parse((ROOT / "run.py").read_text()))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "env.get"
        and len(node.args) == 2 and node.args[0].value in ("LLMGW_BIND", "LLMGW_PORT")
    }  # fmt: skip
    assert run == {"LLMGW_BIND": settings.LLMGW_BIND, "LLMGW_PORT": str(settings.LLMGW_PORT)}


def _written_defaults() -> dict[str, Any]:
    """Each ``LLMGW_*`` default as settings.py writes it, whatever this run's environment
    says: ``envint("X", d)`` (and its kinds) gives ``LLMGW_X: d`` (where ``d`` is a value,
    not another setting's name)."""
    found = {}
    for node in ast.walk(ast.parse((ROOT / "llmgw_admin" / "settings.py").read_text())):
        if (isinstance(node, ast.Call) and len(node.args) == 2
                and ast.unparse(node.func) in ("envint", "envstr", "envbool", "envlist")):  # fmt: skip
            with contextlib.suppress(NameError):  # a default read from another setting
                found["LLMGW_" + node.args[0].value] = eval(ast.unparse(node.args[1]), {})
    return found


def test_the_defaults_parts_keep_are_the_settings_own() -> None:
    """The gateway's parts keep defaults of their own (tests and benchmarks build them
    without the settings): each is the one settings.py writes, so a default changed in
    one place and not the other fails here. Built from the written defaults with the
    parts' own ``from_settings``, each equals the part built with its defaults. (The
    guard's breaker ``Config`` keeps none: the settings' are its only ones.)"""
    written = _written_defaults()
    given = SimpleNamespace(**written, TIME_ZONE=written["LLMGW_TIMEZONE"])
    assert Options.from_settings(given) == Options()
    assert Rules.from_settings(given) == Rules()
    admission, alone = Admission.from_settings(given), Admission()
    assert (admission.window, admission.queue, admission.queue_max, admission.margin) == (
        alone.window, alone.queue, alone.queue_max, alone.margin)  # fmt: skip
    sessions, alone_ = Sessions.from_settings(given), Sessions()
    assert (sessions.size, sessions.age, sessions.skew) == (alone_.size, alone_.age, alone_.skew)
    assert {f.name for f in dataclasses.fields(Config) if f.default is dataclasses.MISSING} == {
        "failures", "backoff", "max_backoff"}  # fmt: skip
    # The guard's windows on a stream (Options hands the settings' to each Holdback) and
    # the records' flush (the servers set the settings' when they start the recorders).
    window = (written["LLMGW_GUARD_WINDOW_TOKENS"], written["LLMGW_GUARD_WINDOW_MS"])
    assert window == (holdback.TOKENS, holdback.INTERVAL * 1000)
    flush = written["LLMGW_GATEWAY_USAGE_FLUSH_MS"] / 1000
    history_interval = inspect.signature(history.HistoryRecorder).parameters["interval"]
    assert usage.FLUSH_INTERVAL == refusals.FLUSH_INTERVAL == history_interval.default == flush


def test_a_default_that_drifts_from_the_settings_is_found() -> None:
    written = _written_defaults()
    assert written["LLMGW_GATEWAY_MAX_BODY"] == 16 << 20  # an expression, evaluated
    assert written["LLMGW_SESSION_SKEW"] == "2"  # a string, as the environment gives it
    drifted = SimpleNamespace(**{**written, "LLMGW_GATEWAY_EJECT_AFTER": 6})
    assert Rules.from_settings(drifted) != Rules()
