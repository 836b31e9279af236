"""A pytest plugin (loaded by tests/conftest.py): in CI, only a GPU or a vLLM install may skip.

After the run it prints how many tests skipped and why. Under ``CI=true`` it fails the session
when any test skipped for another reason: an extra that stopped installing must not turn a
hundred tests into skips and leave CI green. The allowed reasons are matched on the skip's
reason text, so every skip that is allowed says so in words (`ALLOWED`).
"""
from __future__ import annotations

import os
import re
from collections import Counter

import pytest

from tests.support.extras import in_ci

# reason patterns a CI run may skip for, each with why
ALLOWED = {
    r"needs a CUDA device": "this machine has no GPU",
    r"checks the fallback without an accelerator": "this machine has a GPU",
    r"needs vllm 0\.33": "vLLM's own install (a CUDA torch) is `make test-vllm`'s, not CI's",
}

# where `.ci/run` asks for pytest's exit status to be written
STATUS_ENV = "REPLAYLAKE_PYTEST_STATUS"

_skips: list[tuple[str, str]] = []


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def allowed(reason: str) -> bool:
    """Whether a CI run may skip a test for ``reason``."""
    return any(re.search(pattern, reason) for pattern in ALLOWED)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skips.append((report.nodeid, _reason(report)))


# a whole module skipped at import (``allow_module_level``) reports here, not per test
pytest_collectreport = pytest_runtest_logreport


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    tr = terminalreporter
    bad = [(node, why) for node, why in _skips if not allowed(why)]
    tr.write_line(f"skipped: {len(_skips)} test(s)"
                  + (f", {len(bad)} for a reason CI does not allow" if bad else ""))
    for why, n in Counter(why for _, why in _skips).most_common():
        tr.write_line(f"  {n} x {why}")
    if bad and in_ci():
        tr.write_line("CI: only a missing GPU or vLLM install may skip a test; these did not:",
                      red=True)
        for node, why in bad:
            tr.write_line(f"  {node}: {why}", red=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if in_ci() and any(not allowed(why) for _, why in _skips) and session.exitstatus in (
            pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    # `.ci/run` reads pytest's own exit status here: `make` turns every failure into its own 2,
    # so "no tests ran" (5) could not be told apart from a failed test through make
    # under pytest-xdist only the controller, which sees every worker's reports, writes it
    status_file = os.environ.get(STATUS_ENV)
    if status_file and not hasattr(session.config, "workerinput"):
        with open(status_file, "w") as f:
            f.write(f"{int(session.exitstatus)}\n")
