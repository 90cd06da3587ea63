"""BASELINE for `python -m bench.coldstart`, not production code: the `on_log_event` function written the naive way.

It imports `google.cloud.compute_v1` and `google.cloud.firestore` eagerly at module top level, as the project's seed
scripts do (`from google.cloud import compute_v1` at the top of their main.py), and then serves events with the very
same entry point and handler as functions/main.py. The import strategy is the only difference, so the benchmark's
naive/respawn ratios measure what lazy client imports save on a cold start. Served like the real function:

    functions_framework.create_app(target="on_log_event", source="bench/naive_function.py", signature_type="cloudevent")
"""

from __future__ import annotations

import os
import sys

# As functions/main.py: the Functions Framework puts only this file's folder on sys.path.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from google.cloud import compute_v1, firestore  # noqa: E402,F401 - eager on purpose: this is what the baseline costs

import functions_framework  # noqa: E402,F401

from respawn.control.main import on_log_event  # noqa: E402,F401 - the same entry point, parse and handler
