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
from gateway.api.serializers import (
    ClientKeySerializer,
    CreatedKeySerializer,
    HistoryQuerySerializer,
    HistorySerializer,
    PeerSerializer,
    RefusalSerializer,
    UsageSerializer,
)
from gateway.filtersets import RefusalFilterSet
from gateway.models import ClientKey, Peer, Refusal, Usage
from gateway.records import history
from llmgw_core.api import shown_once
from llmgw_core.roles import OPERATOR, VIEWER

VIA = "api"


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
