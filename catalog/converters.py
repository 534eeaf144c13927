"""The URL converter of a catalog name: anything the catalog holds, a slash or a line break
included, so that every page can link to every stored model (a name stored before the rule
that refuses control characters made ``reverse`` fail with the ``path`` converter, whose
``.+`` stops at a line feed, and the whole page answer 500)."""

from __future__ import annotations

from django.urls import register_converter


class CatalogName:
    """Match any non-empty name, as the ``path`` converter would, line breaks included."""

    regex = r"[\s\S]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(CatalogName, "name")
