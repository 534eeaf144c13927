"""The gateway's request path: the ASGI front (``app``) and the steps of ``complete``
(``cycle``, ``routing``, ``answer``, ``guarding``, ...), and the pure parts they use.

Nothing here queries the database, and nothing here imports the ORM: no ``django.db``,
no ``*.models``, and of ``gateway.records`` only the record types the
path hands over (``gateway.records.observe``'s). ``tests/test_import_direction.py`` holds
it. What runs after a request (usage, refusals, metrics, traffic, the table's loader) is
in ``gateway.records``; the Django app around both (models, admin, API, views, the
assembly, the server) is ``gateway`` itself.
"""
