"""The update flow's part of ``manage.py catalog update`` (the command's plumbing calls it).

    manage.py catalog update start MODEL [--revision REV] [--auto] [--canary PERCENT] [--wait]
    manage.py catalog update promote MODEL
    manage.py catalog update cancel MODEL
    manage.py catalog update rollback MODEL
    manage.py catalog update status [MODEL ...] [--json]

``start`` prints the update's id and its first line; with ``--wait`` it follows the
update, a line per step, until it ends or waits for promote (exit 0 when promoted or
ready to promote, 1 when it failed). A refusal (an update of the model running, no
previous revision, the mirror no longer holding it) is one line on standard error and
exit 1; nothing changes. Every change is recorded as made from the command line, by
the user running it.
"""

from __future__ import annotations

import getpass
import json
import socket
import time
from typing import Any

from catalog.choices import Surface
from updates import flow, run
from updates.models import UpdateRun

ACTIONS = ("start", "promote", "cancel", "rollback", "status")
# How often --wait looks again, in seconds.
WAIT_LOOK_S = 1.0


def via() -> str:
    """Return where a command was run from, as the change log shows it."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


def add_arguments(sub: Any) -> None:
    """Add the flow's actions to ``catalog update``'s subparsers."""
    start = sub.add_parser(
        "start", help="move a model to new weights: fetch, candidate, eval, canary, promote"
    )
    start.add_argument("model")
    start.add_argument("--revision", default="", help="a commit or branch (default: the newest)")
    start.add_argument("--auto", action="store_true", help="promote when the eval and canary pass")
    start.add_argument("--canary", type=int, default=None, metavar="PERCENT",
                       help="send this share of the model's traffic to the candidate (0: none; "
                            "default: the model's own canary settings)")  # fmt: skip
    start.add_argument("--wait", action="store_true", help="follow it until it ends or waits")
    promote = sub.add_parser("promote", help="promote a model's running update now")
    promote.add_argument("model")
    back = sub.add_parser(
        "rollback", help="go back to the previous revision while the mirror holds it"
    )
    back.add_argument("model")
    status = sub.add_parser("status", help="each model's last update")
    status.add_argument("models", nargs="*")
    status.add_argument("--json", action="store_true", help="one JSON object a line")


def handle(action: str, options: dict[str, Any], out: Any, err: Any) -> int:
    """Run one of the flow's actions; return the exit code."""
    try:
        if action == "start":
            r = run.start(
                options["model"],
                revision=options.get("revision") or "",
                auto=bool(options.get("auto")),
                canary_percent=options.get("canary"),
                surface=Surface.CLI,
                via=via(),
            )
            out.write(f"update #{r.pk} of {r.model} started: {r.lines[-1]['text']}")
            if options.get("wait"):
                return _follow(r.pk, out)
            return 0
        if action == "promote":
            r = run.promote(options["model"], surface=Surface.CLI, via=via())
            if r.state == "failed":
                err.write(f"update #{r.pk} of {r.model} failed: {r.reason}")
                return 1
            out.write(r.lines[-1]["text"])
            return 0
        if action == "cancel":
            r = run.cancel(options["model"], surface=Surface.CLI, via=via())
            out.write(f"update #{r.pk} of {r.model}: {r.reason}")
            return 0
        if action == "rollback":
            out.write(run.rollback(options["model"], surface=Surface.CLI, via=via()))
            return 0
        if action == "status":
            return _status(options.get("models") or [], bool(options.get("json")), out)
    except flow.FlowRefused as exc:
        err.write(str(exc))
        return 1
    raise ValueError(f"unknown action {action!r}")


def _follow(pk: int, out: Any) -> int:
    shown = 1
    while True:
        r = UpdateRun.objects.get(pk=pk)
        for line in r.lines[shown:]:
            out.write(f"{line['step']}: {line['text']}")
        shown = len(r.lines)
        if r.state != "running":
            return 1 if r.state == "failed" else 0
        time.sleep(WAIT_LOOK_S)


def as_json(r: UpdateRun) -> dict[str, Any]:
    """Return an update as ``status --json`` and the API show it."""
    return {
        "id": r.pk,
        "model": r.model,
        "state": r.state,
        "step": r.step,
        "candidate": r.candidate,
        "revision": r.revision,
        "commit": r.commit,
        "from_commit": r.from_commit,
        "score": r.score,
        "threshold": r.threshold,
        "eval": {"done": r.eval_done, "total": r.eval_total, "passed": r.eval_passed},
        "failed_cases": list(r.failed_cases),
        "canary": dict(r.canary),
        "reason": r.reason,
        "started_by": r.started_by,
        "surface": r.surface,
        "ended_by": r.ended_by,
        "created": r.created.isoformat() if r.created else None,
        "finished": r.finished.isoformat() if r.finished else None,
        "lines": list(r.lines),
    }


def _status(models: list[str], as_lines: bool, out: Any) -> int:
    q = UpdateRun.objects.order_by("model", "-created", "-id")
    if models:
        q = q.filter(model__in=models)
    seen: set[str] = set()
    for r in q:
        if r.model in seen:
            continue
        seen.add(r.model)
        if as_lines:
            out.write(json.dumps(as_json(r)))
        else:
            last = r.lines[-1]["text"] if r.lines else ""
            out.write(f"{r.model}: #{r.pk} {r.state} at {r.step}: {last}")
    return 0
