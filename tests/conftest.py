"""Suite-wide settings: Hypothesis example budgets, and the tests that must run one at a time.

Hypothesis: the ``ci`` profile (``CI=true``, as CI sets it) runs the full
example budget; anywhere else the ``dev`` profile runs a smaller one, for fast
feedback. ``HYPOTHESIS_PROFILE=ci`` asks for the full budget locally. A test
that names its own smaller ``max_examples`` (each example is costly) keeps it
in both. Neither profile has a deadline: timing belongs in benchmarks/.

Parallel runs (pytest-xdist, ``--dist loadgroup``): tests that start rank
processes (``runtime``) or a Ray cluster (``cluster``) go to one xdist group,
so they run one after another on one worker, never two at once.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

FULL_EXAMPLES = 150
QUICK_EXAMPLES = 25
SERIAL_MARKERS = ("runtime", "cluster")
SERIAL_GROUP = "serial"

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("ci", max_examples=FULL_EXAMPLES, **_COMMON)
settings.register_profile("dev", max_examples=QUICK_EXAMPLES, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI", "").lower() == "true" else "dev"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.get_closest_marker(name) for name in SERIAL_MARKERS):
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP))
