"""Federated llmgw clusters from the command line (docs/federation.md).

manage.py federation add NAME --url URL --key-file FILE
manage.py federation list [--json]
manage.py federation remove NAME
"""

from __future__ import annotations

import getpass
import json
import socket
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from gateway import peers
from gateway.models import Peer


def _cli_name() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def shown(peer: Peer) -> dict[str, Any]:
    """A peer as the list, the API and the console show it (never its key)."""
    return {
        "name": peer.name,
        "url": peer.url,
        "key_file": peer.api_key_file,
        "state": peer.state,
        "last_error": peer.last_error,
        "models": [f"{peer.name}/{m}" for m in peer.listed or []],
        "refreshed": peer.refreshed.isoformat() if peer.refreshed else None,
    }


class Command(BaseCommand):
    help = "Federated llmgw clusters: add|list|remove."

    def add_arguments(self, parser: Any) -> None:
        parser.allow_abbrev = False
        sub = parser.add_subparsers(dest="action", required=True)
        add = sub.add_parser("add", help="add a peer: its models appear as NAME/MODEL")
        add.add_argument("name", help="lowercase letters, digits and '-'")
        add.add_argument("--url", required=True, help="the peer's address (https://…)")
        add.add_argument("--key-file", required=True, dest="key_file",
                         help="a file in LLMGW_SECRETS_DIR holding a client key of the "
                         "peer's")  # fmt: skip
        lst = sub.add_parser("list", help="every peer, its state and its models")
        lst.add_argument("--json", action="store_true", help="as JSON")
        remove = sub.add_parser("remove", help="remove a peer and its models")
        remove.add_argument("name")

    def handle(self, *args: Any, **opts: Any) -> None:
        action = opts["action"]
        via = f"cli {_cli_name()}"
        if action == "add":
            try:
                peer = peers.add_peer(opts["name"], opts["url"], opts["key_file"], via=via)
            except peers.PeerRefused as refused:
                raise CommandError(str(refused)) from None
            self.stdout.write(f"added peer {peer.name}: its models appear as {peer.name}/MODEL "
                              "within the next refresh")  # fmt: skip
        elif action == "remove":
            try:
                removed = peers.remove_peer(opts["name"], via=via)
            except peers.PeerRefused as refused:
                raise CommandError(str(refused)) from None
            self.stdout.write(f"removed peer {opts['name']} and {len(removed)} models")
        else:
            rows = [shown(p) for p in Peer.objects.all()]
            if opts["json"]:
                self.stdout.write(json.dumps(rows, indent=2))
                return
            if not rows:
                self.stdout.write("no peers (federation add NAME --url URL --key-file FILE)")
            for r in rows:
                why = f" ({r['last_error']})" if r["last_error"] else ""
                self.stdout.write(f"{r['name']}\t{r['url']}\t{r['state']}{why}\t"
                                  f"{len(r['models'])} models")  # fmt: skip
