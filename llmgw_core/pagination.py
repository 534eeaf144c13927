"""The API's pages: ``limit`` and ``offset``, with a largest page.

DRF's ``LimitOffsetPagination`` passes any ``limit`` to the database, and
``?limit=18446744073709551617`` answered 500 (PostgreSQL's LIMIT is a 64-bit integer).
A larger ``limit`` than ``MAX_LIMIT`` gives a page of ``MAX_LIMIT`` rows and a ``next``
link, as DRF does with ``max_limit``; an ``offset`` past the last row gives an empty page.
"""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination

# Rows in one page at most; the default page is the settings' PAGE_SIZE (100).
MAX_LIMIT = 1000


class Pagination(LimitOffsetPagination):
    """``limit`` (1 to 1000, default 100) and ``offset``; larger limits are clamped."""

    max_limit = MAX_LIMIT
