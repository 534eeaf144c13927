"""DRF serializers that describe the catalog's JSON for the OpenAPI schema.

They are generated from ``catalog.spec``, so the schema cannot drift from the file format;
reading a body is ``catalog.codec``'s job (strict: unknown keys and wrong types are
refused with their paths), and the rules are ``catalog.rules``'.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from rest_framework import serializers

from catalog import spec
from catalog.models import ChangeRecord

_cache: dict[type[Any], type[serializers.Serializer[Any]]] = {}


def _field_for(hint: Any, f: dataclasses.Field[Any]) -> serializers.Field[Any, Any, Any, Any]:
    optional = False
    origin = typing.get_origin(hint)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint, optional = args[0], True
        origin = typing.get_origin(hint)
    kw: dict[str, Any] = {"required": False}
    if optional:
        kw["allow_null"] = True
    if f.metadata.get("kind") == "duration":
        return serializers.CharField(help_text="Go duration: 90s, 20m, 1h30m", **kw)
    if dataclasses.is_dataclass(hint):
        return serializer_for(hint)(**kw)  # type: ignore[arg-type]
    if origin is list:
        (item,) = typing.get_args(hint)
        child = (
            serializer_for(item)() if dataclasses.is_dataclass(item) else serializers.CharField()
        )
        return serializers.ListField(child=child, **kw)
    if origin is dict:
        return serializers.DictField(child=serializers.CharField(), **kw)
    if hint is bool:
        return serializers.BooleanField(**kw)
    if hint is int:
        return serializers.IntegerField(**kw)
    if hint is float:
        return serializers.FloatField(**kw)
    return serializers.CharField(allow_blank=True, **kw)


def serializer_for(cls: type[Any]) -> type[serializers.Serializer[Any]]:
    """Return (once) a Serializer class describing a spec dataclass."""
    if cls in _cache:
        return _cache[cls]
    hints = typing.get_type_hints(cls)
    attrs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        attrs[spec.key_of(f)] = _field_for(hints[f.name], f)
    name = (
        "Catalog" + cls.__name__
        if cls.__name__ in ("Model", "Profile", "Adapter")
        else cls.__name__
    )
    serializer_cls = type(name, (serializers.Serializer,), attrs)
    _cache[cls] = serializer_cls
    return serializer_cls


class ModelMetaSerializer(serializers.Serializer[Any]):
    """What llmgw works out about a model: read-only, ignored when written back."""

    id = serializers.IntegerField()
    created = serializers.DateTimeField()
    updated = serializers.DateTimeField()
    effective_class = serializers.CharField()
    on_demand = serializers.BooleanField()
    simulated = serializers.BooleanField()
    fingerprints = serializers.DictField(child=serializers.CharField())
    # One model's page only (GET .../models/NAME/ and what a change answers), not the list.
    depended_on_by = serializers.ListField(child=serializers.DictField(), required=False)
    # On a write's answer: what the change is warned of (it was made all the same).
    warnings = serializers.ListField(child=serializers.CharField(), required=False)


CatalogModelSerializer = serializer_for(spec.Model)


class CatalogModelReadSerializer(CatalogModelSerializer):  # type: ignore[valid-type,misc]
    """A catalog model as the API returns it: the file's mapping plus ``meta``."""

    meta = ModelMetaSerializer(read_only=True)


class ProblemSerializer(serializers.Serializer[Any]):
    """One reason a change was refused."""

    field = serializers.CharField()
    message = serializers.CharField()
    code = serializers.CharField()
    model = serializers.CharField(required=False)


class RefusedSerializer(serializers.Serializer[Any]):
    """A refused change: nothing was written."""

    detail = serializers.CharField()
    errors = ProblemSerializer(many=True)


class ChangeRecordSerializer(serializers.ModelSerializer[ChangeRecord]):
    """One entry of the change log."""

    class Meta:
        model = ChangeRecord
        fields = (
            "id", "model_name", "action", "surface", "actor_name", "at",
            "summary", "before", "after", "reverts",
        )  # fmt: skip
        read_only_fields = fields
