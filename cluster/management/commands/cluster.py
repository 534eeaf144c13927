"""The cluster from the command line: join tokens, one reconcile tick, the state."""

from __future__ import annotations

import getpass
import socket
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from catalog.durations import DurationError, parse_duration
from catalog.models import ServedModel
from cluster import agentinput, agentjoin, benchrun, marks, reconciler, services, tenancy
from cluster.models import JoinToken, Node, Quota, Replica


class Command(BaseCommand):
    help = (
        "Cluster: join-token create|list|revoke, node release|address, reconcile (one tick), "
        "status, bench MODEL [--profile P] (measure a profile's capacity, write its weight), "
        "quota set|list|delete (capacity quotas per owner)."
    )

    def add_arguments(self, parser: Any) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        jt = sub.add_parser("join-token", help="tokens new nodes' agents join with")
        jsub = jt.add_subparsers(dest="jt_action", required=True)
        create = jsub.add_parser("create", help="make one; its secret is printed once")
        create.add_argument("--name", default="join")
        create.add_argument("--expires", help="a duration from now, like 24h")
        create.add_argument("--uses", type=int, help="how many nodes may join with it")
        jsub.add_parser("list")
        revoke = jsub.add_parser("revoke")
        revoke.add_argument("id", type=int)
        node = sub.add_parser("node", help="a node's identity and address")
        nsub = node.add_subparsers(dest="node_action", required=True)
        release = nsub.add_parser(
            "release",
            help="let the next join under this name take the node (its node token stops working)",
        )
        release.add_argument("name")
        address = nsub.add_parser(
            "address",
            help="reach the node's engines at ADDRESS instead of where its requests come from",
        )
        address.add_argument("name")
        address.add_argument("address", nargs="?", default="", help="empty: where it is seen")
        sub.add_parser("reconcile", help="run one reconcile tick now and print what it did")
        sub.add_parser("status", help="nodes and replicas, one line each")
        b = sub.add_parser(
            "bench",
            help="measure what one ready replica carries within the model's slo and write "
            "the profile's capacity and weight",
        )
        b.add_argument("model")
        b.add_argument("--profile", default=None, help="the profile to measure (default: the "
                       "first ready replica's)")  # fmt: skip
        b.add_argument("--dry-run", action="store_true", help="measure and print, write nothing")
        quota = sub.add_parser("quota", help="capacity quotas of org:, team: and project: owners")
        qsub = quota.add_subparsers(dest="quota_action", required=True)
        qset = qsub.add_parser(
            "set", help="set an owner's quota (whole: what is not given is not limited)"
        )
        qset.add_argument("owner", help="org:ID, team:ID or project:ID")
        qset.add_argument("--parent", default="", help="the owner it counts in (a project's "
                          "team, a team's org)")  # fmt: skip
        qset.add_argument("--cards", action="append", default=[], metavar="CLASS=N",
                          help="cards of a GPU class, e.g. nvidia-h100-80gb=4 (repeat)")  # fmt: skip
        qset.add_argument("--cpu-cores", type=int, default=None, help="cores for CPU profiles")
        qset.add_argument("--tpm", type=int, default=0, help="tokens a minute, shared by every "
                          "client key of the owner (0: none)")  # fmt: skip
        qsub.add_parser("list", help="every quota, with what its owner's replicas hold now")
        qdel = qsub.add_parser("delete", help="remove an owner's quota")
        qdel.add_argument("owner")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "join-token":
            self._join_token(options)
        elif action == "node":
            self._node(options)
        elif action == "bench":
            self._bench(options)
        elif action == "quota":
            self._quota(options)
        elif action == "reconcile":
            result = reconciler.tick()
            if not result.leader:
                raise CommandError("another process holds the leader lock; try again")
            self.stdout.write(
                f"lost {result.lost or '-'}; created {result.created or '-'}; "
                f"stopped {result.stopped or '-'}; placed {result.placed or '-'}; "
                f"evicted {result.evicted or '-'}; held {result.held or '-'}"
            )
            for rid, reason in result.unplaced.items():
                self.stdout.write(f"unplaced #{rid}: {reason}")
        else:
            tick = marks.tick_status()
            if tick.warning:
                self.stdout.write(f"reconciler: {tick.warning}")
            else:
                self.stdout.write(f"reconciler: last tick {tick.age_s:.0f} s ago by {tick.by}")
            for n in Node.objects.prefetch_related("cards"):
                classes = ", ".join(sorted({c.gpu_class for c in n.cards.all()})) or "no cards"
                self.stdout.write(f"node {n.name}\t{n.state}\t{n.cpu_cores} cores\t{classes}")
            for r in Replica.objects.prefetch_related("assignments__node"):
                where = ",".join(a.node.name for a in r.assignments.all()) or "-"
                self.stdout.write(
                    f"replica #{r.pk}\t{r.model_name}\t{r.state}\t{where}\t{r.reason}"
                )

    def _quota(self, options: dict[str, Any]) -> None:
        via = f"cli {getpass.getuser()}@{socket.gethostname()}"
        sub = options["quota_action"]
        try:
            if sub == "set":
                try:
                    cards = tenancy.parse_cards(options["cards"])
                except ValueError as error:
                    raise CommandError(f"--cards: {error}") from None
                q = tenancy.set_quota(options["owner"], parent=options["parent"], cards=cards,
                                      cpu_cores=options["cpu_cores"], tpm=options["tpm"],
                                      via=via)  # fmt: skip
                self.stdout.write(f"quota {q.owner}: {tenancy.describe(q)}")
            elif sub == "delete":
                tenancy.delete_quota(options["owner"], via=via)
                self.stdout.write(f"quota {options['owner']} removed")
            else:
                owners = dict(ServedModel.objects.values_list("name", "owner"))
                used = tenancy.usage(owners)
                for q in Quota.objects.all():
                    held = ", ".join(f"{n} {r}" for r, n in used.get(q.owner, {}).items()) or "-"
                    self.stdout.write(f"{q.owner}\t{tenancy.describe(q)}\tin use: {held}")
        except tenancy.QuotaRefused as error:
            raise CommandError(str(error)) from None

    def _bench(self, options: dict[str, Any]) -> None:
        who = SimpleNamespace(username=f"{getpass.getuser()}@{socket.gethostname()}", pk=None)
        say = self.stdout.write
        try:
            if options["dry_run"]:
                out = benchrun.measure(options["model"], options["profile"], say=say)
            else:
                out = benchrun.run(options["model"], options["profile"], who, "cli", "cli", say)
        except benchrun.BenchError as exc:
            raise CommandError(str(exc)) from None
        for line in out.lines:
            self.stdout.write(line)
        if out.written:
            self.stdout.write(f"{out.summary}: weight {out.capacity:g} and capacity written")
        else:
            self.stdout.write(f"{out.summary}: nothing written (--dry-run)")

    def _node(self, options: dict[str, Any]) -> None:
        node = Node.objects.filter(name=options["name"]).first()
        if node is None:
            raise CommandError(f"no node {options['name']!r}: see manage.py cluster status")
        who = SimpleNamespace(username=f"{getpass.getuser()}@{socket.gethostname()}", pk=None)
        if options["node_action"] == "release":
            agentjoin.release(node, who.username)
            services.log_action(
                who, "release", f"node {node.name}", "node token dropped; the next join takes it",
                "cli",
            )  # fmt: skip
            self.stdout.write(
                f"node {node.name} released: its agent's node token no longer works, and the "
                "next agent to join under this name takes it"
            )
            return
        try:
            node = agentjoin.allow_address(node, options["address"])
        except agentinput.AgentError as exc:
            raise CommandError(str(exc)) from None
        services.log_action(
            who, "address", f"node {node.name}",
            node.allowed_address or "the address it is seen at", "cli",
        )  # fmt: skip
        self.stdout.write(f"node {node.name}'s engines are reached at {node.host}")

    def _join_token(self, options: dict[str, Any]) -> None:
        sub = options["jt_action"]
        if sub == "create":
            expires = None
            if options["expires"]:
                try:
                    ns = parse_duration(options["expires"])
                except DurationError as exc:
                    raise CommandError(f"--expires: {exc}") from None
                expires = timezone.now() + timedelta(microseconds=ns / 1000)
            if options["uses"] is not None and options["uses"] < 1:
                raise CommandError("--uses is at least 1")
            token, secret = JoinToken.issue(
                options["name"], expires=expires, max_uses=options["uses"]
            )
            self.stdout.write(f"join token {token.pk} ({token.name}); shown only now:\n{secret}")
        elif sub == "list":
            for t in JoinToken.objects.order_by("id"):
                self.stdout.write(f"{t.pk}\t{t.name}\t{t.problem() or 'usable'}\tused {t.uses}")
        else:
            n = JoinToken.objects.filter(pk=options["id"], revoked__isnull=True).update(
                revoked=timezone.now()
            )
            if not n:
                raise CommandError(f"no usable join token {options['id']}")
            self.stdout.write(f"join token {options['id']} revoked")
