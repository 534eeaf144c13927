"""The updates app's API: the nodes' side of the mirror, the update check, and the update
flow beside a model's own API.

Nodes (their node token, ``Authorization: Bearer llmgw_node_…``), for a model placed on
them (a replica of it assigned to the node):

- ``GET /api/v1/updates/mirror/models/<name>/`` the model's files in the mirror at the
  revision it pins: 200 ``{"state": "done", "revision", "folder", "files": [{"path",
  "sha256", "bytes", "url"}]}``; 202 ``{"state": "queued" | "fetching", "bytes_done",
  "bytes_total"}`` (the fetch is queued by the first node to ask: four nodes asking cost
  one fetch; ``?enqueue=0``, a node that needs no weights to start, has it queued only
  for a model with an origin); 409 ``{"state": "failed", "reason"}``;
  404 ``{"state": "off" | "none", "detail"}`` when the mirror is off or the model's source
  has nothing to mirror: the node fetches as it did before;
- ``GET /api/v1/updates/mirror/files/<fetch>/<path>`` a file's bytes, with ``Range``
  (206 and ``Content-Range``), ``ETag`` its sha256 (sent on a lean path in front of Django
  in the web process: updates.lean).

Operators (an API token or a session): ``POST /api/v1/catalog/models/<name>/update-check/``
checks one model now and answers the check's JSON object (``updates.check.Result``);
viewers read the last one with ``GET`` there.

The update flow, beside a model's own API:

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

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.http import require_http_methods
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from catalog.choices import Surface
from catalog.services import stored_specs
from cluster.agentjoin import node_for_token
from cluster.models import Assignment
from llmgw_core.api import problems_response
from updates import checking, cli, flow, mirror, run
from updates.models import ACTIVE, Fetch, FetchState, UpdateRun

_CHUNK = 4 << 20
# ASCII digits only (``\d`` takes every script's digits), in a header of bounded length:
# int() refuses a number of more than 4,300 digits.
_RANGE = re.compile(r"bytes=([0-9]+)-([0-9]*)", re.ASCII)
RANGE_MAX_CHARS = 100
RANGE_HELP = (
    "Range must be bytes=START- or bytes=START-END, in ASCII digits, at most "
    f"{RANGE_MAX_CHARS} characters"
)


def _node(request: HttpRequest) -> Any:
    """Return the node a request's node token speaks for, or None."""
    parts = request.headers.get("Authorization", "").split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return None
    return node_for_token(parts[1])


def _unauthorized() -> JsonResponse:
    response = JsonResponse(
        {"detail": "send the node token: Authorization: Bearer llmgw_node_..."}, status=401
    )
    response["WWW-Authenticate"] = 'Bearer realm="agent"'
    return response


def _placed_on(node: Any, model: str) -> bool:
    return Assignment.objects.filter(node=node, replica__model__name=model).exists()


def _not_placed(model: str) -> JsonResponse:
    return JsonResponse(
        {"state": "none", "detail": f'no replica of model "{model}" is placed on this node'},
        status=403,
    )


@require_http_methods(["GET"])
def node_manifest(request: HttpRequest, name: str) -> HttpResponse:
    """Answer a model's files in the mirror to a node it is placed on."""
    node = _node(request)
    if node is None:
        return _unauthorized()
    if not _placed_on(node, name):
        return _not_placed(name)
    if not mirror.enabled():
        return JsonResponse(
            {"state": "off", "detail": "the mirror is off (LLMGW_MIRROR=off)"}, status=404
        )
    enqueue = request.GET.get("enqueue", "1") not in ("0", "false")
    try:
        found = mirror.manifest(name, enqueue=enqueue, by=f"node {node.name}")
    except mirror.MirrorError as exc:
        return JsonResponse({"state": "none", "detail": str(exc)}, status=404)
    f = found.fetch
    if found.state == "done" and f is not None:
        return JsonResponse(
            {
                "state": "done",
                "revision": f.commit,
                "folder": f.folder,
                "files": [
                    {
                        "path": x["path"],
                        "sha256": x["sha256"],
                        "bytes": x["bytes"],
                        # Percent-encoded: a name with a space, "#" or "?" is a path too.
                        "url": f"/api/v1/updates/mirror/files/{f.pk}/{quote(x['path'])}",
                    }
                    for x in found.files
                ],
            }
        )
    if found.state == "failed":
        return JsonResponse({"state": "failed", "reason": found.message}, status=409)
    if f is None:
        return JsonResponse({"state": "absent", "detail": found.message}, status=404)
    return JsonResponse(
        {"state": f.state, "bytes_done": f.bytes_done, "bytes_total": f.bytes_total}, status=202
    )


@dataclass(frozen=True)
class Held:
    """A file of a done fetch, as the mirror holds it."""

    path: Path
    size: int
    sha256: str


def held_file(node: Any, pk: int, path: str) -> Held | str:
    """Return the file ``path`` of done fetch ``pk`` for ``node``, or why not: "missing" (no
    such fetch, file, or file on disk), or the model's name when it is not placed on it."""
    f = Fetch.objects.filter(pk=pk, state=FetchState.DONE).first()
    listed = {x["path"]: x for x in (f.files if f is not None else [])}
    if f is None or path not in listed:
        return "missing"
    if not _placed_on(node, f.model):
        return f.model
    try:
        # None: a blob changed since its bytes were checked (set aside, fetched again).
        file_path = mirror.served_file(f.folder, path, str(listed[path]["sha256"] or ""))
        if file_path is None:
            return "missing"
        size = file_path.stat().st_size
    except (mirror.MirrorError, OSError):
        return "missing"
    return Held(file_path, size, str(listed[path]["sha256"] or ""))


def byte_range(header: str, size: int) -> tuple[int, int, int]:
    """Return what a ``Range`` header asks of a file of ``size`` bytes: (status, start, end):
    200 the whole file (no header), 206 bytes ``start`` to ``end`` (excluded), 400 a header
    not of the form ``bytes=START-`` or ``bytes=START-END`` (ASCII digits, at most
    ``RANGE_MAX_CHARS`` characters), 416 a range past the end."""
    header = header.strip()
    if not header:
        return 200, 0, size
    if len(header) > RANGE_MAX_CHARS:
        return 400, 0, 0
    m = _RANGE.fullmatch(header)
    if m is None:
        return 400, 0, 0
    start = int(m.group(1))
    end = min(size, int(m.group(2)) + 1) if m.group(2) else size
    if start >= size or end <= start:
        return 416, 0, 0
    return 206, start, end


def file_headers(held: Held, status: int, start: int, end: int) -> dict[str, str]:
    """Return the headers of an answer with bytes ``start`` to ``end`` of a held file."""
    headers = {
        "Content-Type": "application/octet-stream",
        "Content-Length": str(end - start),
        "Accept-Ranges": "bytes",
    }
    if held.sha256:
        headers["ETag"] = f'"{held.sha256}"'
    if status == 206:
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{held.size}"
    return headers


@require_http_methods(["GET", "HEAD"])
def node_file(request: HttpRequest, pk: int, path: str) -> HttpResponse:
    """Send one file of a done fetch to a node, whole or from a ``Range``.

    The web process answers one that is sent (200, 206) on a lean path in front of Django
    (updates.lean); anything else, and every request under another server, is answered here.
    """
    node = _node(request)
    if node is None:
        return _unauthorized()
    held = held_file(node, pk, path)
    if held == "missing":
        return JsonResponse({"detail": "the mirror holds no such file"}, status=404)
    if isinstance(held, str):
        return _not_placed(held)
    status, start, end = byte_range(request.headers.get("Range", ""), held.size)
    if status == 400:
        return JsonResponse({"detail": RANGE_HELP}, status=400)
    if status == 416:
        response = HttpResponse(status=416)
        response["Content-Range"] = f"bytes */{held.size}"
        return response
    if request.method == "HEAD":
        response = HttpResponse(status=status)
    else:
        response = StreamingHttpResponse(_read(held.path, start, end), status=status)
    for name, value in file_headers(held, status, start, end).items():
        response[name] = value
    return response


async def _read(path: Any, start: int, end: int) -> AsyncIterator[bytes]:
    """Yield a file's bytes from ``start`` to ``end``, read off the event loop.

    An asynchronous iterator: under ASGI Django would read a synchronous one into memory
    whole before sending it (a weights file is gigabytes).
    """
    with open(path, "rb") as fh:  # noqa: ASYNC230 (opening is instant; reads are threaded)
        fh.seek(start)
        left = end - start
        while left > 0:
            chunk = await asyncio.to_thread(fh.read, min(_CHUNK, left))
            if not chunk:
                return
            left -= len(chunk)
            yield chunk


_RESULT = inline_serializer(
    "UpdateCheckResult",
    {
        "model": serializers.CharField(),
        "state": serializers.CharField(help_text="current, available or error"),
        "revision": serializers.CharField(),
        "latest": serializers.CharField(),
        "changed": serializers.ListField(child=serializers.CharField()),
        "added": serializers.ListField(child=serializers.CharField()),
        "removed": serializers.ListField(child=serializers.CharField()),
        "message": serializers.CharField(),
    },
)


@extend_schema(
    summary="Check a model for updates now (operators), or read its last check",
    request=None,
    responses={200: _RESULT, 404: dict},
)
@api_view(["GET", "POST"])
def update_check(request: Request, name: str) -> Response:
    """Compare a model's origin with its registry's latest revision, file by file.

    A registry that fails is ``"state": "error"`` with the reason (200: the check was
    made), and changes nothing; a model not in the catalog is 404.
    """
    if not stored_specs(names=[name]):
        return Response({"detail": f'model "{name}" is not in the catalog'}, status=404)
    if request.method == "GET":
        last = checking.last_checks([name]).get(name)
        if last is None:
            return Response(
                {"detail": f'model "{name}" has not been checked yet: POST here to check it'},
                status=404,
            )
        return Response(last.as_json())
    who = getattr(request.user, "username", "") or "api"
    [result] = checking.check_models([name], by=f"{who} (api)")
    return Response(result.as_json(), status=status.HTTP_200_OK)


_FETCH = inline_serializer(
    "MirrorFetch",
    {
        "id": serializers.IntegerField(),
        "model": serializers.CharField(),
        "source": serializers.CharField(),
        "revision": serializers.CharField(),
        "commit": serializers.CharField(),
        "state": serializers.CharField(help_text="queued, fetching, done, failed or dropped"),
        "bytes_done": serializers.IntegerField(),
        "bytes_total": serializers.IntegerField(allow_null=True),
        "reason": serializers.CharField(),
        "requested_by": serializers.CharField(),
        "created": serializers.CharField(allow_null=True),
        "finished": serializers.CharField(allow_null=True),
    },
    many=True,
)


@extend_schema(
    summary="A model's fetches into the weights mirror, newest first (viewers); POST: fetch "
    "it now (operators)",
    request=None,
    responses={200: _FETCH, 202: dict, 400: dict, 404: dict},
)
@api_view(["GET", "POST"])
def model_fetches(request: Request, name: str) -> Response:
    """Answer a model's fetches into the mirror, newest first (at most 20): the state,
    the bytes done of the total while one runs, the reason of one that failed.

    ``POST`` fetches the model's files now, at the revision it pins (its origin's) or the
    newest (one never fetched: its origin is written when it is done), and answers the
    fetch (202); a model the mirror does not fetch is 400 saying why.
    """
    if not stored_specs(names=[name]):
        return Response({"detail": f'model "{name}" is not in the catalog'}, status=404)
    if request.method == "POST":
        who = getattr(request.user, "username", "") or "api"
        try:
            f = mirror.request_fetch(name, by=f"{who} (api)", surface=Surface.API)
        except mirror.MirrorError as exc:
            return Response({"detail": str(exc)}, status=400)
        return Response(f.as_json(), status=status.HTTP_202_ACCEPTED)
    rows = Fetch.objects.filter(model=name).order_by("-id")[:20]
    return Response([f.as_json() for f in rows])


@extend_schema(
    summary="What the weights mirror holds, for whom, and how much (viewers)",
    responses={200: dict},
)
@api_view(["GET"])
def mirror_holdings(request: Request) -> Response:
    """Answer the mirror's folders (source, commit, bytes, the models each is for and what
    it is to each), the total, the cap, and the fetches queued or running."""
    held = mirror.holdings()
    cap_gb = float(settings.LLMGW_MIRROR_MAX_GB or 0)
    return Response(
        {
            "enabled": mirror.enabled(),
            "bytes": mirror.kept_bytes(),  # each content once: revisions share files
            "cap_bytes": int(cap_gb * 1e9) if cap_gb else None,
            "held": [
                {
                    "source": h.source,
                    "commit": h.commit,
                    "bytes": h.bytes,
                    "models": [{"model": m, "as": r} for m, r in h.models_roles],
                }
                for h in held
            ],
            "fetching": [f.as_json() for f in Fetch.objects.filter(state__in=ACTIVE)],
        }
    )


# -- the update flow ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Problem:
    field: str
    message: str
    code: str
    model: str = ""


def _refused(exc: flow.FlowRefused, field: str = "") -> Response:
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
    return bool(stored_specs(names=[name]))


def _act(
    request: Request, name: str, action: Callable[..., Any], answer: Callable[[Any], Response]
) -> Response:
    """Do an update flow's action (``run.promote``, ``cancel``, ``rollback``) on a model as
    this request's user and answer what it did: 404 for a model the catalog does not hold,
    400 with what was refused."""
    if not _model_known(name):
        return Response({"detail": f'model "{name}" is not in the catalog'}, status=404)
    try:
        done = action(name, user=request.user, surface=Surface.API, via=_via(request))
    except flow.FlowRefused as exc:
        return _refused(exc)
    return answer(done)


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
    except flow.FlowRefused as exc:
        return _refused(exc)
    return Response(cli.as_json(r), status=status.HTTP_202_ACCEPTED)


@extend_schema(summary="Promote a model's running update now", request=None,
               responses={200: _RUN, 400: dict, 404: dict})  # fmt: skip
@api_view(["POST"])
def model_promote(request: Request, name: str) -> Response:
    """Promote a model's running update: its origin to the new revision, a roll."""
    return _act(request, name, run.promote, lambda r: Response(cli.as_json(r)))


@extend_schema(summary="End a model's running update (the model stays as it is)", request=None,
               responses={200: _RUN, 400: dict, 404: dict})  # fmt: skip
@api_view(["POST"])
def model_cancel(request: Request, name: str) -> Response:
    """Cancel a model's running update: its candidate and canary removed."""
    return _act(request, name, run.cancel, lambda r: Response(cli.as_json(r)))


@extend_schema(
    summary="Go back to a model's previous revision while the mirror holds it",
    request=None,
    responses={200: inline_serializer("RollbackDone", {"detail": serializers.CharField()}),
               400: dict, 404: dict},
)  # fmt: skip
@api_view(["POST"])
def model_rollback(request: Request, name: str) -> Response:
    """Move a model back to ``origin.previous`` (a roll), or say why it cannot."""
    return _act(request, name, run.rollback, lambda said: Response({"detail": said}))


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
