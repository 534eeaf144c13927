"""The gateway's API: client keys under /api/v1/gateway/keys/ (viewers list and read,
operators create, the secret in the answer the only time it is shown, and revoke); usage
under /api/v1/gateway/usage/ and the guard's refusals under /api/v1/gateway/refusals/
(viewers read); federated peers under /api/v1/gateway/peers/ (viewers list and read,
operators add and remove: ``gateway.peers``)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from gateway import keys, peers, services
from gateway.filtersets import RefusalFilterSet
from gateway.models import ClientKey, Peer, Refusal, Usage
from gateway.path.table import KEY_PREFIX
from llmgw_core.api import shown_once
from llmgw_core.roles import OPERATOR, VIEWER

VIA = "api"


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


class ClientKeyViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,  # type: ignore[type-arg]
):
    """Client keys of the gateway: the secret is shown once, when it is created."""

    queryset = ClientKey.objects.select_related("created_by").order_by("name", "-created")
    serializer_class = ClientKeySerializer
    read_role = VIEWER
    required_role = OPERATOR

    @extend_schema(request=ClientKeySerializer, responses={201: CreatedKeySerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = ClientKeySerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            key, secret = services.create_key(
                data["name"], owner=data.get("owner", ""), models=data.get("models", ()),
                expires=data.get("expires"), rpm=data.get("rpm", 0), tpm=data.get("tpm", 0),
                priority=data.get("priority", "normal"), user=request.user, via=VIA,
            )  # fmt: skip
        except services.KeyRefused as error:
            raise serializers.ValidationError(error.by_field()) from None
        return shown_once(dict(ClientKeySerializer(key).data), "key", secret)

    @extend_schema(request=None, responses=ClientKeySerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str) -> Response:
        """Revoke the key: every gateway process refuses it within a second."""
        key = self.get_object()
        keys.revoke(key, user=request.user, via=VIA)
        return Response(ClientKeySerializer(key).data)


class UsageSerializer(serializers.ModelSerializer[Usage]):
    """One minute's usage of a key on a model (``gateway.records.usage``)."""

    class Meta:
        model = Usage
        fields = ("minute", "key", "owner", "model", "requests", "errors", "tokens_in",
                  "tokens_out", "tokens_cached", "refusals", "batch_requests")  # fmt: skip
        read_only_fields = fields


class UsageViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):  # type: ignore[type-arg]
    """What the gateway served, per minute, key, owner and model: viewers read it.

    Filter with ``key``, ``owner``, ``model``, ``minute__gte`` and ``minute__lt`` (ISO 8601
    times); newest first.
    """

    queryset = Usage.objects.order_by("-minute", "key", "owner", "model")
    serializer_class = UsageSerializer
    read_role = VIEWER
    filterset_fields = {"key": ["exact"], "owner": ["exact"], "model": ["exact"],
                        "minute": ["gte", "lt"]}  # fmt: skip
    ordering_fields = ("minute", "requests", "tokens_in", "tokens_out")


class RefusalSerializer(serializers.ModelSerializer[Refusal]):
    """A request or answer the guard refused, by its request id: never the text."""

    class Meta:
        model = Refusal
        fields = ("at", "request_id", "direction", "model", "key", "owner", "judge", "verdict",
                  "categories", "score", "judged", "failures")  # fmt: skip
        read_only_fields = fields


class RefusalViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):  # type: ignore[type-arg]
    """The guard's refusals on the gateway, by the request id each client got
    (``x-request-id``): viewers read them.

    Filter with ``request_id``, ``key``, ``model``, ``direction`` (``request`` or
    ``answer``), ``at__gte`` and ``at__lt`` (ISO 8601 times); newest first. Kept
    ``LLMGW_GATEWAY_REFUSAL_DAYS`` days.
    """

    queryset = Refusal.objects.order_by("-at", "-pk")
    serializer_class = RefusalSerializer
    read_role = VIEWER
    filterset_class = RefusalFilterSet
    ordering_fields = ("at",)


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


class _OneObject(AutoSchema):
    """The history's list route answers one object (the series), not a list of them."""

    def _is_list_view(self, serializer: Any = None) -> bool:
        return False


class HistoryViewSet(viewsets.ViewSet):
    """Traffic over time (``gateway.records.history``): a model's requests, errors, refusals,
    admission holds, tokens, mean in flight and TTFT p50/p99 per point, with its scale
    events and bench runs (``marks``); a key's or an owner's requests and tokens. A point
    a minute over the last hour, ten minutes over a day, an hour over a week."""

    read_role = VIEWER
    serializer_class = HistorySerializer
    schema = _OneObject()

    @extend_schema(parameters=[HistoryQuerySerializer], responses=HistorySerializer)
    def list(self, request: Request) -> Response:
        from gateway.records import history

        q = HistoryQuerySerializer(data=request.query_params)
        q.is_valid(raise_exception=True)
        d = q.validated_data
        start, _, step = history.window(d["span"])
        body: dict[str, Any] = {"span": d["span"], "step_s": step}
        if d.get("model"):
            points = history.series(d["model"], d["span"])
            body["model"] = d["model"]
            body["marks"] = [{"at": at.isoformat(), "kind": kind, "what": what}
                             for at, kind, what in history.marks(d["model"], start)]  # fmt: skip
        else:
            points = history.usage_series(key=d.get("key", ""), owner=d.get("owner", ""),
                                          span=d["span"])  # fmt: skip
            body["key" if d.get("key") else "owner"] = d.get("key") or d.get("owner")
        body["points"] = [p.as_dict() for p in points]
        return Response(body)


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


class PeerViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,  # type: ignore[type-arg]
):
    """Federated llmgw clusters: their models appear here as NAME/MODEL."""

    queryset = Peer.objects.select_related("created_by").order_by("name")
    serializer_class = PeerSerializer
    lookup_field = "name"
    lookup_url_kwarg = "peer"  # a peer's name (lowercase, no /), not a model's
    read_role = VIEWER
    required_role = OPERATOR

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = PeerSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            peer = peers.add_peer(data["name"], data["url"], data["api_key_file"],
                                  user=request.user, via=VIA)  # fmt: skip
        except peers.PeerRefused as error:
            raise serializers.ValidationError(
                {
                    ("key_file" if k == "key_file" else (k or "name")): v
                    for k, v in error.errors.items()
                }
            ) from None
        return Response(PeerSerializer(peer).data, status=201)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        peer = self.get_object()
        try:
            peers.remove_peer(peer.name, user=request.user, via=VIA)
        except peers.PeerRefused as error:
            raise serializers.ValidationError({"name": error.errors[""]}) from None
        return Response(status=204)
