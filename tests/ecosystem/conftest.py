"""The ecosystem examples: skipped with the reason when a library is not installed
(``tox -e ecosystem`` installs them; tests/ecosystem/requirements.txt says how and why)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tiny configs only: never reach a hub
