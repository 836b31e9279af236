"""A pytest plugin (loaded by tests/conftest.py): under ``-n N --dist loadgroup``, the suite's
tests are handed to the xdist workers in whole groups, one group per test file, and every Ray
and verl test in one group together.

Why: a module's expensive fixture (a crash matrix's reference runs, a demo lake) is built once
per worker that runs any of the module's tests, and the Ray and verl tests share the session's
one Ray cluster (and verl's one TransferQueue) only if one worker runs them all; split over two
workers, two clusters start on a 2-core machine.

How: xdist's own ``loadgroup`` reads the groups from a suffix it appends to each test's node id
(``@group``, taken from the ``xdist_group`` mark), and pytest 9.2 no longer lets a plugin change
a node id: the suffix is silently lost and every test is scheduled on its own (pytest-xdist
issue 1386, open as of xdist 3.8.0). Here the groups are computed from the node id itself
(`group_of`) by xdist's scope scheduler, through xdist's public scheduler hook; no node id is
changed. Other ``--dist`` modes are left to xdist.
"""
from __future__ import annotations

import pytest

# the test directories whose tests share the session's Ray cluster (Ray's own, and verl's
# TransferQueue on it)
RAY_DIRS = ("adapters/ray/", "adapters/verl/")
RAY_GROUP = "ray"


def group_of(nodeid: str) -> str:
    """The group of a test: ``RAY_GROUP`` for a test under a `RAY_DIRS` directory, else its
    file (the node id's path, relative to the root directory)."""
    path = nodeid.split("::", 1)[0]
    if any(f"/{d}" in f"/{path}" for d in RAY_DIRS):
        return RAY_GROUP
    return path


@pytest.hookimpl(tryfirst=True, optionalhook=True)   # before xdist's own choice of scheduler
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """xdist's scope scheduler (whole scopes to a worker, largest first), whose scopes are
        the suite's groups."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)
