"""Talk to the control plane: join, heartbeat, desired list, reports. No Django here.

The calls are docs/agent-protocol.md's. Reports are queued and sent in batches; while
the control plane cannot be reached they wait, only the latest per replica kept (its
state now is what the control plane needs), and are never dropped, except one the
control plane refuses as not this node's (403): the replica was moved, and no retry
will change that.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import httpx

from agent import state

log = logging.getLogger(__name__)

API = "/api/v1/agent"


class ControlPlaneError(Exception):
    """Fail a call to the control plane."""


class Unreachable(ControlPlaneError):
    """Fail to reach the control plane, or find it failing (5xx): try again later."""


class Unauthorized(ControlPlaneError):
    """Be refused for the token sent (401).

    The node token was replaced or revoked, or the join token is bad, expired or used up.
    """


class RequestRefused(ControlPlaneError):
    """Be refused for what was asked (another 4xx)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status


class ControlPlane:
    """Call the agent API, keeping the node token in the state folder."""

    def __init__(
        self,
        server: str,
        state_dir: str | os.PathLike[str],
        *,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        self.state_dir = Path(state_dir)
        self._http = httpx.Client(
            base_url=self.server,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0)),
            transport=transport,
            headers={"User-Agent": "llmgw-agent"},
        )
        self._token = state.load_token(self.state_dir)
        self._pending: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        # Serialises flushes: the agent's loop and a final flush at exit.
        self._flush_lock = threading.Lock()

    @property
    def token(self) -> str | None:
        """Return the node token, or None before the node has joined."""
        return self._token

    def forget_token(self) -> None:
        """Drop a node token the control plane no longer accepts, to join again."""
        self._token = None
        (self.state_dir / state.TOKEN_FILE).unlink(missing_ok=True)

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def join(self, join_token: str, name: str, inventory: dict[str, Any]) -> str:
        """Join the cluster as ``name`` and keep the node token it answers with."""
        body = self._call(
            "POST",
            "/join",
            {"token": join_token, "name": name, "inventory": inventory},
            auth=False,
        )
        token = str(body.get("node_token") or "")
        if not token:
            raise ControlPlaneError("the control plane answered the join without a node token")
        state.save_token(self.state_dir, token)
        self._token = token
        return token

    def heartbeat(self, inventory: dict[str, Any]) -> dict[str, Any]:
        """Send the inventory; return the node's state and the desired list's version."""
        return self._call("POST", "/heartbeat", {"inventory": inventory})

    def desired(self) -> dict[str, Any]:
        """Return this node's whole desired list: ``{"version": …, "replicas": […]}``."""
        body = self._call("GET", "/desired")
        if not isinstance(body.get("replicas"), list):
            raise ControlPlaneError("the desired list has no replicas list")
        return body

    def queue_report(self, report: dict[str, Any]) -> None:
        """Queue a report, replacing one still waiting for the same replica."""
        with self._lock:
            self._pending.pop(int(report["replica"]), None)
            self._pending[int(report["replica"])] = dict(report)

    def pending(self) -> list[dict[str, Any]]:
        """Return the reports waiting to be sent."""
        with self._lock:
            return list(self._pending.values())

    def flush_reports(self) -> int:
        """Send the waiting reports; return how many the control plane accepted.

        Raises:
            Unreachable: the control plane cannot be reached; the reports wait.
            Unauthorized: the node token was refused; the reports wait.
        """
        with self._flush_lock:
            with self._lock:
                batch = list(self._pending.values())
            if not batch:
                return 0
            try:
                self._call("POST", "/report", {"reports": batch})
            except RequestRefused as exc:
                if exc.status != 403:
                    raise
                # One report in the batch is for a replica no longer this node's, and
                # the control plane applies none of a refused batch: send them singly.
                return self._send_singly(batch)
            self._sent(batch)
            return len(batch)

    def _send_singly(self, batch: list[dict[str, Any]]) -> int:
        accepted = 0
        for report in batch:
            try:
                self._call("POST", "/report", {"reports": [report]})
            except RequestRefused as exc:
                if exc.status != 403:
                    raise
                log.warning(
                    "report for replica %s refused as not this node's: %s",
                    report["replica"],
                    exc,
                )
            else:
                accepted += 1
            self._sent([report])
        return accepted

    def _sent(self, batch: list[dict[str, Any]]) -> None:
        """Drop sent reports from the queue, unless a newer one came in meanwhile."""
        with self._lock:
            for report in batch:
                rid = int(report["replica"])
                if self._pending.get(rid) == report:
                    del self._pending[rid]

    def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, auth: bool = True
    ) -> dict[str, Any]:
        headers = {}
        if auth:
            if not self._token:
                raise Unauthorized("this node has not joined: no node token")
            headers["Authorization"] = f"Bearer {self._token}"
        try:
            response = self._http.request(method, API + path, json=body, headers=headers)
        except httpx.TransportError as exc:
            raise Unreachable(f"{self.server}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise Unreachable(f"{self.server}{API}{path} answered HTTP {response.status_code}")
        try:
            data = response.json()
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        detail = str(data.get("detail") or response.reason_phrase)
        if response.status_code == 401:
            raise Unauthorized(detail)
        if response.status_code >= 400:
            raise RequestRefused(response.status_code, detail)
        return data
