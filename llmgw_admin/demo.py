"""The first start's simulated cluster: simulated nodes beside the web process, a demo catalog.

``LLMGW_SIMULATE`` (docs/configuration.md) names the simulated nodes' cards, one list per
node in the agent's ``--simulate`` form, ``;`` between nodes; ``off`` runs none. On the
embedded default it is two nodes of two L4s and one H100, so a new install shows
placement, health and the guard at work with no card and no weights (settings.py's
``SIMULATE_EMBEDDED``):

- ``parse_simulate`` reads the setting (plain data, no Django: settings.py calls it).
- ``demo_models`` is the demo catalog for the simulated GPU classes (plain data).
- ``install`` is ``init``'s part: the demo models and a sim judge, once, on an install
  nobody but ``init`` has changed (the change log remembers that it was done).
- ``start_agents`` is ``serve``'s part: one agent per simulated node, each in a thread of
  the web process, joined with a node token of its own through the agent protocol.

Used by ``init``, ``serve``, the settings and the simulated-cluster banner.
"""

from __future__ import annotations

import atexit
import logging
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from django.db import transaction

from agent import discovery
from catalog.choices import Surface
from catalog.durations import parse_duration
from catalog.spec import Model, Profile, ScaleWindow, Scaling
from guard import known
from guard import policy as policy_rules

OFF = ("off", "false")
# Each in-process agent is a few threads in the web process: more is a real cluster's job.
MAX_NODES = 8
NODE_PREFIX = "sim-"

# Seconds a demo sim engine answers /health with 503 before it is ready, so the console
# shows the replica loading (the sim engine's --load-time).
LOAD_TIME_S = 5
# Who the change log says made the demo's changes; init finds them there next time.
ACTOR = "init (demo)"
INIT_ACTOR = "init"
CHAT = "demo-chat"
ON_DEMAND = "demo-coder"
SIM_JUDGE = "qwen3guard-0.6b-sim"


@dataclass(frozen=True)
class SimNode:
    """One simulated node: its name and its cards as the agent's ``--simulate`` takes them."""

    name: str
    cards: str


def parse_simulate(text: str) -> list[SimNode]:
    """Return the simulated nodes a ``LLMGW_SIMULATE`` value names; none for ``off``.

    Raises:
        ValueError: a node's cards are not ``N x class`` entries, or there are more than
            ``MAX_NODES`` nodes. The message names the node and the form to write.
    """
    value = text.strip()
    if value.lower() in OFF:
        return []
    parts = [p.strip() for p in value.split(";")]
    if not any(parts):
        raise ValueError('names no node: write "off", or cards as "2x nvidia-l4-24gb"')
    nodes: list[SimNode] = []
    for part in parts:
        if not part:
            continue
        where = f"node {len(nodes) + 1}"
        try:
            discovery.parse_simulate(part)
        except ValueError as exc:
            why = str(exc).removeprefix("--simulate: ")
            raise ValueError(
                f'{where} ("{part}"): {why}; write "off", or each node\'s cards as '
                '"2x nvidia-l4-24gb,1x nvidia-h100-80gb" with ";" between nodes'
            ) from None
        nodes.append(SimNode(f"{NODE_PREFIX}{len(nodes) + 1}", part))
    if len(nodes) > MAX_NODES:
        raise ValueError(
            f"names {len(nodes)} nodes; at most {MAX_NODES} run inside the web process: run "
            'more as agents of their own ("python -m agent --simulate ...")'
        )
    return nodes


def gpu_classes(nodes: Sequence[SimNode]) -> dict[str, int]:
    """Return each simulated GPU class with its memory in MiB."""
    classes: dict[str, int] = {}
    for node in nodes:
        for card in discovery.parse_simulate(node.cards):
            classes[card["class"]] = max(classes.get(card["class"], 0), card["memory_mb"])
    return classes


def demo_models(classes: dict[str, int]) -> list[Any]:
    """Return the demo catalog for these GPU classes (name to MiB): three sim models.

    - ``demo-chat``: always one replica on the smallest class, two on weekdays 08:00 to
      18:00 (a schedule);
    - ``demo-coder``: on demand on the roomiest class, stopped after 10 minutes idle;
    - ``qwen3guard-0.6b-sim``: the baseline judge's format on the sim engine (a judge
      that needs no weights), on the roomiest class, as ``guard judge enable --sim``
      serves one.

    Each sim engine loads for ``LOAD_TIME_S`` seconds. Plain ``catalog.spec`` models.

    Raises:
        ValueError: no class is given.
    """
    if not classes:
        raise ValueError("the simulated nodes have no GPU class")
    roomiest = known.roomiest_class(classes)
    smallest = min(classes, key=lambda c: (classes[c], c))
    load = ["--load-time", str(LOAD_TIME_S)]

    def profile(gpu_class: str) -> Profile:
        return Profile(
            name="sim", engine="sim", gpu_class=gpu_class, gpus_per_node=1, args=list(load)
        )

    chat = Model(
        name=CHAT,
        description="Demo chat model on simulated cards: the sim engine writes synthetic text",
        source=f"sim/{CHAT}",
        profiles=[profile(smallest)],
        scaling=Scaling(
            min=1,
            max=2,
            schedule=[ScaleWindow(days=["weekdays"], from_="08:00", to="18:00", min=2, max=2)],
        ),
        context_length=8192,
    )
    coder = Model(
        name=ON_DEMAND,
        description="Demo on-demand model on simulated cards: started when asked for",
        source=f"sim/{ON_DEMAND}",
        profiles=[profile(roomiest)],
        scaling=Scaling(min=0, max=1, idle_timeout=parse_duration("10m")),
        context_length=16384,
    )
    judge = known.enable_spec(known.DEFAULT_CPU_JUDGE, sim=True, gpu_classes=classes)
    judge.name = SIM_JUDGE
    judge.description = (
        "Demo judge on the sim engine, in Qwen3Guard's format: unsafe exactly when the text "
        "holds UNSAFE-MARKER (no weights, no real judgement)"
    )
    judge.profiles[0].args = list(load)
    return [chat, coder, judge]


def untouched() -> bool:
    """Return whether nobody but ``init`` ever changed the catalog or the guard policy.

    Read from the change logs, which keep deletions too: a demo model an operator deleted
    leaves a record by the operator, so the demo is never added again.
    """
    # Imported here: settings.py imports this module, before the apps load models.
    from catalog.models import ChangeRecord  # noqa: PLC0415
    from guard.models import PolicyChange  # noqa: PLC0415

    return not (
        ChangeRecord.objects.exclude(actor_name=INIT_ACTOR).exists()
        or PolicyChange.objects.exclude(actor_name=INIT_ACTOR).exists()
    )


def install(nodes: Sequence[SimNode]) -> list[str]:
    """Add the demo catalog and put the sim judge in the policy; return what was done.

    Called by ``init`` only when ``untouched()``, after the baseline judge and policy.
    The sim judge goes after the policy's judges: the chain asks the real judge first
    and the sim judge answers while the real one has no ready replica (downloading, no
    llama-server, or an air-gapped machine). One transaction: all or nothing.

    Raises:
        catalog.services.Refused: the catalog's rules refuse a demo model.
        guard.services.PolicyRefused: the policy's rules refuse the new judge order.
    """
    # Imported here: they import models, and settings.py imports this module before the
    # apps load them.
    from catalog.services import Actor, save_model  # noqa: PLC0415
    from guard import services as guard_services  # noqa: PLC0415

    actor = Actor(user=None, surface=Surface.CLI, name=ACTOR)
    models = demo_models(gpu_classes(nodes))
    with transaction.atomic():
        for m in models:
            save_model(m, actor)
        policy = guard_services.current_policy()
        if SIM_JUDGE not in policy.judge_models:
            new = replace(policy, judge_models=(*policy.judge_models, SIM_JUDGE))
            guard_services.set_policy(policy_rules.to_data(new), surface=Surface.CLI, name=ACTOR)
    return [
        f"init: demo models {', '.join(m.name for m in models)} added for the simulated "
        f"nodes {', '.join(n.name for n in nodes)}",
        f"init: the guard asks {' then '.join((*policy.judge_models, SIM_JUDGE))}"
        if SIM_JUDGE not in policy.judge_models
        else f"init: the guard already asks {SIM_JUDGE}",
    ]


def start_agents(nodes: Sequence[SimNode], host: str, port: int, data_dir: Path) -> list[str]:
    """Start one agent per simulated node in threads of this process; return their names.

    ``host`` and ``port`` are where this process serves the agent protocol.

    Each node keeps its node token in ``<data>/simulated/<name>``; a node with none joins
    with a one-use join token made for it. Their log goes to ``<data>/simulated.log``.
    Their engines stop when this process exits (``atexit``), as the local agent's do.
    """
    # Imported here: settings.py imports this module, before the apps load models; and the
    # agent's program (0.2 s to import, measured on a loaded machine) is for simulated
    # nodes alone, not for every process that reads the settings.
    from agent.main import Agent, build_parser  # noqa: PLC0415
    from cluster import agentjoin  # noqa: PLC0415
    from cluster.models import JoinToken  # noqa: PLC0415

    server = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    _log_to(data_dir / "simulated.log")
    started = []
    for node in nodes:
        state = data_dir / "simulated" / node.name
        join = ""
        if not (state / "node_token").exists():
            _, join = JoinToken.issue(f"simulated node {node.name}", max_uses=1)
            # Its state folder was removed: the node of that name is this one's to take.
            agentjoin.reclaim(node.name, "serve (simulated nodes)")
        args = build_parser().parse_args(
            [
                "--server", server, "--name", node.name, "--state-dir", str(state),
                "--simulate", node.cards, "--join-token", join, "--stop-engines-on-exit",
            ]
        )  # fmt: skip
        agent = Agent(args)
        thread = threading.Thread(
            target=_run, args=(agent, host, port), name=f"agent {node.name}", daemon=True
        )
        thread.start()
        atexit.register(_stop, agent, thread)
        started.append(node.name)
    return started


def _log_to(path: Path) -> None:
    """Send the agents' log to a file of its own, as the local agent's goes to agent.log."""
    logger = logging.getLogger("agent")
    if any(getattr(h, "baseFilename", None) == str(path) for h in logger.handlers):
        return
    handler = logging.FileHandler(path)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s")
    )
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    # The agents call this process's API every few seconds; httpx logs each call at INFO.
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _run(agent: Any, host: str, port: int) -> None:
    """Run an agent once the web server takes connections (it starts just after)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    agent.run()


def _stop(agent: Any, thread: threading.Thread) -> None:
    agent.stop()
    # The agent stops its engines on the way out (SIGTERM, then SIGKILL after its grace).
    thread.join(timeout=30)
