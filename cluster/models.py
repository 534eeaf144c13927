"""The actual state of the cluster: nodes and their cards, replicas, budgets and tokens.

Written by the agents' API (what nodes report) and the reconciler (what should run where);
read by the console, the API and, through the desired list, the agents.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models.functions import Lower
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from cluster.address import node_host
from cluster.choices import FacilityLevel, NodeHealth, ReplicaState
from cluster.quotas import check

JOIN_PREFIX = "llmgw_join_"
NODE_PREFIX = "llmgw_node_"


def token_digest(secret: str) -> str:
    """Return the stored form of a join or node token (SHA-256 hex of 32 random bytes)."""
    return hashlib.sha256(secret.encode()).hexdigest()


class Node(models.Model):
    """A machine running an agent: what it has, and whether it is heard from."""

    name = models.CharField(max_length=200, unique=True)
    # What the agent says its host is called: shown, never used to reach it (cluster.address).
    hostname = models.CharField(max_length=200, blank=True)
    # The address the node's last join or heartbeat came from, as the control plane saw it.
    address = models.CharField(max_length=100, blank=True, editable=False)
    allowed_address = models.CharField(
        max_length=200,
        blank=True,
        help_text=_(
            "The address an operator allowed for this node's engines, used instead of "
            "the address its requests come from; empty: that address."
        ),
    )
    agent_version = models.CharField(max_length=50, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    cpu_cores = models.IntegerField(default=0)
    memory_mb = models.BigIntegerField(default=0)
    disk_free_mb = models.BigIntegerField(default=0)
    engines = models.JSONField(default=dict, blank=True, help_text=_("engine → version"))
    weights = models.JSONField(default=list, blank=True, help_text=_("sources held"))
    simulated = models.BooleanField(default=False)
    health = models.CharField(
        max_length=20, choices=NodeHealth.choices, default=NodeHealth.NOT_READY
    )
    cordoned = models.BooleanField(default=False)
    reason = models.CharField(max_length=500, blank=True)
    token_digest = models.CharField(max_length=64, unique=True, null=True, editable=False)
    joined = models.DateTimeField(auto_now_add=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    desired_version = models.BigIntegerField(default=1)
    # The digest of the inventory these fields and the cards were last set from
    # (cluster.agentinput.inventory_digest). A heartbeat carrying the same inventory then only
    # stamps last_heartbeat; any other writer of the inventory's fields must clear it.
    inventory_digest = models.CharField(max_length=64, blank=True, editable=False)
    # What each card uses, as its last heartbeat said (docs/agent-protocol.md, cards_use):
    # card index (text) → {"memory_used_mb": int or null, "utilization": int or null}.
    # One column written with the heartbeat's stamp, not a row per card per heartbeat.
    card_use = models.JSONField(default=dict, blank=True, editable=False)

    class Meta:
        ordering = ("name",)
        constraints = [
            # SIM-1 beside sim-1 would be two nodes an operator tells apart by case only.
            models.UniqueConstraint(
                Lower("name"),
                name="cluster_node_name_unique_any_case",
                violation_error_message=_(
                    "a node of this name in another case exists already: node names are "
                    "unique without regard to case"
                ),
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def state(self) -> str:
        """Return ready, not_ready, lost or cordoned, as the console shows it."""
        if self.cordoned and self.health != NodeHealth.LOST:
            return "cordoned"
        return str(self.health)

    @property
    def host(self) -> str:
        """Return the host its engines are reached at (cluster.address.node_host)."""
        return node_host(self.name, self.address, self.allowed_address)

    def issue_token(self) -> str:
        """Give the node a new token (replacing any) and return it; only its hash is kept."""
        secret = NODE_PREFIX + secrets.token_urlsafe(32)
        self.token_digest = token_digest(secret)
        return secret


class Card(models.Model):
    """A GPU (or MIG instance) a node reported."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="cards")
    index = models.IntegerField()
    gpu_class = models.CharField(max_length=200)
    memory_mb = models.BigIntegerField(default=0)
    power_limit_w = models.FloatField(default=0)
    uuid = models.CharField(max_length=200, blank=True)
    mig_of = models.IntegerField(null=True, blank=True)

    class Meta:
        ordering = ("node", "index")
        constraints = [
            models.UniqueConstraint(
                fields=["node", "index"], name="%(app_label)s_%(class)s_unique_index"
            )
        ]

    def __str__(self) -> str:
        return f"{self.node.name}:{self.index} {self.gpu_class}"


class Replica(models.Model):
    """One copy of a catalog model the reconciler wants running, and how it is doing.

    ``generation`` rises when an operator restarts it; ``desired`` false means it is being
    stopped. Placement is in ``assignments`` (one per node; several for multi-node).
    """

    model = models.ForeignKey(
        "catalog.ServedModel", null=True, on_delete=models.SET_NULL, related_name="replicas"
    )
    model_name = models.CharField(max_length=200, db_index=True)
    profile = models.CharField(max_length=200, blank=True)
    fingerprint = models.CharField(max_length=32, blank=True)
    generation = models.IntegerField(default=1)
    desired = models.BooleanField(default=True)
    state = models.CharField(
        max_length=20, choices=ReplicaState.choices, default=ReplicaState.PENDING
    )
    reason = models.TextField(blank=True)
    progress = models.FloatField(null=True, blank=True)
    port = models.IntegerField(null=True, blank=True)
    endpoint = models.CharField(max_length=300, blank=True)
    restarts = models.IntegerField(default=0)
    created = models.DateTimeField(auto_now_add=True)
    state_changed = models.DateTimeField(default=timezone.now)
    ready_since = models.DateTimeField(null=True, blank=True)
    evicted_by = models.CharField(max_length=200, blank=True)
    # Placement tried and found no room (the reason says why); not a replica waiting for
    # its first try, nor one released to be placed again. The gateway answers at once
    # rather than hold clients for a model it cannot start.
    unplaced = models.BooleanField(default=False)
    # A replica stopped while it serves (scaled down, idle, a window closed) drains first:
    # off every gateway's table at once (``desired`` false), its engine kept running (still
    # in its node's desired list) until then so the requests in flight finish.
    drain_until = models.DateTimeField(null=True, blank=True)
    replaces = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text=_("The replica a rolling update started this one to replace."),
    )

    class Meta:
        ordering = ("model_name", "id")

    def __str__(self) -> str:
        return f"{self.model_name}#{self.pk}"

    def set_state(self, state: str, reason: str = "", at: datetime | None = None) -> bool:
        """Record a state change; return whether anything changed."""
        changed = state != self.state or reason != self.reason
        if state != self.state:
            self.state_changed = at or timezone.now()
            if state == ReplicaState.READY:
                self.ready_since = self.state_changed
        self.state = state
        self.reason = reason
        return changed


class Assignment(models.Model):
    """A replica's share of one node: its rank, cards and reserved cores."""

    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="assignments")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="assignments")
    rank = models.IntegerField(default=0)
    cards = models.JSONField(default=list, blank=True)
    cpu_cores = models.IntegerField(default=0)
    memory_mb = models.BigIntegerField(default=0)
    disk_mb = models.BigIntegerField(
        default=0, help_text=_("Disk reserved for fetching the weights, where not yet held.")
    )
    watts = models.FloatField(default=0)
    state = models.CharField(
        max_length=20, choices=ReplicaState.choices, default=ReplicaState.PENDING
    )
    reason = models.TextField(blank=True)
    port = models.IntegerField(null=True, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    reported = models.DateTimeField(null=True, blank=True)
    # The engine's last lines on this node, as its agent last reported them (secrets
    # masked by the agent and again here; docs/agent-protocol.md). Operators only.
    log = models.JSONField(default=list, blank=True, editable=False)

    class Meta:
        ordering = ("replica", "rank")
        constraints = [
            models.UniqueConstraint(
                fields=["replica", "rank"], name="%(app_label)s_%(class)s_unique_rank"
            )
        ]

    def __str__(self) -> str:
        return f"{self.replica} on {self.node.name} rank {self.rank}"


class FacilityBudget(models.Model):
    """A power cap on a rack, row, room or site, counted over its nodes' replicas."""

    level = models.CharField(max_length=10, choices=FacilityLevel.choices)
    name = models.CharField(max_length=200)
    cap_watts = models.FloatField()

    class Meta:
        ordering = ("level", "name")
        constraints = [
            models.UniqueConstraint(
                fields=["level", "name"], name="%(app_label)s_%(class)s_unique_domain"
            ),
            models.CheckConstraint(
                condition=models.Q(cap_watts__gt=0),
                name="%(app_label)s_%(class)s_positive_cap",
                violation_error_message=_("cap_watts must be above 0"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.level} {self.name}: {self.cap_watts:g} W"


class JoinToken(models.Model):
    """A token a new node's agent joins with; stored hashed, limited by expiry and uses."""

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, editable=False)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    expires = models.DateTimeField(null=True, blank=True)
    max_uses = models.IntegerField(null=True, blank=True)
    uses = models.IntegerField(default=0)
    revoked = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created",)

    def __str__(self) -> str:
        return self.name

    @classmethod
    def issue(
        cls,
        name: str,
        *,
        expires: datetime | None = None,
        max_uses: int | None = None,
        created_by: object = None,
    ) -> tuple[JoinToken, str]:
        """Create a join token and return it with its secret, which is never stored."""
        body = secrets.token_urlsafe(32)
        secret = JOIN_PREFIX + body
        token = cls.objects.create(
            name=name,
            prefix=body[:8],
            digest=token_digest(secret),
            expires=expires,
            max_uses=max_uses,
            created_by=created_by,
        )
        return token, secret

    def problem(self) -> str | None:
        """Return why this token cannot be used now, or None."""
        if self.revoked:
            return "this join token is revoked"
        if self.expires and self.expires <= timezone.now():
            return "this join token has expired"
        if self.max_uses is not None and self.uses >= self.max_uses:
            return "this join token has been used up"
        return None


class ModelDemand(models.Model):
    """When an on-demand model was last asked for (by the gateway's demand call)."""

    model_name = models.CharField(max_length=200, unique=True)
    last_demand = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.model_name} at {self.last_demand}"


class ModelScale(models.Model):
    """A model's load scaling as the reconciler last decided it (``cluster.scaling``):
    the target between the min and max in force, why, and the windows it counts."""

    model_name = models.CharField(max_length=200, unique=True)
    target = models.IntegerField(null=True, blank=True)
    lo = models.IntegerField(default=0)
    hi = models.IntegerField(default=0)
    over_since = models.FloatField(null=True, blank=True)
    quiet_since = models.FloatField(null=True, blank=True)
    reason = models.TextField(blank=True)
    # Set while a replica it scaled up to has no room anywhere: placement's reason.
    no_room = models.TextField(blank=True)
    changed = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.model_name}: {self.target} ({self.shown})"

    @property
    def shown(self) -> str:
        """What the console shows: placement's word when it found no room, else why."""
        return self.no_room or self.reason


class ClusterAction(models.Model):
    """An operator's action on the cluster (cordon, drain, restart, roll, budgets, tokens):
    who, when, on what. The catalog's changes have their own log (catalog.ChangeRecord)."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=200)
    action = models.CharField(max_length=40)
    target = models.CharField(max_length=300)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ("-at", "-id")

    def __str__(self) -> str:
        return f"{self.actor_name} {self.action} {self.target}"


class ControlMark(models.Model):
    """When a process of the control plane last did its part: one row per kind, kept current.

    ``tick``: the reconciler's last finished tick, and which process ran it (the console's
    dashboard and ``GET /api/v1/cluster/status`` warn when it is old). ``heartbeats``: since
    when heartbeats can be heard, the latest start of a web process; a node's silence counts
    only from then (cluster.plan.judge_silence).
    """

    TICK = "tick"
    HEARTBEATS = "heartbeats"

    kind = models.CharField(max_length=20, primary_key=True)
    at = models.DateTimeField()
    by = models.CharField(max_length=200, blank=True)

    def __str__(self) -> str:
        return f"{self.kind} at {self.at} by {self.by}"


class Quota(models.Model):
    """A capacity quota of an owner of the tenancy tree (``org:``, ``team:``, ``project:``):
    cards per GPU class and CPU cores its models' replicas may hold, its children's
    included (``cluster.quotas``); ``parent`` is the owner it counts in."""

    owner = models.CharField(
        _("owner"), max_length=120, unique=True,
        help_text=_("org:ID, team:ID or project:ID, as catalog models name their owner"),
    )  # fmt: skip
    parent = models.CharField(
        _("parent"), max_length=120, blank=True,
        help_text=_("the owner this one counts in: a project's team, a team's org; empty: none"),
    )  # fmt: skip
    cards = models.JSONField(
        _("cards"), default=dict, blank=True,
        help_text=_('cards per GPU class, e.g. {"nvidia-h100-80gb": 4}; a class not named '
                    "is not limited"),
    )  # fmt: skip
    cpu_cores = models.PositiveIntegerField(
        _("CPU cores"), null=True, blank=True,
        help_text=_("cores for profiles with no GPU; empty: not limited"),
    )  # fmt: skip
    tpm = models.PositiveIntegerField(
        _("tokens per minute"), default=0,
        help_text=_("a token budget shared by every client key of this owner (0: none)"),
    )  # fmt: skip
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("owner",)
        verbose_name = _("quota")

    def __str__(self) -> str:
        return self.owner

    def clean(self) -> None:
        errors = check(self.owner, self.parent, self.cards, self.cpu_cores)
        if errors:
            raise ValidationError(errors)
