"""Run the node agent: ``python -m agent`` is ``llmgw-agent``."""

from __future__ import annotations

import sys

from agent.main import main

sys.exit(main())
