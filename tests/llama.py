"""The llama-server binary the real-engine tests run.

``python3 run.py test`` builds it once (scripts/build-llama-server.sh) while the tests run:
the modules that need it are marked ``llama_server`` and run last (tests/conftest.py), and
``llama_server_binary`` waits for the build to end, bounded, when it still runs. The build
writes its exit status to the file ``LLMGW_LLAMA_SERVER_BUILD`` names as it ends.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.waiting import wait_until

# The longest a test waits for the build; pytest-timeout (900 s a test) bounds it anyway.
BUILD_WAIT = float(os.environ.get("LLMGW_LLAMA_SERVER_BUILD_WAIT", "840"))


def llama_server_binary() -> str:
    """Return the path of a working llama-server, waiting for the build when it runs; fail
    saying what to do when there is none."""
    binary = os.environ.get("LLMGW_LLAMA_SERVER") or str(Path.home() / ".cache/llmgw/llama-server")
    status = os.environ.get("LLMGW_LLAMA_SERVER_BUILD")
    if status:
        done = Path(status)
        wait_until(done.exists, BUILD_WAIT, f"the llama-server build to end ({status}.log)")
        if done.read_text().strip() != "0":
            log = Path(status + ".log")
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            pytest.fail(f"building llama-server failed (see {log}):\n{tail}")
    if not Path(binary).is_file():
        pytest.fail(f"no llama-server at {binary}: python3 run.py test builds it")
    return binary
