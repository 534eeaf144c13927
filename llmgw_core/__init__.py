"""The framework every app builds on: roles, the API's base, lean routes, tokens, settings
helpers, the live-event bus, the Celery app, the shared HTTP client. It imports no app
and not the wiring (``llmgw_admin``), which sits on top of everything; any app imports it
(``tests/test_import_direction.py``; docs/development.md, "The import direction")."""
