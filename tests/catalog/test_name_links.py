"""Every link and button on a model's console pages acts on that model, slash included: on
``org/chat``'s pages, each URL that names a model (Edit, Delete, Scale, Wake, revert, the
update panel's buttons) resolves to ``org/chat``, never to ``chat``."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from django.urls import Resolver404, resolve

from catalog import services
from catalog.choices import Surface
from tests.catalog.samples import gpu_model, store

pytestmark = pytest.mark.django_db

NAME = "org/chat"
ATTRIBUTE = re.compile(r'(?:href|action|hx-get|hx-post|formaction)="([^"]+)"')
PAGES = [
    "/catalog/models/org/chat/",
    "/catalog/models/org/chat/edit/",
    "/catalog/models/org/chat/delete/",
    "/catalog/models/org/chat/schedule/",
    "/updates/models/org/chat/panel/",
]


def _targets(html: str) -> list[tuple[str, str]]:
    """Return (URL, the name it acts on) for each URL on a page that names a model."""
    out = []
    for url in ATTRIBUTE.findall(html):
        path = unquote(urlsplit(url.replace("&amp;", "&")).path)
        if not path.startswith("/"):
            continue
        try:
            match = resolve(path)
        except Resolver404:
            continue
        if "name" in match.kwargs:
            out.append((match.view_name, match.kwargs["name"]))
    return out


def test_every_link_on_a_slash_named_models_pages_acts_on_it(
    client_for: Any, operator: Any
) -> None:
    store(gpu_model("chat", scaling={"min": 0, "max": 1, "idle_timeout": "10m"}))
    store(gpu_model(NAME, scaling={"min": 0, "max": 1, "idle_timeout": "10m"}))
    # A second change, so the change log offers a revert.
    m = services.stored_queryset().get(name=NAME).to_spec()
    m.description = "changed"
    services.save_model(m, services.Actor(user=None, surface=Surface.API), replacing=NAME)
    client = client_for(operator)
    seen: set[str] = set()
    for page in PAGES:
        r = client.get(page)
        assert r.status_code == 200, (page, r.status_code)
        for view, name in _targets(r.content.decode()):
            assert name == NAME, (page, view, name)
            seen.add(view)
    for view in ("catalog:servedmodel_edit", "catalog:servedmodel_delete",
                 "cluster:model_scale", "catalog:changerecord_revert"):  # fmt: skip
        assert view in seen, (view, sorted(seen))
