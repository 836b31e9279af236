"""Fixtures of the test suite: a lake directory, a buffer over it, the session's one Ray cluster,
and the hypothesis profiles. Helper functions live in the `tests.support` package.

Under `make test` the suite runs on two pytest-xdist workers (`--dist loadgroup`). Each test file
is one group, so a module's expensive fixture (a demo lake, a crash matrix's runs) is built once;
the Ray and verl tests are one group together, so the session's one Ray cluster (and verl's one
TransferQueue) is started by one worker only.

Hypothesis profiles: ``ci`` (default; modest example counts, no deadline, so the suite stays fast
on 2 cores), ``dev`` (fewer) and ``thorough`` (many); pick one with HYPOTHESIS_PROFILE=<name>.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from pipeline import ReplayBuffer
from tests.support.extras import need

# in CI, a skip for anything but a GPU or a vLLM install fails the run (tests/support/ci_skips.py)
pytest_plugins = ["tests.support.ci_skips"]

settings.register_profile("ci", deadline=None, max_examples=25, stateful_step_count=30,
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=10, stateful_step_count=20)
settings.register_profile("thorough", deadline=None, max_examples=500, stateful_step_count=60,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# the tests that share the session's Ray cluster (Ray's own, and verl's TransferQueue on it)
RAY_DIRS = ("adapters/ray/", "adapters/verl/")


@pytest.hookimpl(tryfirst=True)   # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items) -> None:
    """One xdist group per test file, and one for every test on the Ray cluster (see above)."""
    tests_dir = Path(__file__).parent
    for item in items:
        where = Path(str(item.path)).relative_to(tests_dir).as_posix()
        group = "ray" if where.startswith(RAY_DIRS) else where
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    """A fresh lake directory (created by the buffer on first use)."""
    return tmp_path / "lake"


@pytest.fixture
def buf(lake: Path):
    """A sync-preset buffer over ``lake`` with a test-speed poll interval; closed afterwards."""
    b = ReplayBuffer.sync(lake=lake, poll_interval=0.05)
    yield b
    b.close()


@pytest.fixture(scope="session")
def ray_cluster():
    """The one local Ray cluster of the test session (the verl tests' TransferQueue runs on it
    too). `num_cpus=4` on these 2-core machines: actors that each ask for a CPU otherwise hang."""
    ray = need("ray", "ray (or verl)")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()
