"""``GET /api/v1/cluster/status``: whether the control plane's own processes do their part.

The reconciler's last tick (when, which process, how old, and a warning when it is past a
few intervals: the worker or beat stopped), and since when heartbeats can be heard.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from cluster import marks


class TickStatusSerializer(serializers.Serializer):  # type: ignore[type-arg]
    last_tick = serializers.DateTimeField(allow_null=True, help_text="when the last tick finished")
    by = serializers.CharField(
        allow_blank=True, help_text="the process that ran it: role, host and pid"
    )
    age_s = serializers.FloatField(allow_null=True, help_text="seconds since then")
    interval_s = serializers.FloatField(help_text="LLMGW_RECONCILE_INTERVAL")
    stale_after_s = serializers.FloatField(help_text="the age past which it warns")
    stale = serializers.BooleanField(help_text="the reconciler seems to have stopped")
    warning = serializers.CharField(
        allow_blank=True, help_text="what is wrong and what to check; empty if nothing"
    )


class ClusterStatusSerializer(serializers.Serializer):  # type: ignore[type-arg]
    reconciler = TickStatusSerializer()
    heartbeats_heard_since = serializers.DateTimeField(
        allow_null=True,
        help_text="the latest start of a web process (nodes' silence counts from it)",
    )


@extend_schema(
    summary="The reconciler's last tick and since when heartbeats are heard",
    responses={200: ClusterStatusSerializer},
)
@api_view(["GET"])
def cluster_status(request: Request) -> Response:
    """Return the reconciler's last tick (with a warning when it is old) and since when
    heartbeats can be heard."""
    since = marks.heard_since()
    return Response(
        {
            "reconciler": marks.tick_status().as_dict(),
            "heartbeats_heard_since": since.isoformat() if since else None,
        }
    )
