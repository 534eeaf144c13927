"""The update flow's API (H19flow's part of ``updates``), beside a model's own API.

- ``GET /api/v1/catalog/models/<name>/update/``: the model's last update (viewers);
  ``POST`` there starts one (operators): body ``{"revision": "", "auto": false,
  "canary_percent": null}``, every key optional; 202 with the update, or 400 saying why
  (an update of it running, named; a model with no registry; the mirror refusing).
- ``POST …/update/promote/``: promote its running update now (operators).
- ``POST …/update/cancel/``: end its running update; the model stays as it is.
- ``POST …/update/rollback/``: back to its previous revision while the mirror holds it.
- ``GET /api/v1/updates/runs/``: every model's last update (``?model=``, ``?state=``).

Each change is recorded as made through the API by the token's or the session's user.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from catalog.choices import Surface
from llmgw_core.api import problems_response
from updates import cli, flow, run
from updates.models import UpdateRun


@dataclass(frozen=True)
class _Problem:
    field: str
    message: str
    code: str
    model: str = ""


def _refused(exc: flow.Refused, field: str = "") -> Response:
    return problems_response([_Problem(field, str(exc), "refused")], str(exc))


def _via(request: Request) -> str:
    auth = getattr(request, "auth", None)
    name = getattr(auth, "name", "")
    return f"api, token {name}" if name else "api"


class StartSerializer(serializers.Serializer):  # type: ignore[type-arg]
    """What starting an update takes; every key optional."""

    revision = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")
    auto = serializers.BooleanField(required=False, default=False)
    canary_percent = serializers.IntegerField(required=False, allow_null=True, default=None,
                                              min_value=0, max_value=100)  # fmt: skip


_RUN = inline_serializer(
    "UpdateRun",
    {
        "id": serializers.IntegerField(),
        "model": serializers.CharField(),
        # Text, not enums: "state" names other choice sets in the schema already.
        "state": serializers.CharField(help_text="running, waiting, promoted or failed"),
        "step": serializers.CharField(help_text="fetch, candidate, eval, canary or promote"),
        "candidate": serializers.CharField(),
        "revision": serializers.CharField(),
        "commit": serializers.CharField(),
        "from_commit": serializers.CharField(),
        "score": serializers.FloatField(allow_null=True),
        "threshold": serializers.FloatField(allow_null=True),
        "eval": serializers.DictField(),
        "failed_cases": serializers.ListField(child=serializers.DictField()),
        "canary": serializers.DictField(),
        "reason": serializers.CharField(),
        "started_by": serializers.CharField(),
        "surface": serializers.CharField(),
        "ended_by": serializers.CharField(),
        "created": serializers.CharField(allow_null=True),
        "finished": serializers.CharField(allow_null=True),
        "lines": serializers.ListField(child=serializers.DictField()),
    },
)


def _model_known(name: str) -> bool:
    from catalog.services import stored_specs

    return bool(stored_specs(names=[name]))


@extend_schema(
    summary="A model's last update (GET), or start one (POST, operators)",
    request=StartSerializer,
    responses={200: _RUN, 202: _RUN, 400: dict, 404: dict},
)
@api_view(["GET", "POST"])
def model_update(request: Request, name: str) -> Response:
    """Start an update of a model to new weights, or read its last one."""
    if not _model_known(name):
        return Response({"detail": f'model "{name}" is not in the catalog'}, status=404)
    if request.method == "GET":
        last = UpdateRun.objects.filter(model=name).first()
        if last is None:
            return Response({"detail": f'model "{name}" has not been updated yet'}, status=404)
        return Response(cli.as_json(last))
    body = StartSerializer(data=request.data if isinstance(request.data, dict) else {})
    body.is_valid(raise_exception=True)
    extra = (
        set(request.data) - set(StartSerializer().fields)
        if isinstance(request.data, dict)
        else set()
    )
    if extra:
        key = sorted(extra)[0]
        problem = _Problem(
            key, f'unknown key "{key}": give revision, auto or canary_percent', "unknown_key"
        )
        return problems_response([problem], problem.message)
    try:
        r = run.start(
            name,
            revision=body.validated_data["revision"],
            auto=body.validated_data["auto"],
            canary_percent=body.validated_data["canary_percent"],
            user=request.user,
            surface=Surface.API,
            via=_via(request),
        )
    except flow.Refused as exc:
        return _refused(exc)
    return Response(cli.as_json(r), status=status.HTTP_202_ACCEPTED)


@extend_schema(summary="Promote a model's running update now", request=None,
               responses={200: _RUN, 400: dict, 404: dict})  # fmt: skip
@api_view(["POST"])
def model_promote(request: Request, name: str) -> Response:
    """Promote a model's running update: its origin to the new revision, a roll."""
    if not _model_known(name):
        return Response({"detail": f'model "{name}" is not in the catalog'}, status=404)
    try:
        r = run.promote(name, user=request.user, surface=Surface.API, via=_via(request))
    except flow.Refused as exc:
        return _refused(exc)
    return Response(cli.as_json(r))


@extend_schema(summary="End a model's running update (the model stays as it is)", request=None,
               responses={200: _RUN, 400: dict, 404: dict})  # fmt: skip
@api_view(["POST"])
def model_cancel(request: Request, name: str) -> Response:
    """Cancel a model's running update: its candidate and canary removed."""
    if not _model_known(name):
        return Response({"detail": f'model "{name}" is not in the catalog'}, status=404)
    try:
        r = run.cancel(name, user=request.user, surface=Surface.API, via=_via(request))
    except flow.Refused as exc:
        return _refused(exc)
    return Response(cli.as_json(r))


@extend_schema(
    summary="Go back to a model's previous revision while the mirror holds it",
    request=None,
    responses={200: inline_serializer("RollbackDone", {"detail": serializers.CharField()}),
               400: dict, 404: dict},
)  # fmt: skip
@api_view(["POST"])
def model_rollback(request: Request, name: str) -> Response:
    """Move a model back to ``origin.previous`` (a roll), or say why it cannot."""
    if not _model_known(name):
        return Response({"detail": f'model "{name}" is not in the catalog'}, status=404)
    try:
        said = run.rollback(name, user=request.user, surface=Surface.API, via=_via(request))
    except flow.Refused as exc:
        return _refused(exc)
    return Response({"detail": said})


@extend_schema(
    summary="Every model's last update",
    parameters=[OpenApiParameter("model", str), OpenApiParameter("state", str)],
    responses={
        200: inline_serializer(
            "UpdateRuns", {"results": serializers.ListField(child=serializers.DictField())}
        )
    },
)
@api_view(["GET"])
def runs(request: Request) -> Response:
    """List each model's last update, filtered by model and state."""
    return Response({"results": [cli.as_json(r) for r in latest_runs(request.query_params)]})


def latest_runs(params: Any) -> list[UpdateRun]:
    """Return each model's last update, filtered by ``model`` and ``state``."""
    q = UpdateRun.objects.order_by("model", "-created", "-id")
    model = str(params.get("model") or "").strip()
    if model:
        q = q.filter(model__icontains=model)
    seen: set[str] = set()
    out = []
    for r in q[:5000]:
        if r.model not in seen:
            seen.add(r.model)
            out.append(r)
    state = str(params.get("state") or "").strip()
    return [r for r in out if not state or r.state == state]
