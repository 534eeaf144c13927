"""Serializers of the cluster's API: nodes, cards, replicas, budgets, join tokens."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import serializers

from cluster import reasons
from cluster.models import (
    Assignment,
    Card,
    ClusterAction,
    FacilityBudget,
    JoinToken,
    Node,
    Quota,
    Replica,
)
from llmgw_core.roles import OPERATOR, has_role


class CardSerializer(serializers.ModelSerializer[Card]):
    """A card, and which replica holds it (if any)."""

    node = serializers.CharField(source="node.name", read_only=True)
    replica = serializers.SerializerMethodField()

    class Meta:
        model = Card
        fields = (
            "node",
            "index",
            "gpu_class",
            "memory_mb",
            "power_limit_w",
            "uuid",
            "mig_of",
            "replica",
        )

    def get_replica(self, obj: Card) -> int | None:
        held = self.context.get("held", {})
        return held.get((obj.node_id, obj.index))


class NodeSerializer(serializers.ModelSerializer[Node]):
    """A node: what it has, its state, and its cards."""

    state = serializers.CharField(read_only=True)
    cards = CardSerializer(many=True, read_only=True)

    class Meta:
        model = Node
        fields = (
            "id", "name", "hostname", "address", "allowed_address", "agent_version", "labels",
            "cpu_cores", "memory_mb", "disk_free_mb", "engines", "weights", "simulated", "state",
            "health", "cordoned", "reason", "joined", "last_heartbeat", "cards",
        )  # fmt: skip
        read_only_fields = fields


class NodeCardSerializer(serializers.Serializer[None]):
    """A node's card on its page, with the replica (and model) holding it."""

    index = serializers.IntegerField()
    gpu_class = serializers.CharField()
    memory_mb = serializers.IntegerField()
    power_limit_w = serializers.FloatField()
    uuid = serializers.CharField()
    mig_of = serializers.IntegerField(allow_null=True)
    memory_used_mb = serializers.IntegerField(
        allow_null=True, help_text="memory in use (MiB), as the last heartbeat said"
    )
    utilization = serializers.IntegerField(
        allow_null=True, help_text="percent busy, as the last heartbeat said"
    )
    replica = serializers.IntegerField(allow_null=True)
    model = serializers.CharField(allow_null=True)


class NodeReplicaSerializer(serializers.Serializer[None]):
    """A replica's share of a node: its rank there, cards, state and why."""

    replica = serializers.IntegerField()
    model = serializers.CharField()
    profile = serializers.CharField()
    generation = serializers.IntegerField()
    desired = serializers.BooleanField()
    rank = serializers.IntegerField()
    cards = serializers.ListField(child=serializers.IntegerField())
    host_memory_mb = serializers.IntegerField()
    state = serializers.CharField()
    reason = serializers.CharField()
    port = serializers.IntegerField(allow_null=True)
    pid = serializers.IntegerField(allow_null=True)
    restarts = serializers.IntegerField()
    reported = serializers.DateTimeField(allow_null=True)
    log_lines = serializers.IntegerField(
        help_text="lines of its engine's log held (operators read them)"
    )


class NodeDetailSerializer(NodeSerializer):
    """A node with its cards (the replica holding each) and the replicas it runs."""

    cards = NodeCardSerializer(many=True, read_only=True)  # type: ignore[assignment]
    replicas = NodeReplicaSerializer(many=True, read_only=True)

    class Meta(NodeSerializer.Meta):
        fields = (*NodeSerializer.Meta.fields, "replicas")
        read_only_fields = fields


class ReplicaLogNodeSerializer(serializers.Serializer[None]):
    """A replica's engine log on one node, as its agent last reported it."""

    node = serializers.CharField()
    node_id = serializers.IntegerField()
    rank = serializers.IntegerField()
    state = serializers.CharField()
    reported = serializers.DateTimeField(allow_null=True)
    lines = serializers.ListField(child=serializers.CharField(allow_blank=True))


class ReplicaLogSerializer(serializers.Serializer[None]):
    """A replica's engine log: the last lines of stdout and stderr on each of its nodes."""

    replica = serializers.IntegerField()
    model = serializers.CharField()
    nodes = ReplicaLogNodeSerializer(many=True)


class NodeAddressSerializer(serializers.Serializer[None]):
    """The address an operator allows for a node's engines; empty: where it is seen."""

    address = serializers.CharField(allow_blank=True, max_length=200)


class AssignmentSerializer(serializers.ModelSerializer[Assignment]):
    """A replica's share of one node; its reason in detail for operators (cluster.reasons)."""

    node = serializers.CharField(source="node.name", read_only=True)

    def to_representation(self, instance: Assignment) -> dict[str, Any]:
        data: dict[str, Any] = super().to_representation(instance)
        request = self.context.get("request")
        operator = request is not None and has_role(request.user, OPERATOR)
        data["reason"] = reasons.for_role(data.get("reason") or "", operator)
        return data

    class Meta:
        model = Assignment
        fields = (
            "node",
            "rank",
            "cards",
            "cpu_cores",
            "state",
            "reason",
            "port",
            "pid",
            "reported",
        )


class ReplicaSerializer(serializers.ModelSerializer[Replica]):
    """A replica: where it runs, its state and why."""

    assignments = AssignmentSerializer(many=True, read_only=True)
    outdated = serializers.SerializerMethodField()

    class Meta:
        model = Replica
        fields = (
            "id", "model_name", "profile", "fingerprint", "outdated", "generation", "desired",
            "state", "reason", "progress", "port", "endpoint", "restarts", "created",
            "state_changed", "ready_since", "replaces", "assignments",
        )  # fmt: skip
        read_only_fields = fields

    def get_outdated(self, obj: Replica) -> bool:
        current = self.context.get("fingerprints", {}).get(obj.model_name, {})
        want = current.get(obj.profile)
        return bool(obj.fingerprint) and want is not None and want != obj.fingerprint


class FacilityBudgetSerializer(serializers.ModelSerializer[FacilityBudget]):
    """A power cap on a facility domain."""

    class Meta:
        model = FacilityBudget
        fields = ("id", "level", "name", "cap_watts")

    def validate_cap_watts(self, value: float) -> float:
        if value <= 0:
            raise serializers.ValidationError("cap_watts must be above 0")
        return value


class JoinTokenSerializer(serializers.ModelSerializer[JoinToken]):
    """A join token as listed (never its secret)."""

    state = serializers.SerializerMethodField()

    class Meta:
        model = JoinToken
        fields = (
            "id",
            "name",
            "prefix",
            "created",
            "expires",
            "max_uses",
            "uses",
            "revoked",
            "state",
        )
        read_only_fields = ("prefix", "created", "uses", "revoked")

    def get_state(self, obj: JoinToken) -> str:
        return obj.problem() or "usable"

    def validate_expires(self, value: Any) -> Any:
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("expires is in the past: give a later time, or none")
        return value

    def validate_max_uses(self, value: Any) -> Any:
        if value is not None and value < 1:
            raise serializers.ValidationError("max_uses is at least 1, or none for no limit")
        return value


class ClusterActionSerializer(serializers.ModelSerializer[ClusterAction]):
    """An operator's action on the cluster."""

    class Meta:
        model = ClusterAction
        fields = ("id", "at", "actor_name", "action", "target", "detail")
        read_only_fields = fields


class QuotaSerializer(serializers.ModelSerializer[Quota]):
    """An owner's capacity quota (``cluster.quotas``), with what its replicas hold now."""

    cards = serializers.DictField(
        child=serializers.IntegerField(min_value=0), required=False,
        help_text="cards per GPU class; a class not named is not limited",
    )  # fmt: skip
    in_use = serializers.SerializerMethodField()

    class Meta:
        model = Quota
        fields = ("id", "owner", "parent", "cards", "cpu_cores", "tpm", "in_use", "updated")
        read_only_fields = ("updated",)
        validators: list[Any] = []  # the owner's uniqueness: set_quota replaces

    def get_in_use(self, obj: Quota) -> dict[str, int]:
        return dict(self.context.get("usage", {}).get(obj.owner, {}))
