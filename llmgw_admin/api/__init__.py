"""The wiring's own API: API tokens (``views``), under /api/v1/access/."""
