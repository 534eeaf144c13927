"""The gateway from the command line: serve it alone, and manage client keys.

manage.py gateway serve [--bind H] [--port P] [--workers N]
manage.py gateway key create NAME [--owner O] [--model M ...] [--expires DURATION]
                                  [--rpm N] [--tpm N] [--priority high|normal|low]
manage.py gateway key list
manage.py gateway key revoke NAME
manage.py gateway batch list|show ID|cancel ID
"""

from __future__ import annotations

import getpass
import json
import re
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from django.utils import timezone

from catalog.durations import parse_duration
from gateway import server, services
from gateway.batch import routes, store
from gateway.models import ClientKey
from llmgw_core.workers import cores

_DAYS = re.compile(r"^(\d+)d$")


def _cli_name() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def parse_expiry(text: str) -> timedelta:
    """``30d``, or a Go duration (``12h``, ``90m``)."""
    days = _DAYS.match(text)
    if days:
        return timedelta(days=int(days.group(1)))
    try:
        ns = parse_duration(text)
    except ValueError as error:
        raise CommandError(f"--expires: {error}; or days, like 30d") from None
    if ns <= 0:
        raise CommandError("--expires must be a positive duration (30d, 12h, 90m)")
    return timedelta(microseconds=ns // 1000)


class Command(BaseCommand):
    help = "Gateway: serve alone; key create|list|revoke; batch list|show|cancel."

    def add_arguments(self, parser: Any) -> None:
        parser.allow_abbrev = False
        sub = parser.add_subparsers(dest="action", required=True)
        serve = sub.add_parser("serve", help="serve /v1/ alone (as many as a site needs)")
        serve.add_argument("--bind", default="127.0.0.1",
                           help="an address of this machine (0.0.0.0: every IPv4 interface, "
                           "::: every interface); default 127.0.0.1")  # fmt: skip
        serve.add_argument("--port", type=int, default=8001,
                           help="0 to 65535; 0: any free port (the start line prints it); "
                           "default 8001")  # fmt: skip
        serve.add_argument("--workers", type=int, default=None,
                           help="processes serving the port (SO_REUSEPORT), restarted when "
                           "one dies; 0: one a core; default LLMGW_GATEWAY_WORKERS "
                           "(0)")  # fmt: skip
        key = sub.add_parser("key", help="client keys")
        ksub = key.add_subparsers(dest="key_action", required=True)
        create = ksub.add_parser("create", help="make a key; prints it alone on the last line")
        create.add_argument("name")
        create.add_argument(
            "--owner",
            default="",
            help="org:NAME, team:NAME or project:NAME; peer:NAME for a "
            "federated cluster's key (docs/federation.md)",
        )
        create.add_argument("--model", action="append", default=[], dest="models",
                            help="a model, alias or adapter it may name (repeat); default every "
                            "model in the cluster")  # fmt: skip
        create.add_argument("--expires", help="30d, 12h, 90m")
        create.add_argument("--rpm", type=int, default=0, help="requests a minute (0: none)")
        create.add_argument("--tpm", type=int, default=0, help="tokens a minute (0: none)")
        create.add_argument(
            "--priority", choices=("high", "normal", "low"), default="normal",
            help="its band while a model is past its latency SLO (high: always admitted)",
        )  # fmt: skip
        ksub.add_parser("list", help="every key (never its secret)")
        revoke = ksub.add_parser(
            "revoke", help="revoke a key (every gateway refuses it within a second)"
        )
        revoke.add_argument("name")
        batch = sub.add_parser("batch", help="batches (the Batch API's), every owner's")
        bsub = batch.add_subparsers(dest="batch_action", required=True)
        bsub.add_parser("list", help="every batch, newest first")
        bsub.add_parser("show", help="a batch, whole (JSON)").add_argument("id")
        bsub.add_parser("cancel", help="cancel a batch (what finished is kept)").add_argument("id")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["action"] == "serve":
            self._serve(opts["bind"], opts["port"], opts["workers"])
            return
        if opts["action"] == "batch":
            self._batch(opts["batch_action"], opts.get("id"))
            return
        action = opts["key_action"]
        if action == "create":
            expires = None
            if opts["expires"]:
                expires = timezone.now() + parse_expiry(opts["expires"])
            for name in ("rpm", "tpm"):
                if opts[name] < 0:
                    raise CommandError(f"--{name} must be 0 or more")
            try:
                key, secret = services.create_key(
                    opts["name"], owner=opts["owner"], models=opts["models"], expires=expires,
                    rpm=opts["rpm"], tpm=opts["tpm"], priority=opts["priority"], via=f"cli {_cli_name()}",
                )  # fmt: skip
            except services.KeyRefused as error:
                raise CommandError(str(error)) from None
            self.stdout.write(
                f"client key {key.name} (owner {key.owner or '-'}; priority {key.priority}; models "
                f"{', '.join(key.models) or 'every cluster model'}; expires "
                f"{key.expires.isoformat() if key.expires else 'never'}). It is shown once:"
            )
            self.stdout.write(secret)
        elif action == "list":
            for k in ClientKey.objects.order_by("name", "-created"):
                self.stdout.write(
                    f"{k.name}\t{k.state}\t{k.owner or '-'}\t{','.join(k.models) or '*'}\t"
                    f"llmgw-ck-{k.prefix}…\t{k.priority}\trpm {k.rpm or '-'}\ttpm {k.tpm or '-'}\t"
                    f"expires {k.expires.isoformat() if k.expires else 'never'}"
                )
        elif action == "revoke":
            try:
                services.revoke_key(opts["name"], via=f"cli {_cli_name()}")
            except services.KeyRefused as error:
                raise CommandError(str(error)) from None
            self.stdout.write(f"revoked {opts['name']}")

    def _batch(self, action: str, batch_id: str | None) -> None:
        if action == "list":
            for b in store.list_batches(None):
                counts = b["request_counts"]
                made = datetime.fromtimestamp(b["created_at"], UTC).isoformat()
                self.stdout.write(
                    f"{b['id']}\t{b['status']}\t{b['owner']}\t{b['key']}\t{b['endpoint']}\t"
                    f"{counts['completed']}+{counts['failed']} failed/{counts['total']}\t{made}"
                )
            return
        assert batch_id is not None
        if store.get_batch(None, batch_id) is None:
            raise CommandError(f"no batch {batch_id} (manage.py gateway batch list)")
        if action == "show":
            self.stdout.write(json.dumps(store.get_batch(None, batch_id), indent=2))
            return
        batch = routes.cancel(None, batch_id)
        assert batch is not None
        if batch["status"] not in ("cancelling", "cancelled"):
            raise CommandError(f"batch {batch_id} is {batch['status']}: it cannot be cancelled")
        self.stdout.write(f"{batch_id} {batch['status']}: the runner stops it, what finished "
                          "is kept")  # fmt: skip

    def _serve(self, bind: str, port: int, workers: int | None) -> None:
        count = settings.LLMGW_GATEWAY_WORKERS if workers is None else workers
        if count < 0:
            raise CommandError(f"--workers {count}: 1 or more, or 0 for one a core "
                               f"({cores()} here)")  # fmt: skip
        count = count or cores()
        # Before anything starts: an address it cannot serve on is refused here.
        try:
            sock = server.listen(bind, port, shared=count > 1)
        except server.AddressRefused as error:
            raise CommandError(str(error)) from None
        if not settings.REDIS_URL:
            self.stderr.write(server.PER_PROCESS, style_func=self.style.WARNING)
            self.stderr.flush()
        if count == 1:
            server.run(sock, self._say)
            return
        connections.close_all()  # each worker opens its own
        raise SystemExit(server.run_workers(sock, count, self._say, self._warn))

    def _say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()  # a pipe or a log file holds it back otherwise

    def _warn(self, line: str) -> None:
        self.stderr.write(line, style_func=self.style.WARNING)
        self.stderr.flush()
