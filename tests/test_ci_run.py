"""`.ci/run` fails a run in which pytest collected nothing, even though `make` reports every
failure as its own exit 2, and fails a run that leaves no pytest status at all. Each case runs the
real `.ci/run` script in a copy of the repository's layout, with a stand-in `make` on PATH that
runs a real pytest session (with the project's plugin) over a small directory, or no pytest."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.lake import ROOT

PASSING = "def test_ok():\n    assert True\n"
FAILING = "def test_no():\n    assert False\n"


def _ci_run(tmp_path: Path, make_body: str, tests: str | None) -> subprocess.CompletedProcess:
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", repo / ".ci" / "run")
    suite = repo / "suite"
    suite.mkdir()
    if tests is not None:
        (suite / "test_case.py").write_text(tests)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    make = bin_dir / "make"
    make.write_text("#!/usr/bin/env bash\n" + make_body + "\n")
    make.chmod(make.stat().st_mode | stat.S_IEXEC)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "REPLAYLAKE_PYTEST_STATUS")}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env["PYTHONPATH"] = str(ROOT)
    env["PYTEST"] = sys.executable
    return subprocess.run(["bash", str(repo / ".ci" / "run")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


# like the real Makefile (two xdist workers): pytest's own status is lost, make exits 2 on any
# failure
PYTEST_THROUGH_MAKE = ('"$PYTEST" -m pytest -q -p tests.support.ci_skips -p no:cacheprovider '
                       '-n 2 --dist loadgroup --rootdir suite suite || exit 2')


def test_no_tests_collected_fails_though_make_says_2(tmp_path: Path) -> None:
    res = _ci_run(tmp_path, PYTEST_THROUGH_MAKE, tests=None)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "CI: pytest collected no tests - failing" in res.stderr


@pytest.mark.parametrize(("tests", "rc"), [(PASSING, 0), (FAILING, 2)])
def test_a_real_run_keeps_makes_status(tmp_path: Path, tests: str, rc: int) -> None:
    res = _ci_run(tmp_path, PYTEST_THROUGH_MAKE, tests=tests)
    assert res.returncode == rc, res.stdout + res.stderr
    assert "skipped: 0 test(s)" in res.stdout


def test_a_make_that_hides_pytests_failure_still_fails(tmp_path: Path) -> None:
    res = _ci_run(tmp_path, PYTEST_THROUGH_MAKE.replace("|| exit 2", "|| true"), tests=FAILING)
    assert res.returncode == 1, res.stdout + res.stderr


def test_a_make_that_never_ran_pytest_fails(tmp_path: Path) -> None:
    res = _ci_run(tmp_path, "echo nothing to do", tests=PASSING)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "pytest left no exit status" in res.stderr
