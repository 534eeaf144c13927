"""One FilterSet for the refusal records, used by the API and the console's list page."""

from __future__ import annotations

import django_filters

from gateway.models import Refusal


class RefusalFilterSet(django_filters.FilterSet):
    """Filter refusal records by request id, key, model, direction and time."""

    request_id = django_filters.CharFilter(
        max_length=40, help_text="the x-request-id the client got (req_…), exactly"
    )
    key = django_filters.CharFilter(max_length=100, help_text="the client key's name")
    model = django_filters.CharFilter(max_length=200, help_text="the catalog model asked")
    direction = django_filters.ChoiceFilter(
        choices=Refusal.Direction.choices, help_text="request or answer"
    )
    at__gte = django_filters.IsoDateTimeFilter(
        field_name="at", lookup_expr="gte", help_text="at or after (ISO 8601)"
    )
    at__lt = django_filters.IsoDateTimeFilter(
        field_name="at", lookup_expr="lt", help_text="before (ISO 8601)"
    )

    class Meta:
        model = Refusal
        fields: list[str] = []
