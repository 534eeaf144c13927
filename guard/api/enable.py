"""``POST /api/v1/guard/judges/enable``: enable a known judge, as the console's form does."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from catalog.choices import Surface
from catalog.problems import Problem
from guard import enabling
from llmgw_core.api import problems_response

FIELDS = {"name", "where", "add_to_policy"}


class EnableSerializer(serializers.Serializer[Any]):
    """Which known judge, where it is served, and whether the policy asks it too."""

    name = serializers.CharField()
    where = serializers.ChoiceField(choices=list(enabling.WHERES), default=enabling.WHERE_CPU)
    add_to_policy = serializers.BooleanField(default=False)


class EnabledSerializer(serializers.Serializer[Any]):
    """What enabling did: the judge, whether the catalog changed, and the policy's order."""

    judge = serializers.CharField()
    changed = serializers.BooleanField()
    where = serializers.CharField()
    lines = serializers.ListField(child=serializers.CharField())
    policy = serializers.ListField(child=serializers.CharField())


def _problem(field: str, message: str, code: str) -> Problem:
    return Problem((field,), message, code)


@extend_schema(
    summary="Enable a known judge (CPU, the roomiest GPU class, or sim)",
    request=EnableSerializer,
    responses={200: EnabledSerializer, 201: EnabledSerializer},
)
@api_view(["POST"])
def enable(request: Request) -> Response:
    """Add a known judge to the catalog as a guard model, served as asked; with
    ``add_to_policy`` also append it to the policy's judges. Safe to repeat: 200 when
    nothing changed, 201 when the catalog did. Operators and admins."""
    body = request.data
    if not isinstance(body, dict):
        return problems_response(
            [Problem((), "the body must be a JSON object", "type")], "nothing was enabled"
        )
    unknown = sorted(set(body) - FIELDS)
    problems = [
        _problem(k, f'unknown key "{k}": write {", ".join(sorted(FIELDS))}', "unknown")
        for k in unknown
    ]
    name, where, add = (
        body.get("name"),
        body.get("where", enabling.WHERE_CPU),
        body.get("add_to_policy", False),
    )
    if not isinstance(name, str):
        problems.append(_problem("name", "name must be a known judge's name (a string)", "type"))
    if not isinstance(where, str):
        problems.append(_problem("where", "where must be cpu, gpu or sim", "type"))
    if not isinstance(add, bool):
        problems.append(_problem("add_to_policy", "add_to_policy must be true or false", "type"))
    if problems:
        return problems_response(problems, "nothing was enabled")
    try:
        done = enabling.enable(
            name, where, add_to_policy=add, user=request.user, surface=Surface.API
        )
    except enabling.EnableRefused as exc:
        return problems_response(
            [_problem(f, m, "refused") for f, ms in exc.errors.items() for m in ms],
            "nothing was enabled",
        )
    data = {
        "judge": done.judge,
        "changed": done.changed,
        "where": done.where,
        "lines": done.lines,
        "policy": done.policy,
    }
    return Response(data, status=status.HTTP_201_CREATED if done.changed else status.HTTP_200_OK)
