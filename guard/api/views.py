"""The guard's REST API: check a text, read and set the policy, judges' health."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import (
    api_view,
    authentication_classes,
    parser_classes,
    renderer_classes,
)
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.mediatypes import media_type_matches

from catalog.api.serializers import RefusedSerializer
from catalog.problems import Problem
from guard import checks, services
from guard import policy as policy_rules
from guard.api.auth import CachedTokenAuthentication
from guard.models import JudgeDecision, JudgeHealth, JudgeProbe
from llmgw_core.api import TextJSONParser, problems_response
from llmgw_core.roles import OPERATOR, VIEWER


class CheckSerializer(serializers.Serializer[Any]):
    """A text to judge: a request, and optionally the answer to it (the schema's; the
    view reads the body with ``read_check``)."""

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
    request_cut = serializers.BooleanField(
        help_text="the deciding judge read only the request's start and end (too long for "
        "its context): judge its middle too before acting on the verdict"
    )
    answer_cut = serializers.BooleanField(
        help_text="the deciding judge read only the answer's start and end (too long for "
        "its context): judge its middle too before releasing it"
    )


class _JsonOnly(BaseContentNegotiation):
    """The check answers JSON whatever the Accept header: nothing to parse or choose."""

    def select_parser(self, request: Any, parsers: Any) -> Any:
        # Another content type is refused (415) by the caller when no parser is found.
        return (
            parsers[0] if media_type_matches(parsers[0].media_type, request.content_type) else None
        )

    def select_renderer(self, request: Any, renderers: Any, format_suffix: Any = None) -> Any:
        return renderers[0], renderers[0].media_type


@extend_schema(
    summary="Judge a request (and its answer)",
    request=CheckSerializer,
    responses=CheckResultSerializer,
    # The API's two schemes: CachedTokenAuthentication is TokenAuthentication's bearer token.
    auth=[{"apiToken": []}, {"cookieAuth": []}],
)
@api_view(["POST"])
# Gateways call it on every request with the same token: its lookup is kept a second;
# JSON in and out only, with nothing to negotiate.
@authentication_classes([CachedTokenAuthentication, SessionAuthentication])
@parser_classes([TextJSONParser])
@renderer_classes([JSONRenderer])
def check(request: Request) -> Response:
    """Run the policy's judges on a text; answer the decision and how it was reached."""
    read = read_check(request.data)
    if isinstance(read, list):
        return problems_response(read, "the guard cannot read this check")
    result = checks.check(*read)
    return Response(result)


_CHECK_KEYS = ("request", "answer")


def read_check(data: Any) -> tuple[str, str | None] | list[Problem]:
    """Return a check's request and answer, or the problems with its body.

    ``request`` is a string (empty allowed), ``answer`` a string or null or absent; no
    other key (a misspelt "answer" would judge the request alone). Read by hand rather
    than by ``CheckSerializer``: building a serializer cost more than the rest of the
    check's own work.
    """
    if not isinstance(data, dict):
        return [
            Problem(
                (),
                'send a JSON object: {"request": "the text", "answer": "optional"}',
                "invalid",
            )
        ]
    problems = [
        Problem((key,), 'unknown key: a check takes "request" and optionally "answer"', "unknown")
        for key in data
        if key not in _CHECK_KEYS
    ]
    text = data.get("request")
    if "request" not in data:
        problems.append(Problem(("request",), "missing: send the text to judge", "required"))
    elif not isinstance(text, str):
        problems.append(
            Problem(("request",), f"must be a string, not {_json_type(text)}", "invalid")
        )
    answer = data.get("answer")
    if answer is not None and not isinstance(answer, str):
        problems.append(
            Problem(
                ("answer",),
                f"must be a string (the answer to judge) or null, not {_json_type(answer)}",
                "invalid",
            )
        )
    if problems:
        return problems
    return text, answer


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


# Judging is what the gateway and scripts do; a viewer may try a text too (nothing changes).
check.cls.required_role = VIEWER  # type: ignore[attr-defined]
check.cls.content_negotiation_class = _JsonOnly  # type: ignore[attr-defined]


class PolicyJudgeSerializer(serializers.Serializer[Any]):
    """The policy's judges and how a Controversial verdict counts."""

    models = serializers.ListField(child=serializers.CharField(), min_length=1)
    controversial = serializers.ChoiceField(choices=list(policy_rules.CONTROVERSIAL_AS))


class PolicySerializer(serializers.Serializer[Any]):
    """The guard policy as the API reads and writes it (``guard.policy``; the schema's)."""

    judge = PolicyJudgeSerializer()
    fail = serializers.ChoiceField(choices=list(policy_rules.FAILS))
    directions = serializers.ListField(
        child=serializers.ChoiceField(choices=list(policy_rules.DIRECTIONS))
    )
    categories = serializers.ListField(child=serializers.CharField())


class PolicyPatchSerializer(PolicySerializer):
    """Some of the policy's keys: those given replace the policy's, the rest are kept."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["partial"] = True
        super().__init__(*args, **kwargs)


# Every key a PUT must give: it replaces the whole policy (an empty body reset it once).
POLICY_FIELDS = (
    ("judge", "models"),
    ("judge", "controversial"),
    ("fail",),
    ("directions",),
    ("categories",),
)


def _given(data: Any) -> set[tuple[str, ...]]:
    """Return the policy keys a body gives (``judge.models`` written dotted or nested)."""
    given: set[tuple[str, ...]] = set()
    for key, value in data.items():
        if key == "judge" and isinstance(value, dict):
            given |= {("judge", str(k)) for k in value}
        elif isinstance(key, str) and key.startswith("judge."):
            given.add(("judge", key.partition(".")[2]))
        else:
            given.add((str(key),))
    return given


def _patched(current: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """Return the policy in force with a PATCH body's keys put in (unknown keys kept, for
    the check to name)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in current.items()}
    for key, value in data.items():
        if key == "judge" and isinstance(value, dict):
            out["judge"].update(value)
        elif isinstance(key, str) and key.startswith("judge."):
            out["judge"][key.partition(".")[2]] = value
        else:
            out[key] = value
    return out


@extend_schema(methods=["GET"], summary="The guard policy", responses=PolicySerializer)
@extend_schema(
    methods=["PUT"],
    summary="Replace the guard policy (every key given)",
    request=PolicySerializer,
    responses={200: PolicySerializer, 400: RefusedSerializer},
)
@extend_schema(
    methods=["PATCH"],
    summary="Change some of the guard policy's keys (the rest are kept)",
    request=PolicyPatchSerializer,
    responses={200: PolicySerializer, 400: RefusedSerializer},
)
@api_view(["GET", "PUT", "PATCH"])
def policy(request: Request) -> Response:
    """Answer the policy in force; an operator replaces it (PUT, every key) or changes some
    of its keys (PATCH); checked and logged."""
    if request.method == "GET":
        return Response(policy_rules.to_data(services.current_policy()))
    data = request.data
    if not isinstance(data, dict):
        problems = [Problem((), "send a JSON object: the policy's keys", "not_mapping")]
        return problems_response(problems, "the guard refuses this policy")
    if request.method == "PUT":
        missing = [path for path in POLICY_FIELDS if path not in _given(data)]
        if missing:
            every = ", ".join(".".join(p) for p in POLICY_FIELDS)
            problems = [
                Problem(
                    path,
                    f"missing: PUT replaces the whole policy, so give every key ({every}); "
                    "PATCH changes only the keys given",
                    "required",
                )
                for path in missing
            ]
            return problems_response(problems, "the guard refuses this policy")
    # A PATCH that leaves the categories keeps those in force: one its judges cannot
    # report is removed (guard judge use's way) rather than refused.
    categories_given = request.method == "PUT" or "categories" in data
    if request.method == "PATCH":
        data = _patched(policy_rules.to_data(services.current_policy()), data)
    token = request.auth
    try:
        parsed = services.set_policy(
            data,
            user=request.user,
            surface="api",
            name=f"{request.user} (token {token.name})" if getattr(token, "name", None) else "",
            categories_given=categories_given,
        )
    except services.PolicyRefused as exc:
        return problems_response(exc.problems, "the guard refuses this policy")
    return Response(policy_rules.to_data(parsed), status=status.HTTP_200_OK)


policy.cls.required_role = OPERATOR  # type: ignore[attr-defined]


class JudgeDecisionCountSerializer(serializers.Serializer[Any]):
    """How often a judge gave one verdict in one category."""

    verdict = serializers.CharField()
    category = serializers.CharField(allow_blank=True)
    count = serializers.IntegerField()


class JudgeProbeSerializer(serializers.Serializer[Any]):
    """The judge's last probe: an ordinary and a harmful text."""

    at = serializers.DateTimeField()
    ok = serializers.BooleanField()
    ordinary_verdict = serializers.CharField(allow_blank=True, allow_null=True)
    harmful_verdict = serializers.CharField(allow_blank=True, allow_null=True)
    latency_ms = serializers.FloatField(allow_null=True)
    error = serializers.CharField(allow_blank=True)


class JudgeStatusSerializer(serializers.Serializer[Any]):
    """One judge: in the policy or not, its answers and failures, last error, decisions."""

    judge = serializers.CharField()
    in_policy = serializers.BooleanField()
    answers = serializers.IntegerField()
    failures = serializers.IntegerField()
    last_error = serializers.CharField(allow_blank=True)
    last_error_kind = serializers.CharField(allow_blank=True)
    last_error_at = serializers.DateTimeField(allow_null=True)
    last_good_at = serializers.DateTimeField(allow_null=True)
    last_latency_ms = serializers.FloatField(allow_null=True)
    decisions = JudgeDecisionCountSerializer(many=True)
    probe = JudgeProbeSerializer(allow_null=True)


@extend_schema(
    summary="Each judge's health and decisions", responses=JudgeStatusSerializer(many=True)
)
@api_view(["GET"])
def judges(request: Request) -> Response:
    """Answer each judge's answers, failures, last error, last good answer, decisions."""
    # This process's checks not yet written: a caller reads what it just caused.
    checks.flush_records()
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
