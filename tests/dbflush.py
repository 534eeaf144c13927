"""The tables emptied after a transactional test by ``DELETE``, not ``TRUNCATE``.

pytest-django empties every table after each transactional test (``transactional_db``,
``live_server``, every end-to-end and browser test: 421 of the suite's tests), with
Django's ``flush``, which on PostgreSQL is one ``TRUNCATE`` of all the tables. A
``TRUNCATE`` makes each table's files anew: on a loaded 2-core machine it took 2.2 to 2.8 s
for the 46 tables, where ``DELETE`` of their few rows took 0.07 to 0.12 s. The tables come
out as empty either way; Django's foreign keys are ``DEFERRABLE INITIALLY DEFERRED``, so
with the constraints deferred the order of the deletes does not matter (they are checked
at the flush's commit), and there are no triggers. A flush asked to reset sequences or to
cascade (``reset_sequences``, ``available_apps``) stays Django's own.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql.operations import DatabaseOperations

_truncate = DatabaseOperations.sql_flush


def _delete(
    self: DatabaseOperations,
    style: Any,
    tables: list[str],
    *,
    reset_sequences: bool = False,
    allow_cascade: bool = False,
) -> list[str]:
    if not tables or reset_sequences or allow_cascade:
        return _truncate(
            self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
        )
    deletes = [f"{style.SQL_KEYWORD('DELETE FROM')} {style.SQL_FIELD(self.quote_name(t))};"
               for t in tables]  # fmt: skip
    return ["SET CONSTRAINTS ALL DEFERRED;", *deletes]


def by_delete() -> None:
    """Make Django's flush of PostgreSQL delete the rows (the tests' process only)."""
    DatabaseOperations.sql_flush = _delete  # type: ignore[method-assign]
