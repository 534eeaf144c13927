"""The node agent's command, ``llmgw-agent``: join, heartbeat, converge, report.

No Django here. The loop, each heartbeat interval:

1. Join with the join token when the state folder holds no node token.
2. Heartbeat with the inventory.
3. Read the whole desired list when its version changed (and every few heartbeats
   regardless) and hand it to the supervisor, which converges the engines to it.
4. Send the reports of every state change since (queued while the control plane is
   away, and sent as soon as one is queued while it is there).

A control plane that cannot be reached changes nothing on the node: the engines keep
running, the agent retries with a growing wait. SIGTERM stops the agent and leaves the
engines running (``--stop-engines-on-exit`` stops them too); the next agent adopts them.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent import discovery, simcards, weights
from agent.client import ControlPlane, ControlPlaneError, Unauthorized, Unreachable
from agent.mirror import MirrorClient
from agent.mirror import enabled as mirror_enabled
from agent.supervisor import Supervisor

log = logging.getLogger("agent")

# The desired list is read every this many heartbeats even when its version is the
# same: a version bump lost on the way must not leave the node behind for long.
RELOAD_EVERY = 6
# While the control plane cannot be reached the agent retries with a growing wait, but
# never longer than this many heartbeat intervals: a control plane that comes back hears
# from every node within them, well inside LLMGW_NODE_LOST_AFTER (30 s against 5 s by
# default), and counts no node's silence from before it was back (cluster.silence).
MAX_RETRY_INTERVALS = 3
MAX_RETRY_S = 60.0
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Return a Go-style duration ("5s", "500ms", "1m30s") in seconds.

    Raises:
        ValueError: not a duration; a bare number is refused, as the catalog refuses it.
    """
    text = text.strip()
    if not text or _DURATION.sub("", text):
        raise ValueError(f'"{text}" is not a duration: write a unit, as in "5s" or "500ms"')
    seconds = sum(float(n) * _UNITS[u] for n, u in _DURATION.findall(text))
    if seconds <= 0:
        raise ValueError(f'"{text}" is not a positive duration')
    return seconds


def parse_labels(text: str) -> dict[str, str]:
    """Return the labels in "k=v,k=v".

    Raises:
        ValueError: an entry has no "=" or no key.
    """
    labels: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f'label "{part}" is not key=value')
        labels[key.strip()] = value.strip()
    return labels


def retry_wait(interval: float, failures: int) -> float:
    """Return how long to wait before the next try after ``failures`` failed ones in a row.

    Doubling from one interval, up to ``MAX_RETRY_INTERVALS`` intervals (and MAX_RETRY_S).
    """
    grown = interval * 2 ** min(max(failures, 1) - 1, 10)
    return min(grown, interval * MAX_RETRY_INTERVALS, max(MAX_RETRY_S, interval))


def build_parser() -> argparse.ArgumentParser:
    """Return the command line parser."""
    parser = argparse.ArgumentParser(
        prog="llmgw-agent",
        description="Run this node's inference engines as the llmgw control plane wants them.",
    )
    parser.add_argument("--server", required=True, help="the control plane's URL")
    parser.add_argument(
        "--join-token",
        default=os.environ.get("LLMGW_JOIN_TOKEN", ""),
        help="join token (llmgw_join_…), used when the state folder holds no node token "
        "(default: env LLMGW_JOIN_TOKEN)",
    )
    parser.add_argument("--name", default=discovery.hostname(), help="this node's name")
    parser.add_argument(
        "--state-dir", default="/var/lib/llmgw-agent", help="node token, engine records, logs"
    )
    parser.add_argument(
        "--weights-dir", default="", help="where downloaded weights go (default: STATE_DIR/weights)"
    )
    parser.add_argument(
        "--weights-folder",
        action="append",
        default=[],
        metavar="FOLDER",
        help="a folder local weights sources may be in, besides the weights folder; repeat "
        "for more (a source anywhere else is refused)",
    )
    parser.add_argument(
        "--weights-hosts",
        default=os.environ.get("LLMGW_WEIGHTS_HOSTS", ",".join(weights.DEFAULT_HOSTS)),
        help="the origins URL sources may name, as scheme://host[:port], comma-separated; "
        "add a mirror's here (default: env LLMGW_WEIGHTS_HOSTS, else %(default)s)",
    )
    parser.add_argument(
        "--labels", default="", type=_labels, help='labels, as "llmgw.io/rack=r12,k=v"'
    )
    parser.add_argument(
        "--simulate",
        default="",
        help='advertise simulated cards instead of discovering real ones, as "2x nvidia-h100-80gb"; '
        "only sim engines run on them",
    )
    parser.add_argument(
        "--heartbeat", default="5s", type=_duration, help="heartbeat interval (default 5s)"
    )
    parser.add_argument(
        "--llama-server",
        default="",
        help="the llama-server binary (default: PATH, then the build cache)",
    )
    parser.add_argument(
        "--engine-host",
        default="127.0.0.1",
        help="the address engines listen on (default 127.0.0.1; the gateway must reach it)",
    )
    parser.add_argument(
        "--advertise-address",
        default="",
        help="the address other nodes reach this one at, for multi-node replicas (default: the host name)",
    )
    parser.add_argument(
        "--grace", default="10s", type=_duration, help="SIGTERM to SIGKILL when stopping an engine"
    )
    parser.add_argument(
        "--stop-engines-on-exit",
        action="store_true",
        help="stop the engines when the agent stops (by default they keep running for the next agent)",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING")
    return parser


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _labels(text: str) -> dict[str, str]:
    try:
        return parse_labels(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


class Agent:
    """Run the agent's loop, stoppable from another thread (tests) or a signal."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.state_dir = Path(args.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.weights_dir = (
            Path(args.weights_dir) if args.weights_dir else self.state_dir / "weights"
        )
        self.interval = float(args.heartbeat)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.simulated = bool(args.simulate)
        # The last desired list read: which cards each replica holds (cards_use).
        self.desired: list[dict[str, Any]] = []
        if self.simulated:
            self.cards = discovery.parse_simulate(args.simulate)
            devices: dict[int, str] = {}
        else:
            self.cards = discovery.discover_cards()
            devices = discovery.device_names(self.cards)
        self.engines, binaries = discovery.discover_engines(args.llama_server or None)
        if args.llama_server and binaries["llama-server"] != args.llama_server:
            log.warning(
                "--llama-server %s is not an executable file; not using it", args.llama_server
            )
        self.control = ControlPlane(args.server, self.state_dir)
        self.weights_folders = [str(Path(f).expanduser()) for f in args.weights_folder]
        self.weights_hosts = [h.strip() for h in args.weights_hosts.split(",") if h.strip()]
        self.supervisor = Supervisor(
            self.state_dir,
            weights_dir=self.weights_dir,
            weights_folders=self.weights_folders,
            weights_hosts=self.weights_hosts,
            report=self._queue,
            binaries=binaries,
            engines=self.engines,
            host=args.engine_host,
            node_address=args.advertise_address or discovery.hostname(),
            devices=devices,
            simulated=self.simulated,
            grace_s=float(args.grace),
            # The control plane's weights mirror, unless this node's LLMGW_MIRROR=off.
            mirror=(
                MirrorClient(args.server, lambda: self.control.token, self.weights_dir)
                if mirror_enabled()
                else None
            ),
        )

    def stop(self) -> None:
        """Ask the loop to end (safe from a signal handler or another thread)."""
        self._stop.set()
        self._wake.set()

    def _queue(self, report: dict[str, Any]) -> None:
        self.control.queue_report(report)
        self._wake.set()

    def cards_use(self) -> list[dict[str, Any]]:
        """Return what each card uses now: nvidia-smi's figures, or a simulated node's
        derived from its replicas (agent.simcards)."""
        if not self.simulated:
            return discovery.discover_use(self.cards)
        states = self.supervisor.states()
        replicas = []
        for spec in self.desired:
            report = states.get(spec.get("id"))
            if report is None:
                continue
            ready = report["state"] == "ready"
            replicas.append(
                {
                    "cards": spec.get("cards") or [],
                    "state": report["state"],
                    "progress": report["progress"],
                    "load": simcards.engine_load(report["port"]) if ready else None,
                }
            )
        return simcards.card_figures(self.cards, replicas)

    def inventory(self) -> dict[str, Any]:
        """Return the node's inventory as it is now."""
        inv = discovery.inventory(
            cards_use=self.cards_use(),
            cards=self.cards,
            engines=self.engines,
            labels=self.args.labels,
            weights_dir=self.weights_dir,
            weights=weights.held_sources(self.weights_dir) + self.supervisor.sources(),
            simulated=self.simulated,
        )
        # Where this node takes weights from: local sources elsewhere, and URLs of other
        # origins, are refused (docs/agent-protocol.md).
        inv["weights_folders"] = [str(f) for f in self.supervisor.weights_folders]
        inv["weights_hosts"] = sorted(weights.allowed_origins(self.weights_hosts))
        return inv

    def run(self) -> int:
        """Run until stopped; return the exit code."""
        log.info(
            "agent %s for node %s: %d card(s)%s, engines %s",
            discovery.AGENT_VERSION,
            self.args.name,
            len(self.cards),
            " (simulated)" if self.simulated else "",
            ", ".join(f"{k} {v}" for k, v in sorted(self.engines.items())),
        )
        self.supervisor.start()
        code = 0
        try:
            code = self._loop()
        finally:
            self.supervisor.stop_ticking()
            if self.args.stop_engines_on_exit:
                self.supervisor.stop_all()
            self.supervisor.close()
            try:
                self.control.flush_reports()
            except ControlPlaneError as exc:
                log.info("reports not sent before exit: %s", exc)
            self.control.close()
        return code

    def _loop(self) -> int:
        last_version: Any = None
        beats = 0
        failures = 0
        reachable = False
        next_beat = 0.0
        while not self._stop.is_set():
            if time.monotonic() >= next_beat:
                try:
                    if self.control.token is None:
                        self._join()
                    answer = self.control.heartbeat(self.inventory())
                    beats += 1
                    version = answer.get("desired_version")
                    if version != last_version or beats >= RELOAD_EVERY:
                        desired = self.control.desired()
                        self.supervisor.converge(desired["replicas"])
                        self.desired = list(desired["replicas"])
                        last_version = desired.get("version", version)
                        beats = 0
                    self.control.flush_reports()
                    if failures:
                        log.info("control plane reachable again")
                    failures = 0
                    reachable = True
                    next_beat = time.monotonic() + self.interval
                except Unreachable as exc:
                    failures += 1
                    reachable = False
                    wait = retry_wait(self.interval, failures)
                    log.warning(
                        "control plane unreachable (%s); engines keep running; retrying in %.0f s",
                        exc,
                        wait,
                    )
                    next_beat = time.monotonic() + wait
                except Unauthorized as exc:
                    if not self.args.join_token:
                        log.error(
                            "node token refused (%s) and no join token to join again: stopping", exc
                        )
                        return 2
                    log.warning("node token refused (%s): joining again", exc)
                    self.control.forget_token()
                    next_beat = time.monotonic() + min(self.interval, 5.0)
                except _JoinImpossible as exc:
                    log.error("%s", exc)
                    return 2
                except ControlPlaneError as exc:
                    failures += 1
                    wait = retry_wait(self.interval, failures)
                    log.warning("control plane call failed (%s); retrying in %.0f s", exc, wait)
                    next_beat = time.monotonic() + wait
            elif reachable and self.control.pending():
                try:
                    self.control.flush_reports()
                except ControlPlaneError as exc:
                    # Sent again with the next heartbeat.
                    reachable = False
                    log.warning("reports not sent (%s); will retry", exc)
            self._wake.wait(max(0.0, next_beat - time.monotonic()))
            self._wake.clear()
        return 0

    def _join(self) -> None:
        if not self.args.join_token:
            raise _JoinImpossible(
                f"no node token in {self.state_dir} and no join token: pass --join-token "
                "or set LLMGW_JOIN_TOKEN"
            )
        try:
            self.control.join(self.args.join_token, self.args.name, self.inventory())
        except Unauthorized as exc:
            raise _JoinImpossible(f"the control plane refused the join token: {exc}") from exc
        log.info("joined as %s", self.args.name)


class _JoinImpossible(Exception):
    """Stop: the node cannot join (no join token, or a refused one)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``llmgw-agent``; return the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Health polls every fraction of a second would drown the log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        agent = Agent(args)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: agent.stop())
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
