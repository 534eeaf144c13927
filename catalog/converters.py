"""The URL converter of a catalog name: anything the catalog holds, a slash or a line break
included, so that every page can link to every stored model (a name stored before the rule
that refuses control characters made ``reverse`` fail with the ``path`` converter, whose
``.+`` stops at a line feed, and the whole page answer 500)."""

from __future__ import annotations

import re

from django.urls import register_converter


class CatalogName:
    """Match any non-empty name, as the ``path`` converter would, line breaks included."""

    regex = r"[\s\S]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(CatalogName, "name")


def lookup_regex(*actions: str) -> str:
    """Return an API viewset's ``lookup_value_regex`` matching any name, ``/`` included.

    A router puts an object's route before its actions' (``models/<name>/changes/``), so
    a name with a slash may not end in an action's word: the name grammar refuses such a
    name (``catalog.rules.names.ROUTE_WORDS``), and the action's route is reached. Parts
    are not empty (the grammar refuses ``//``).
    """
    words = "|".join(re.escape(a) for a in actions)
    return rf"(?:[^/]+/)+(?!(?:{words})(?:/|$))[^/]+|[^/]+"
