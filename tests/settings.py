"""Settings for the tests: the production configuration on the local PostgreSQL and Redis.

The variables are set here, before ``llmgw_admin.settings`` reads them, because
pytest-django loads settings before any conftest runs.
"""

from __future__ import annotations

import os
import tempfile

# Each run has a database of its own (pytest-django makes test_<name> and drops it at the
# end): two runs on one machine (two engineers, or a run beside a benchmark) must not drop
# each other's database half-way.
os.environ.setdefault(
    "LLMGW_DATABASE_URL",
    os.environ.get(
        "LLMGW_TEST_DATABASE_URL",
        # run.py makes a role with a password and sets LLMGW_TEST_DATABASE_SERVER; without
        # it, the local server's postgres role (where pg_hba.conf trusts local connections).
        os.environ.get("LLMGW_TEST_DATABASE_SERVER", "postgres://postgres@127.0.0.1:5432")
        + f"/llmgw_run{os.getpid()}",
    ),
)
# Redis likewise: a server of this run's own (tests/redisserver.py).
from tests.redisserver import start_for_run  # noqa: E402

start_for_run()

# One process per server a test starts (`gateway serve` would fork one worker a core):
# the tests that count on one process's own state (its sessions, its in-flight counts)
# hold as they are; tests/e2e/test_gateway_workers.py starts workers by --workers.
os.environ.setdefault("LLMGW_GATEWAY_WORKERS", "1")
os.environ.setdefault("LLMGW_WEB_WORKERS", "1")

# A data folder per test process: xdist's workers inherit the environment of the process
# that started them, and a folder they shared mixed their metrics (one worker's scrape read
# another's judge breaker gauge), engine logs and mirror.
_owner = os.environ.get("PYTEST_XDIST_WORKER", "main")
if (
    not os.environ.get("LLMGW_DATA_DIR")
    or os.environ.get("LLMGW_TEST_DATA_OWNER", _owner) != _owner
):
    os.environ["LLMGW_DATA_DIR"] = tempfile.mkdtemp(prefix="llmgw-test-")
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    os.environ["LLMGW_TEST_DATA_OWNER"] = _owner
# The registry (updates/registry.py): a closed port on loopback unless a test points it at
# the Hub stand-in (tests/updates/hubstandin.py), so no test ever asks the real hub.
os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
os.environ.setdefault("LLMGW_SECRET_KEY", "test-only-not-secret")
os.environ.setdefault("LLMGW_ALLOWED_HOSTS", "testserver,localhost,127.0.0.1")

from llmgw_admin.settings import *  # noqa: E402,F403

LLMGW_TEST_REDIS_URL = os.environ["LLMGW_TEST_REDIS_URL"]
