"""Suite-wide settings: Hypothesis example budgets, and the tests that run alone.

Hypothesis: the ``ci`` profile (``CI=true``, as CI sets it) runs the full
example budget; anywhere else the ``dev`` profile runs a smaller one, for fast
feedback. ``HYPOTHESIS_PROFILE=ci`` asks for the full budget locally. A test
that names its own smaller ``max_examples`` (each example is costly) keeps it,
capped by the profile's. Neither profile has a deadline: timing belongs in benchmarks/.

Parallel runs (pytest-xdist): tests that start rank processes or import torch
(``runtime``) or start a Ray cluster (``cluster``) measure a real run against
its ground truth, so they run alone, as a serial run would run them: they are
collected last, and each holds an exclusive lock that every other test holds
shared, so that none overlaps another test. ``make test`` hands out whole
modules (``--dist loadscope``), so a module's fixtures are set up once.

Ctrl-C: every test process gets Python's own SIGINT handler back if it was
started with SIGINT ignored (a shell's background job), and so do the commands
the tests start.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import tempfile

import pytest
from hypothesis import HealthCheck, settings

FULL_EXAMPLES = 150
QUICK_EXAMPLES = 25
SERIAL_MARKERS = ("runtime", "cluster")
# the lock file the xdist workers share, set by the controlling process before it starts them
LOCK_ENV = "DSPROF_TESTS_LOCK"

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("ci", max_examples=FULL_EXAMPLES, **_COMMON)
settings.register_profile("dev", max_examples=QUICK_EXAMPLES, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI", "").lower() == "true" else "dev"))


def _serial(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in SERIAL_MARKERS)


def pytest_configure(config: pytest.Config) -> None:
    # A shell starts its background jobs with SIGINT ignored, and a process keeps an ignored SIGINT and hands it to
    # its children: the tests that send Ctrl-C (to this process or to a command) need Python's own handler.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    distributed = not hasattr(config, "workerinput") and (getattr(config.option, "numprocesses", None) or 0)
    if distributed and LOCK_ENV not in os.environ:
        directory = tempfile.mkdtemp(prefix="dsprof-tests-")
        config.add_cleanup(lambda: shutil.rmtree(directory, ignore_errors=True))
        os.environ[LOCK_ENV] = os.path.join(directory, "serial.lock")
        config.add_cleanup(lambda: os.environ.pop(LOCK_ENV, None))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_serial)  # stable: the serial tests last, each part in its own order


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Setup, call and teardown under the workers' shared lock: exclusive for a serial test, shared for any other."""
    lock = os.environ.get(LOCK_ENV)
    if lock is None:
        yield
        return
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if _serial(item) else fcntl.LOCK_SH)
        yield
