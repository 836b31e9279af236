"""The suite's xdist scheduling (tests/support/xdist_groups.py): under `--dist loadgroup` every
test file runs whole on one worker, and the Ray and verl tests all on one worker (one Ray
cluster per session). Each case runs a real pytest session on two xdist workers over a small
suite, with the project's plugin, and reads which worker ran each test."""
from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.support.lake import python_env
from tests.support.xdist_groups import RAY_GROUP, group_of

TESTS = "".join(f"def test_{i}():\n    pass\n\n" for i in range(6))
FILES = ("one/test_a.py", "one/test_b.py", "two/test_c.py", "adapters/ray/test_r.py",
         "adapters/verl/test_v.py")


def _workers(tmp_path: Path, dist: str) -> dict[str, set[str]]:
    """file -> the workers that ran its tests, in a two-worker session with ``--dist dist``."""
    suite = tmp_path / "suite"
    for name in FILES:
        (suite / name).parent.mkdir(parents=True, exist_ok=True)
        (suite / name).write_text(TESTS)
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.xdist_groups", "-p",
         "no:cacheprovider", "-n", "2", "--dist", dist, "-v", "-o", "addopts=", "--rootdir",
         ".", "."], capture_output=True, text=True, timeout=300, env=python_env(), cwd=suite)
    assert res.returncode == 0, res.stdout + res.stderr
    ran: dict[str, set[str]] = defaultdict(set)
    for worker, path in re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED (\S+?)::", res.stdout):
        ran[path].add(worker)
    assert set(ran) == set(FILES), res.stdout
    return ran


def test_with_loadgroup_each_file_and_all_ray_tests_run_on_one_worker(tmp_path: Path) -> None:
    ran = _workers(tmp_path, "loadgroup")
    assert all(len(workers) == 1 for workers in ran.values()), ran
    assert ran["adapters/ray/test_r.py"] == ran["adapters/verl/test_v.py"], ran
    assert set().union(*ran.values()) == {"gw0", "gw1"}, ran     # both workers got work


def test_other_modes_are_xdists_own_and_split_files(tmp_path: Path) -> None:
    """The check above can fail: `--dist load` (left to xdist) spreads one file's tests."""
    ran = _workers(tmp_path, "load")
    assert any(len(workers) == 2 for workers in ran.values()), ran


@pytest.mark.parametrize(("nodeid", "group"), [
    ("tests/adapters/ray/test_ray.py::test_x[a-b]", RAY_GROUP),
    ("tests/adapters/verl/test_verl_bench.py::test_y", RAY_GROUP),
    ("adapters/verl/test_v.py::test_0", RAY_GROUP),
    ("tests/adapters/vllm/test_vllm.py::test_z", "tests/adapters/vllm/test_vllm.py"),
    ("tests/buffer/test_crash_matrix.py::test_k[async]", "tests/buffer/test_crash_matrix.py"),
    ("tests/my_adapters/ray/test_q.py::test_w", "tests/my_adapters/ray/test_q.py"),
])
def test_the_group_of_a_test(nodeid: str, group: str) -> None:
    assert group_of(nodeid) == group


def test_the_suite_loads_the_plugin(request: pytest.FixtureRequest) -> None:
    """This session (tests/conftest.py) is scheduled by it."""
    assert request.config.pluginmanager.has_plugin("tests.support.xdist_groups")
