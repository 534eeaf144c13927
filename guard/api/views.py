"""The guard's REST API: check a text, read and set the policy, judges' health."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from guard import policy as policy_rules
from guard import services
from guard.models import JudgeDecision, JudgeHealth, JudgeProbe
from llmgw_admin.api import problems_response
from llmgw_admin.roles import OPERATOR, VIEWER


class CheckSerializer(serializers.Serializer[Any]):
    """A text to judge: a request, and optionally the answer to it."""

    request = serializers.CharField(allow_blank=True, trim_whitespace=False)
    answer = serializers.CharField(
        required=False, allow_null=True, allow_blank=True, trim_whitespace=False
    )


class CheckResultSerializer(serializers.Serializer[Any]):
    """What the chain decided, and who decided it."""

    decision = serializers.ChoiceField(choices=["allow", "refuse"])
    verdict = serializers.CharField(allow_null=True)
    categories = serializers.ListField(child=serializers.CharField())
    judge = serializers.CharField(allow_null=True)
    score = serializers.FloatField(allow_null=True)
    latency_ms = serializers.FloatField(allow_null=True)
    failures = serializers.ListField(child=serializers.DictField())
    judged = serializers.BooleanField()
    failed_open = serializers.BooleanField()


@extend_schema(
    summary="Judge a request (and its answer)",
    request=CheckSerializer,
    responses=CheckResultSerializer,
)
@api_view(["POST"])
def check(request: Request) -> Response:
    """Run the policy's judges on a text; answer the decision and how it was reached."""
    body = CheckSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    result = services.check(body.validated_data["request"], body.validated_data.get("answer"))
    return Response(result)


# Judging is what the gateway and scripts do; a viewer may try a text too (nothing changes).
check.cls.required_role = VIEWER  # type: ignore[attr-defined]


@extend_schema(summary="The guard policy", request=dict, responses=dict)
@api_view(["GET", "PUT"])
def policy(request: Request) -> Response:
    """Answer the policy in force; an operator replaces it (checked, logged)."""
    if request.method == "GET":
        return Response(policy_rules.to_data(services.current_policy()))
    token = request.auth
    try:
        parsed = services.set_policy(
            request.data,
            user=request.user,
            surface="api",
            name=f"{request.user} (token {token.name})" if getattr(token, "name", None) else "",
        )
    except services.PolicyRefused as exc:
        return problems_response(exc.problems, "the guard refuses this policy")
    return Response(policy_rules.to_data(parsed), status=status.HTTP_200_OK)


policy.cls.required_role = OPERATOR  # type: ignore[attr-defined]


@extend_schema(summary="Each judge's health and decisions", responses=dict)
@api_view(["GET"])
def judges(request: Request) -> Response:
    """Answer each judge's answers, failures, last error, last good answer, decisions."""
    decisions: dict[str, list[dict[str, Any]]] = {}
    for d in JudgeDecision.objects.all():
        decisions.setdefault(d.judge, []).append(
            {"verdict": d.verdict, "category": d.category, "count": d.count}
        )
    out = []
    names = list(services.current_policy().judge_models)
    health = {h.judge: h for h in JudgeHealth.objects.all()}
    probes = {p.judge: p for p in JudgeProbe.objects.all()}
    for name in names + sorted((set(health) | set(probes)) - set(names)):
        h = health.get(name)
        out.append(
            {
                "judge": name,
                "in_policy": name in names,
                "answers": h.answers if h else 0,
                "failures": h.failures if h else 0,
                "last_error": h.last_error if h else "",
                "last_error_kind": h.last_error_kind if h else "",
                "last_error_at": h.last_error_at if h else None,
                "last_good_at": h.last_good_at if h else None,
                "last_latency_ms": h.last_latency_ms if h else None,
                "decisions": decisions.get(name, []),
                "probe": (
                    {
                        "at": probes[name].at,
                        "ok": probes[name].ok,
                        "ordinary_verdict": probes[name].ordinary_verdict,
                        "harmful_verdict": probes[name].harmful_verdict,
                        "latency_ms": probes[name].latency_ms,
                        "error": probes[name].error,
                    }
                    if name in probes
                    else None
                ),
            }
        )
    return Response(out)
