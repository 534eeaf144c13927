"""``GET /api/v1/cluster/gpu-classes/``: the cluster's GPU classes, free and total cards.

Read-only (viewer role), from ``cluster.inventory.gpu_classes``: the same figures the
catalog's model form shows beside each profile's ``gpu_class``. Mounted by one line in
``cluster/api/urls.py`` (``include("cluster.api.classes")``).
"""

from __future__ import annotations

import dataclasses

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from cluster import inventory


class GpuClassSerializer(serializers.Serializer):  # type: ignore[type-arg]
    """One GPU class of the cluster (``cluster.inventory.ClassInfo``)."""

    name = serializers.CharField(help_text="The class, as agents report it: nvidia-l4-24gb.")
    total = serializers.IntegerField(help_text="Its cards (or MIG instances) on every node.")
    free = serializers.IntegerField(
        help_text="Those no replica holds, on ready nodes that are not cordoned."
    )
    mig = serializers.BooleanField(help_text="A MIG instance class (one replica per instance).")
    nodes = serializers.IntegerField(help_text="The nodes that have the class.")
    best_free_on_one_node = serializers.IntegerField(
        help_text="The most free on one node: the widest one-node profile that fits now."
    )
    free_per_node = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="Free cards of each ready, uncordoned node that has the class, most first.",
    )


@extend_schema(
    summary="The cluster's GPU classes with free and total cards",
    responses=GpuClassSerializer(many=True),
)
@api_view(["GET"])
def gpu_class_list(request: Request) -> Response:
    """List every GPU class the nodes reported, by name."""
    return Response([dataclasses.asdict(c) for c in inventory.gpu_classes()])


urlpatterns = [path("", gpu_class_list, name="gpu-classes")]
