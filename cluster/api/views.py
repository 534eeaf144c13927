"""The cluster's REST API: operators' views and actions, and the agents' endpoints.

Agents authenticate with their node token (docs/agent-protocol.md) and may speak only for
their own node; operators with a session or an API token and the roles of llmgw_core.roles.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import Prefetch, QuerySet
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.decorators import action, api_view, authentication_classes, permission_classes
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import AllowAny, BasePermission
from rest_framework.request import Request
from rest_framework.response import Response

from catalog import rules
from catalog.converters import lookup_regex
from catalog.models import ServedModel
from catalog.services import stored_specs
from cluster import (
    agentbeat,
    agentinput,
    agentjoin,
    agentreport,
    benchrun,
    details,
    services,
    tenancy,
)
from cluster.address import peer_address
from cluster.api.serializers import (
    CardSerializer,
    ClusterActionSerializer,
    FacilityBudgetSerializer,
    JoinTokenSerializer,
    NodeAddressSerializer,
    NodeDetailSerializer,
    NodeReplicaSerializer,
    NodeSerializer,
    QuotaSerializer,
    ReplicaLogSerializer,
    ReplicaSerializer,
)
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
from cluster.replace import DrainRefused
from llmgw_core.roles import ADMIN, OPERATOR, has_role
from llmgw_core.shownonce import ShownOnceActions


class DrainSerializer(serializers.Serializer[None]):
    """A drain's options."""

    force = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Stop replicas that have no room elsewhere even if their model goes dark.",
    )


def _log(request: Request, action: str, target: str, detail: str = "") -> None:
    token = request.auth
    via = f"token {token.name}" if getattr(token, "name", None) else ""
    services.log_action(request.user, action, target, detail, via)


def _fingerprints() -> dict[str, dict[str, str]]:
    """Return each model's current profile fingerprints (the catalog in six queries)."""
    return {
        m.name: {p.name: rules.fingerprint(p) for p in rules.normalize(m).profiles}
        for m in stored_specs()
    }


def _held() -> dict[tuple[int, int], int]:
    held = {}
    for node_id, cards, replica_id in Assignment.objects.filter(replica__desired=True).values_list(
        "node_id", "cards", "replica_id"
    ):
        for index in cards:
            held[(node_id, index)] = replica_id
    return held


class NodeViewSet(viewsets.ReadOnlyModelViewSet):  # type: ignore[type-arg]
    """Nodes with their cards; operators cordon, uncordon and drain them."""

    serializer_class = NodeSerializer
    lookup_field = "name"
    # Any name, rack/1 included; not one ending in an action's word.
    lookup_value_regex = lookup_regex("cordon", "uncordon", "release", "address", "drain")
    filterset_fields = ("health", "cordoned", "simulated")

    def get_queryset(self) -> QuerySet[Node]:
        return Node.objects.prefetch_related("cards")

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "held": _held()}

    @extend_schema(responses=NodeDetailSerializer)
    def retrieve(self, request: Request, name: str) -> Response:
        """A node with its cards (and the replica holding each) and the replicas it runs."""
        node = self.get_object()
        data = dict(NodeSerializer(node, context=self.get_serializer_context()).data)
        detail = details.node_detail(node, has_role(request.user, OPERATOR))
        data["cards"] = detail["cards"]
        data["replicas"] = NodeReplicaSerializer(detail["replicas"], many=True).data
        return Response(data)

    @extend_schema(request=None, responses=NodeSerializer)
    @action(detail=True, methods=["post"])
    def cordon(self, request: Request, name: str) -> Response:
        node = services.set_cordon(self.get_object(), True)
        _log(request, "cordon", f"node {name}")
        return Response(NodeSerializer(node, context=self.get_serializer_context()).data)

    @extend_schema(request=None, responses=NodeSerializer)
    @action(detail=True, methods=["post"])
    def uncordon(self, request: Request, name: str) -> Response:
        node = services.set_cordon(self.get_object(), False)
        _log(request, "uncordon", f"node {name}")
        return Response(NodeSerializer(node, context=self.get_serializer_context()).data)

    @extend_schema(request=None, responses=NodeSerializer)
    @action(detail=True, methods=["post"])
    def release(self, request: Request, name: str) -> Response:
        """Let the next join under this name take the node; its node token stops working."""
        node = agentjoin.release(self.get_object(), request.user.get_username())
        _log(request, "release", f"node {name}", "node token dropped; the next join takes it")
        return Response(NodeSerializer(node, context=self.get_serializer_context()).data)

    @extend_schema(request=NodeAddressSerializer, responses=NodeSerializer)
    @action(detail=True, methods=["post"])
    def address(self, request: Request, name: str) -> Response:
        """Reach the node's engines at an address an operator allows (empty: the seen one)."""
        data = request.data if isinstance(request.data, dict) else {}
        value = data.get("address", "")
        if not isinstance(value, str):
            return Response(
                {"detail": "address must be text", "errors": {"address": ["must be text"]}},
                status=400,
            )
        try:
            node = agentjoin.allow_address(self.get_object(), value)
        except agentinput.AgentError as exc:
            return Response(
                {"detail": str(exc), "errors": {"address": [str(exc)]}}, status=exc.status
            )
        _log(
            request, "address", f"node {name}", node.allowed_address or "the address it is seen at"
        )
        return Response(NodeSerializer(node, context=self.get_serializer_context()).data)

    @extend_schema(request=DrainSerializer, responses={200: dict, 409: dict})
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, name: str) -> Response:
        """Cordon the node and move its replicas off it, each replaced before it stops.

        Refused with 409, changing nothing, when a model would be left with no ready
        replica (no room elsewhere for its replacement), unless ``{"force": true}``.
        """
        node = self.get_object()
        if not isinstance(request.data, dict):
            why = 'the body must be a JSON object, like {"force": true}, or empty'
            return Response({"detail": why, "errors": {"body": [why]}}, status=400)
        body = DrainSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        force = body.validated_data.get("force", False)
        try:
            done = services.drain(node, force=force)
        except DrainRefused as exc:
            return Response(
                {"detail": str(exc), "errors": {"force": [str(exc)]}, "dark": sorted(exc.models)},
                status=exc.status,
            )
        _log(request, "drain", f"node {name}", done.summary)
        return Response(
            {
                "node": name,
                "cordoned": True,
                "replacing": {str(k): v for k, v in done.replacing.items()},
                "replicas_stopped": len(done.stopped),
                "dark": done.dark,
            }
        )


class CardViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):  # type: ignore[type-arg]
    """Every card of every node, and which replica holds it."""

    serializer_class = CardSerializer
    filterset_fields = ("gpu_class",)

    def get_queryset(self) -> QuerySet[Card]:
        return Card.objects.select_related("node")

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "held": _held()}


class ReplicaViewSet(viewsets.ReadOnlyModelViewSet):  # type: ignore[type-arg]
    """Replicas with where they run, their state and why; operators restart them."""

    serializer_class = ReplicaSerializer
    filterset_fields = ("model_name", "state", "desired")

    def get_queryset(self) -> QuerySet[Replica]:
        return Replica.objects.prefetch_related(
            Prefetch("assignments", queryset=Assignment.objects.select_related("node"))
        )

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "fingerprints": _fingerprints()}

    @extend_schema(responses={200: ReplicaLogSerializer, 403: dict})
    @action(detail=True, methods=["get"])
    def log(self, request: Request, pk: str) -> Response:
        """The last lines of the replica's engine (stdout and stderr) on each of its nodes,
        as its agents last reported them; secrets masked. Operators only."""
        if not has_role(request.user, OPERATOR):
            return Response({"detail": "an engine's log needs the operator role"}, status=403)
        replica = self.get_object()
        nodes = details.replica_log(replica)
        return Response(
            ReplicaLogSerializer(
                {"replica": replica.pk, "model": replica.model_name, "nodes": nodes}
            ).data
        )

    @extend_schema(request=None, responses=ReplicaSerializer)
    @action(detail=True, methods=["post"])
    def restart(self, request: Request, pk: str) -> Response:
        replica = services.restart_replica(self.get_object())
        _log(
            request,
            "restart",
            f"replica {pk} of {replica.model_name}",
            f"generation {replica.generation}",
        )
        return Response(ReplicaSerializer(replica, context=self.get_serializer_context()).data)


class FacilityBudgetViewSet(viewsets.ModelViewSet):  # type: ignore[type-arg]
    """Power caps on racks, rows, rooms and sites."""

    queryset = FacilityBudget.objects.all()
    serializer_class = FacilityBudgetSerializer

    def perform_create(self, serializer: Any) -> None:
        b = serializer.save()
        _log(self.request, "budget set", f"{b.level} {b.name}", f"{b.cap_watts:g} W")

    def perform_update(self, serializer: Any) -> None:
        b = serializer.save()
        _log(self.request, "budget set", f"{b.level} {b.name}", f"{b.cap_watts:g} W")

    def perform_destroy(self, instance: FacilityBudget) -> None:
        _log(self.request, "budget removed", f"{instance.level} {instance.name}")
        instance.delete()


class QuotaViewSet(viewsets.ModelViewSet):  # type: ignore[type-arg]
    """Capacity quotas per owner (org:, team:, project:): cards per GPU class and CPU
    cores its models' replicas may hold, with what they hold now (``in_use``). A write
    goes through ``cluster.tenancy`` (checked, logged); a replica past a quota waits with
    it named."""

    queryset = Quota.objects.all()
    serializer_class = QuotaSerializer

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        if self.request is not None and self.request.method == "GET":
            context["usage"] = tenancy.usage(dict(ServedModel.objects.values_list("name", "owner")))
        return context

    def _write(self, serializer: Any, owner: str) -> None:
        data = serializer.validated_data
        try:
            serializer.instance = tenancy.set_quota(
                owner, parent=data.get("parent", ""), cards=data.get("cards", {}),
                cpu_cores=data.get("cpu_cores"), tpm=data.get("tpm", 0),
                user=self.request.user, via="api",
            )  # fmt: skip
        except tenancy.QuotaRefused as error:
            raise serializers.ValidationError(error.errors) from None

    def perform_create(self, serializer: Any) -> None:
        self._write(serializer, serializer.validated_data.get("owner", ""))

    def perform_update(self, serializer: Any) -> None:
        data = serializer.validated_data
        instance = serializer.instance
        if "owner" in data and data["owner"] != instance.owner:
            raise serializers.ValidationError({"owner": ["an owner's quota keeps its owner: "
                                                         "make another for a new owner"]})  # fmt: skip
        for field in ("parent", "cards", "cpu_cores", "tpm"):
            data.setdefault(field, getattr(instance, field))
        self._write(serializer, instance.owner)

    def perform_destroy(self, instance: Quota) -> None:
        tenancy.delete_quota(instance.owner, user=self.request.user, via="api")


@extend_schema_view(revoke=extend_schema(request=None, responses=JoinTokenSerializer))
class JoinTokenViewSet(
    ShownOnceActions,
    mixins.ListModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,  # type: ignore[type-arg]
):
    """Join tokens for new nodes: the secret is shown once, on creation."""

    queryset = JoinToken.objects.all()
    serializer_class = JoinTokenSerializer
    read_role = ADMIN
    required_role = ADMIN

    def issue(self, request: Request, data: dict[str, Any]) -> tuple[JoinToken, str]:
        token, secret = JoinToken.issue(
            data["name"],
            expires=data.get("expires"),
            max_uses=data.get("max_uses"),
            created_by=request.user,
        )
        _log(request, "join token issued", f"join token {token.pk} ({token.name})")
        return token, secret

    def revoked(self, request: Request, row: JoinToken) -> None:
        _log(request, "join token revoked", f"join token {row.pk} ({row.name})")


@extend_schema(
    summary="Roll a model's replicas that run an old definition",
    request=None,
    responses={202: dict},
)
@api_view(["POST"])
def roll_model(request: Request, name: str) -> Response:
    """Start replacements for outdated replicas; old ones stop once the new are ready."""
    try:
        started = services.roll(name)
    except agentinput.AgentError as exc:
        return Response({"detail": str(exc)}, status=exc.status)
    _log(request, "roll", f"model {name}", f"replacements {started}")
    return Response({"model": name, "replacements": started}, status=status.HTTP_202_ACCEPTED)


@extend_schema(
    summary="Ask for an on-demand model (the gateway calls this)",
    request=None,
    responses={202: dict},
)
@api_view(["POST"])
def demand_model(request: Request, name: str) -> Response:
    """Record demand for a model; an on-demand model is started for it."""
    try:
        d = services.demand(name)
    except agentinput.AgentError as exc:
        return Response({"detail": str(exc)}, status=exc.status)
    return Response({"model": name, "last_demand": d.last_demand}, status=status.HTTP_202_ACCEPTED)


class BenchSerializer(serializers.Serializer[None]):
    """Which profile the capacity bench measures."""

    profile = serializers.CharField(
        required=False,
        default="",
        allow_blank=True,
        max_length=200,
        help_text="The profile to measure; empty: the first ready replica's.",
    )


@extend_schema(
    summary="Measure a profile's capacity and write its router weight (the capacity bench)",
    request=BenchSerializer,
    responses={202: dict, 400: dict, 404: dict, 409: dict},
)
@api_view(["POST"])
def bench_model(request: Request, name: str) -> Response:
    """Start the bench on a ready replica; its end is logged as a cluster action
    (``bench done`` with the table, or ``bench failed``)."""
    body = BenchSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    profile = body.validated_data["profile"] or None
    m = next(iter(stored_specs(names=[name])), None)
    if m is None:
        return Response({"detail": f"model {name} is not in the catalog"}, status=404)
    if profile and rules.profile_by_name(m, profile) is None:
        names = ", ".join(p.name for p in m.profiles) or "none"
        return Response({"detail": f"model {name} has no profile {profile} (its profiles: "
                                   f"{names})"}, status=404)  # fmt: skip
    try:
        benchrun.ready_replica(name, profile)
    except benchrun.BenchError as exc:
        return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
    token = request.auth
    via = f"token {token.name}" if getattr(token, "name", None) else "api"
    benchrun.start(name, profile, request.user, "api", via)
    return Response({"model": name, "profile": profile or "", "status": "started"},
                    status=status.HTTP_202_ACCEPTED)  # fmt: skip


roll_model.cls.required_role = OPERATOR  # type: ignore[attr-defined]
bench_model.cls.required_role = OPERATOR  # type: ignore[attr-defined]
demand_model.cls.required_role = OPERATOR  # type: ignore[attr-defined]


# The agents' side.


class ClusterActionViewSet(viewsets.ReadOnlyModelViewSet):  # type: ignore[type-arg]
    """Operators' actions on the cluster, newest first: who did what, and when."""

    queryset = ClusterAction.objects.all()
    serializer_class = ClusterActionSerializer
    filterset_fields = ("action",)


class NodeTokenAuthentication(BaseAuthentication):
    """Authenticate an agent by its node token; the request's ``auth`` is its Node."""

    def authenticate(self, request: Any) -> tuple[None, Node] | None:
        parts = get_authorization_header(request).decode(errors="replace").split()
        if len(parts) != 2 or parts[0].lower() != "bearer":
            raise AuthenticationFailed("send the node token: Authorization: Bearer llmgw_node_...")
        node = agentjoin.node_for_token(parts[1])
        if node is None:
            raise AuthenticationFailed("unknown node token: join again with a join token")
        return None, node

    def authenticate_header(self, request: Any) -> str:
        return 'Bearer realm="agent"'


class NodeTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """Describe node-token authentication in the OpenAPI schema."""

    target_class = "cluster.api.views.NodeTokenAuthentication"
    name = "nodeToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "bearerFormat": "llmgw_node_…"}


class IsAgent(BasePermission):
    """Allow requests that carry a valid node token."""

    def has_permission(self, request: Any, view: Any) -> bool:
        return isinstance(request.auth, Node)


def _agent_error(exc: agentinput.AgentError) -> Response:
    return Response({"detail": str(exc)}, status=exc.status)


def _peer(request: Request) -> str:
    """Return the address an agent's request came from (cluster.address.peer_address)."""
    return peer_address(
        request.META.get("REMOTE_ADDR", ""),
        request.META.get("HTTP_X_FORWARDED_FOR", ""),
        settings.LLMGW_TRUSTED_PROXIES,
    )


@extend_schema(summary="Join with a join token (agents)", request=dict, responses={201: dict})
@api_view(["POST"])
@authentication_classes([])
@permission_classes([AllowAny])
def agent_join(request: Request) -> Response:
    """Admit a node under a new or released name, or its own agent again; answer its token.

    A node that has joined is joined again only with its node token, sent as
    ``Authorization: Bearer llmgw_node_…`` beside the join token (docs/agent-protocol.md).
    """
    data = request.data if isinstance(request.data, dict) else {}
    parts = get_authorization_header(request).decode(errors="replace").split()
    node_token = parts[1] if len(parts) == 2 and parts[0].lower() == "bearer" else None
    try:
        node, secret = agentjoin.join(
            data.get("token"),
            data.get("name"),
            data.get("inventory"),
            node_token=node_token,
            address=_peer(request),
        )
    except agentinput.AgentError as exc:
        return _agent_error(exc)
    return Response({"node": node.name, "node_token": secret}, status=status.HTTP_201_CREATED)


@extend_schema(summary="Heartbeat with inventory (agents)", request=dict, responses=dict)
@api_view(["POST"])
@authentication_classes([NodeTokenAuthentication])
@permission_classes([IsAgent])
def agent_heartbeat(request: Request) -> Response:
    """Record a node's heartbeat and inventory.

    In the web process cluster.api.lean answers the heartbeats that succeed, with the same
    service; this view answers the rest (every refusal), and the test client.
    """
    data = request.data if isinstance(request.data, dict) else {}
    try:
        node = agentbeat.heartbeat(request.auth, data.get("inventory"), _peer(request))
    except agentinput.AgentError as exc:
        return _agent_error(exc)
    return Response(
        {
            "node": node.name,
            "state": "cordoned" if node.cordoned else "ready",
            "desired_version": node.desired_version,
        }
    )


@extend_schema(summary="The node's desired replicas (agents)", responses=dict)
@api_view(["GET"])
@authentication_classes([NodeTokenAuthentication])
@permission_classes([IsAgent])
def agent_desired(request: Request) -> Response:
    """Answer the replicas this node should run now (as cluster.api.lean does, mostly)."""
    return Response(agentbeat.desired_list(request.auth))


@extend_schema(summary="Report replica states (agents)", request=dict, responses=dict)
@api_view(["POST"])
@authentication_classes([NodeTokenAuthentication])
@permission_classes([IsAgent])
def agent_report(request: Request) -> Response:
    """Apply state reports for this node's replicas."""
    data = request.data if isinstance(request.data, dict) else {}
    try:
        n = agentreport.report(request.auth, data.get("reports"))
    except agentinput.AgentError as exc:
        return _agent_error(exc)
    return Response({"accepted": n})
