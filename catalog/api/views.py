"""The catalog's REST API: models with everything nested, the change log, revert.

Bodies are the catalog file's own mapping of one model (the same keys, the same Go
durations), read strictly by ``catalog.codec`` and checked by ``catalog.rules`` through
``catalog.services``; a refused change answers 400 with each problem's field path.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from catalog import codec, rules, services
from catalog.api.serializers import (
    CatalogModelReadSerializer,
    CatalogModelSerializer,
    ChangeRecordSerializer,
    RefusedSerializer,
)
from catalog.choices import Surface
from catalog.converters import lookup_regex
from catalog.filtersets import ServedModelFilterSet, with_effective_class
from catalog.models import ChangeRecord, ServedModel
from catalog.problems import Problem
from llmgw_core.api import problems_response


def actor_for(request: Request) -> services.Actor:
    """Return the change log's actor for an API request (naming the token, if any)."""
    token = request.auth
    via = f"token {token.name}" if getattr(token, "name", None) else ""
    return services.Actor(user=request.user, surface=Surface.API, via=via)


def represent(obj: ServedModel, *, detail: bool = False) -> dict[str, Any]:
    """Return a model as the API shows it: its file mapping plus what llmgw derives."""
    m = obj.to_spec()
    data = codec.encode_model(m)
    meta: dict[str, Any] = {
        "id": obj.pk,
        "created": obj.created.isoformat(),
        "updated": obj.updated.isoformat(),
        "effective_class": rules.effective_class(m),
        "on_demand": rules.on_demand(m.scaling),
        "simulated": rules.simulated(m),
        "fingerprints": {p.name: rules.fingerprint(p) for p in m.profiles},
    }
    if detail:
        meta["depended_on_by"] = [
            {"model": name, "via": how} for name, how in services.delete_blockers(obj.name)
        ]
    data["meta"] = meta
    return data


def written(obj: ServedModel) -> dict[str, Any]:
    """Return a model just written as the API shows it, with ``meta.warnings``: what the
    layers above warn of about the change (``catalog.signals.change_warnings``)."""
    data = represent(obj, detail=True)
    data["meta"]["warnings"] = list(getattr(obj, "change_warnings", []))
    return data


def read_body(request: Request) -> tuple[Any, list[Problem]]:
    """Return the decoded model of a request body, or the problems reading it."""
    data = request.data
    if not isinstance(data, dict):
        return None, [
            Problem(
                (), "the body must be a JSON object: one model, as in a catalog file", "not_mapping"
            )
        ]
    data = {k: v for k, v in data.items() if k != "meta"}
    model, problems = codec.decode_model(data)
    return model, problems


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply a JSON merge patch (RFC 7386): objects merge, null removes, else replaces."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


@extend_schema_view(
    list=extend_schema(
        summary="List catalog models",
        parameters=[
            OpenApiParameter("class", str, description="critical, standard or opportunistic"),
        ],
        responses=CatalogModelReadSerializer(many=True),
    ),
    retrieve=extend_schema(summary="Read one model", responses=CatalogModelReadSerializer),
    create=extend_schema(
        summary="Add a model",
        request=CatalogModelSerializer,
        responses={201: CatalogModelReadSerializer, 400: RefusedSerializer},
    ),
    update=extend_schema(
        summary="Replace a model (may rename it)",
        request=CatalogModelSerializer,
        responses={200: CatalogModelReadSerializer, 400: RefusedSerializer},
    ),
    partial_update=extend_schema(
        summary="Change part of a model (JSON merge patch: null removes a key)",
        request=CatalogModelSerializer,
        responses={200: CatalogModelReadSerializer, 400: RefusedSerializer},
    ),
    destroy=extend_schema(
        summary="Delete a model (refused while another model's fallbacks or canary name it)",
        responses={204: None, 400: RefusedSerializer},
    ),
)
class ServedModelViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,  # type: ignore[type-arg]
):
    """Catalog models: read by viewers, changed by operators."""

    serializer_class = CatalogModelReadSerializer
    filterset_class = ServedModelFilterSet
    lookup_field = "name"
    # Any name, org/model included; not one ending in /changes, that action's route.
    lookup_value_regex = lookup_regex("changes")
    ordering_fields = ("name", "position", "updated")
    ordering = ("position", "id")

    def get_queryset(self) -> QuerySet[ServedModel]:
        return with_effective_class(services.stored_queryset())

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        qs = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(qs)
        rows = page if page is not None else list(qs)
        data = [represent(obj) for obj in rows]
        if page is not None:
            return self.get_paginated_response(data)
        return Response(data)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(represent(self.get_object(), detail=True))

    def create(self, request: Request) -> Response:
        model, problems = read_body(request)
        if problems:
            return problems_response(problems, "the body cannot be read as a catalog model")
        obj = services.save_model(model, actor_for(request))
        return Response(written(obj), status=status.HTTP_201_CREATED)

    def update(self, request: Request, name: str) -> Response:
        stored = get_object_or_404(services.stored_queryset(), name=name)
        model, problems = read_body(request)
        if problems:
            return problems_response(problems, "the body cannot be read as a catalog model")
        # A whole model put by a script leaves the origin out (the mirror writes it): the
        # recorded one stays (a merge patch with "origin": null drops it).
        model = rules.keep_origin(model, stored.to_spec())
        obj = services.save_model(model, actor_for(request), replacing=name)
        return Response(written(obj))

    def partial_update(self, request: Request, name: str) -> Response:
        obj = get_object_or_404(services.stored_queryset(), name=name)
        if not isinstance(request.data, dict):
            return problems_response(
                [
                    Problem(
                        (), "the body must be a JSON object of the keys to change", "not_mapping"
                    )
                ],
                "the body cannot be read as a catalog model",
            )
        merged = merge_patch(codec.encode_model(obj.to_spec()), dict(request.data))
        merged.pop("meta", None)
        model, problems = codec.decode_model(merged)
        if problems:
            return problems_response(problems, "the body cannot be read as a catalog model")
        obj = services.save_model(model, actor_for(request), replacing=name)
        return Response(written(obj))

    def destroy(self, request: Request, name: str) -> Response:
        get_object_or_404(ServedModel, name=name)
        services.delete_model(name, actor_for(request))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        summary="The model's change log (its last 200 changes, newest first; not paged)",
        responses=ChangeRecordSerializer(many=True),
    )
    @action(detail=True, methods=["get"], pagination_class=None, filterset_class=None)
    def changes(self, request: Request, name: str) -> Response:
        records = ChangeRecord.objects.filter(model_name=name)[:200]
        return Response(ChangeRecordSerializer(records, many=True).data)


class ChangeRecordViewSet(viewsets.ReadOnlyModelViewSet):  # type: ignore[type-arg]
    """The catalog's change log, newest first; any entry can be reverted."""

    queryset = ChangeRecord.objects.all()
    serializer_class = ChangeRecordSerializer
    filterset_fields = ("model_name", "action", "surface")

    @extend_schema(
        summary="Put the model back as it was before this change",
        request=None,
        responses={200: ChangeRecordSerializer, 400: RefusedSerializer},
    )
    @action(detail=True, methods=["post"])
    def revert(self, request: Request, pk: str) -> Response:
        record = self.get_object()
        new = services.revert_change(record, actor_for(request))
        return Response(ChangeRecordSerializer(new).data)
