"""Template context every console page gets beyond the role (``llmgw_core.roles``)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from cluster.choices import NodeHealth
from cluster.models import Node


def simulated(request: HttpRequest) -> dict[str, Any]:
    """Give templates ``simulated_nodes``: the names of the simulated nodes not lost.

    Read by ``templates/partials/simulated_banner.html`` on every page of a signed-in
    user; lazy, so a fragment that shows no banner costs no query. A simulated node that
    is lost (``LLMGW_SIMULATE=off``, or its agent stopped) no longer counts.
    """
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"simulated_nodes": ()}

    def names() -> list[str]:
        return list(
            Node.objects.filter(simulated=True)
            .exclude(health=NodeHealth.LOST)
            .order_by("name")
            .values_list("name", flat=True)
        )

    return {"simulated_nodes": SimpleLazyObject(names)}
