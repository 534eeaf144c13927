"""Every wait on PostgreSQL bounded, on the client's side: a connection that stops
answering (a hung server, a link that swallows packets while its peer still acknowledges
them) fails a statement with ``psycopg.OperationalError`` after a bound, never holds a
thread for ever. libpq bounds only the connect (``connect_timeout``); once connected, a
query waits for its answer as long as it takes, and TCP keepalives never fire while
something still acknowledges the packets.

``bounded(check_s, statement_s)`` makes the connection class the pool makes its
connections of (``llmgw_core.env.database_from_url``): the pool's check of a connection it
hands out (``ConnectionPool.check_connection``: an empty query, Django's
``CONN_HEALTH_CHECKS``) waits at most ``check_s`` (the connect timeout: a server that
answers answers that at once), any other statement ``statement_s`` (the server's own
``statement_timeout`` ends a slow one first, with a clean error, when it still answers).
A connection given up on is left mid-protocol; the pool throws it away when it comes back.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.connection import _WAIT_INTERVAL  # noqa: PLC2701 - the default it keeps


class BoundedConnection(psycopg.Connection[Any]):
    """A connection whose every wait on the server is bounded (see the module)."""

    check_s: float = 5.0
    statement_s: float = 35.0
    _checking: bool = False

    def wait(self, gen: Any, interval: float = _WAIT_INTERVAL, timeout: float | None = None) -> Any:
        if timeout is None:
            timeout = self.check_s if self._checking else self.statement_s
        return super().wait(gen, interval, timeout)

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        if query != "":
            return super().execute(query, params, **kwargs)
        # The pool's check of a connection before handing it out: short.
        self._checking = True
        try:
            return super().execute(query, params, **kwargs)
        finally:
            self._checking = False


def bounded(check_s: float, statement_s: float) -> type[BoundedConnection]:
    """The connection class with these bounds, in seconds."""
    return type("BoundedConnection", (BoundedConnection,),
                {"check_s": float(check_s), "statement_s": float(statement_s)})  # fmt: skip
