"""The gateway API's serializers: client keys (never their secret but the once it is
made), usage, the guard's refusals, traffic over time, federated peers."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from gateway import services
from gateway.models import ClientKey, Peer, Refusal, Usage
from gateway.path.table import KEY_PREFIX


class ClientKeySerializer(serializers.ModelSerializer[ClientKey]):
    """A key as listed: never its secret; ``prefix`` is how it starts."""

    models = serializers.ListField(
        child=serializers.CharField(max_length=200), required=False, max_length=1000,
        help_text="models, aliases and adapters it may name; empty: every cluster model",
    )  # fmt: skip
    rpm = serializers.IntegerField(min_value=0, max_value=services.MAX_LIMIT, required=False)
    tpm = serializers.IntegerField(min_value=0, max_value=services.MAX_LIMIT, required=False)
    prefix = serializers.SerializerMethodField()
    state = serializers.CharField(read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = ClientKey
        fields = (
            "id", "name", "owner", "models", "priority", "rpm", "tpm", "expires", "prefix", "state",
            "created", "created_by", "revoked",
        )  # fmt: skip
        read_only_fields = ("created", "revoked")
        # The live name's uniqueness is the services' to say (a revoked key keeps its name).
        validators: list[Any] = []

    def get_prefix(self, obj: ClientKey) -> str:
        return f"{KEY_PREFIX}{obj.prefix}"


class CreatedKeySerializer(ClientKeySerializer):
    """A key just made: ``key`` is its secret, shown this once."""

    key = serializers.CharField(read_only=True)

    class Meta(ClientKeySerializer.Meta):
        fields = (*ClientKeySerializer.Meta.fields, "key")


class UsageSerializer(serializers.ModelSerializer[Usage]):
    """One minute's usage of a key on a model (``gateway.records.usage``)."""

    class Meta:
        model = Usage
        fields = ("minute", "key", "owner", "model", "requests", "errors", "tokens_in",
                  "tokens_out", "tokens_cached", "refusals", "batch_requests")  # fmt: skip
        read_only_fields = fields


class RefusalSerializer(serializers.ModelSerializer[Refusal]):
    """A request or answer the guard refused, by its request id: never the text."""

    class Meta:
        model = Refusal
        fields = ("at", "request_id", "direction", "model", "key", "owner", "judge", "verdict",
                  "categories", "score", "judged", "failures")  # fmt: skip
        read_only_fields = fields


class HistoryQuerySerializer(serializers.Serializer[None]):
    """Which series: one of ``model``, ``key`` or ``owner``; ``span`` hour, day or week."""

    model = serializers.CharField(required=False, max_length=200)
    key = serializers.CharField(required=False, max_length=100)
    owner = serializers.CharField(required=False, max_length=120)
    span = serializers.ChoiceField(choices=["hour", "day", "week"], default="day")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        given = [f for f in ("model", "key", "owner") if attrs.get(f)]
        if len(given) != 1:
            raise serializers.ValidationError(
                {"model": ["give one of model, key or owner (and span: hour, day or week)"]}
            )
        return attrs


class HistoryPointSerializer(serializers.Serializer[None]):
    at = serializers.DateTimeField()
    requests = serializers.IntegerField()
    errors = serializers.IntegerField()
    refusals = serializers.IntegerField()
    held = serializers.IntegerField()
    tokens_in = serializers.IntegerField()
    tokens_out = serializers.IntegerField()
    in_flight = serializers.FloatField()
    ttft_p50_ms = serializers.FloatField(allow_null=True)
    ttft_p99_ms = serializers.FloatField(allow_null=True)


class HistoryMarkSerializer(serializers.Serializer[None]):
    at = serializers.DateTimeField()
    kind = serializers.CharField(
        help_text="scale (a step of load scaling, with its reason), replica (a replica made) or bench"
    )
    what = serializers.CharField()


class HistorySerializer(serializers.Serializer[None]):
    """A series: its span, the seconds a point, the points, a model's marks."""

    span = serializers.CharField()
    step_s = serializers.IntegerField()
    model = serializers.CharField(required=False)
    key = serializers.CharField(required=False)
    owner = serializers.CharField(required=False)
    marks = HistoryMarkSerializer(many=True, required=False)
    points = HistoryPointSerializer(many=True)


class PeerSerializer(serializers.ModelSerializer[Peer]):
    """A federated peer: its key file's name, never the key; ``models`` what it lists."""

    key_file = serializers.CharField(source="api_key_file", max_length=500)
    models = serializers.SerializerMethodField()
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = Peer
        fields = ("name", "url", "key_file", "state", "last_error", "models", "refreshed",
                  "created", "created_by")  # fmt: skip
        read_only_fields = ("state", "last_error", "refreshed", "created")
        validators: list[Any] = []  # the name's uniqueness is the services' to say
        extra_kwargs = {"name": {"validators": []}}

    def get_models(self, obj: Peer) -> list[str]:
        return [f"{obj.name}/{m}" for m in obj.listed or []]
