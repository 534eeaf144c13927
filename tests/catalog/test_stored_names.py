"""Pages render whatever name the catalog holds: a name stored before the rule
that refuses control characters (with a CR or LF) answered 500 (NoReverseMatch)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from catalog.models import ServedModel
from tests.catalog.samples import cpu_model, store

pytestmark = pytest.mark.django_db

NAMES = ["bad\nname", "bad\rname", "org/bad\r\nname"]


@pytest.mark.parametrize("name", NAMES)
def test_catalog_and_cluster_pages_render_a_stored_name_with_a_line_break(
    name, viewer, client_for
) -> None:
    store(cpu_model("fine"))
    # Written as a row from before the rule: the rules would refuse it now.
    ServedModel.objects.filter(name="fine").update(name=name)
    client = client_for(viewer)
    pages = ("/catalog/", "/cluster/", "/gateway/chat/", "/gateway/traffic/", "/guard/",
             "/cluster/reconciler/", "/admin/catalog/servedmodel/")  # fmt: skip
    for url in pages:
        r = client.get(url)
        assert r.status_code == 200, (url, r.status_code)
    link = reverse("catalog:servedmodel_detail", args=[name])
    assert client.get(link).status_code == 200
