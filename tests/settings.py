"""Settings for the tests: the production configuration on the local PostgreSQL and Redis.

The variables are set here, before ``llmgw_admin.settings`` reads them, because
pytest-django loads settings before any conftest runs.
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault(
    "LLMGW_DATABASE_URL",
    os.environ.get("LLMGW_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llmgw"),
)
os.environ.setdefault("LLMGW_DATA_DIR", tempfile.mkdtemp(prefix="llmgw-test-"))
os.environ.setdefault("LLMGW_SECRET_KEY", "test-only-not-secret")
os.environ.setdefault("LLMGW_ALLOWED_HOSTS", "testserver,localhost,127.0.0.1")

from llmgw_admin.settings import *  # noqa: E402,F403
