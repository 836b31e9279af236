"""In CI (``CI=true``) a missing extra fails the run instead of turning its tests into skips; only
a GPU or a vLLM install may skip. Each case runs a real pytest session in a subprocess with the
project's plugin (tests/support/ci_skips.py) over a small test file, with a module made
unimportable the way an extra that stopped installing would be."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ci_skips import allowed
from tests.support.lake import ROOT

NEEDS_EXTRA = '''
from tests.support.extras import need

def test_uses_the_extra():
    need("replaylake_no_such_extra_module", "imaginary", "make test")
'''

PLAIN_SKIP = '''
import pytest

def test_ok():
    assert True

def test_skips_for_a_reason_ci_does_not_allow():
    pytest.skip("no network here")

@pytest.mark.skipif(True, reason="needs a CUDA device")
def test_gpu():
    pass
'''

GPU_ONLY = '''
import pytest

def test_ok():
    assert True

@pytest.mark.skipif(True, reason="needs a CUDA device")
def test_gpu():
    pass
'''


# `make test` runs the suite on pytest-xdist workers: the plugin must count the workers' skips
WORKERS = {"one process": [], "two xdist workers": ["-n", "2", "--dist", "loadgroup"]}


def _session(tmp_path: Path, body: str, ci: bool,
             workers: str = "one process") -> subprocess.CompletedProcess:
    test = tmp_path / "test_case.py"
    test.write_text(body)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(ROOT)
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.support.ci_skips",
                           "-p", "no:cacheprovider", *WORKERS[workers], "--rootdir", str(tmp_path),
                           str(test)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_a_missing_extra_skips_on_a_developers_machine(tmp_path: Path) -> None:
    res = _session(tmp_path, NEEDS_EXTRA, ci=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 skipped" in res.stdout
    assert "it comes with the imaginary extra and `make test` installs it" in res.stdout


def test_a_missing_extra_fails_in_ci_naming_it(tmp_path: Path) -> None:
    res = _session(tmp_path, NEEDS_EXTRA, ci=True)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "1 failed" in res.stdout
    assert "CI installs every extra, but: replaylake_no_such_extra_module is not importable" \
        in res.stdout


@pytest.mark.parametrize("workers", WORKERS)
def test_in_ci_any_skip_but_a_gpus_fails_the_session_and_is_named(tmp_path: Path,
                                                                  workers: str) -> None:
    res = _session(tmp_path, PLAIN_SKIP, ci=True, workers=workers)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "skipped: 2 test(s), 1 for a reason CI does not allow" in res.stdout
    assert "test_case.py::test_skips_for_a_reason_ci_does_not_allow: no network here" in res.stdout
    local = _session(tmp_path, PLAIN_SKIP, ci=False, workers=workers)  # outside CI: reported
    assert local.returncode == 0 and "skipped: 2 test(s)" in local.stdout


@pytest.mark.parametrize("workers", WORKERS)
def test_in_ci_a_gpu_skip_passes_and_is_counted(tmp_path: Path, workers: str) -> None:
    res = _session(tmp_path, GPU_ONLY, ci=True, workers=workers)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "skipped: 1 test(s)" in res.stdout and "1 x needs a CUDA device" in res.stdout


@pytest.mark.parametrize(("reason", "ok"), [
    ("needs a CUDA device", True), ("checks the fallback without an accelerator", True),
    ("needs vllm 0.33 (make test-vllm)", True), ("verl 0.9.1 / TransferQueue 0.1.11 not "
                                                  "importable", False),
    ("the compiled extension was not built", False), ("", False)])
def test_the_allowed_reasons(reason: str, ok: bool) -> None:
    assert allowed(reason) is ok


def test_every_missing_install_goes_through_the_one_helper() -> None:
    """No test skips on a missing module by itself (it would skip in CI too): they call
    `tests.support.extras.need` / `missing`."""
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py")
                 if "importorskip(" in p.read_text() and p.name != "test_ci_skips.py"]
    assert offenders == []


MODULE_SKIP = '''
from tests.support.extras import need

need("replaylake_no_such_extra_module", "imaginary", "make test")

def test_never_collected():
    pass
'''


@pytest.mark.parametrize("workers", WORKERS)
def test_a_module_skipped_at_import_is_counted_and_fails_in_ci(tmp_path: Path,
                                                               workers: str) -> None:
    local = _session(tmp_path, MODULE_SKIP, ci=False, workers=workers)  # "no tests ran" (5)
    assert local.returncode == 5, local.stdout + local.stderr
    assert "skipped: 1 test(s), 1 for a reason CI does not allow" in local.stdout
    res = _session(tmp_path, MODULE_SKIP, ci=True, workers=workers)  # in CI: an error, named
    # a collection error stops a one-process session (2); xdist's controller reports it failed (1)
    failed = {"one process": pytest.ExitCode.INTERRUPTED,
              "two xdist workers": pytest.ExitCode.TESTS_FAILED}[workers]
    assert res.returncode == failed, res.stdout + res.stderr
    assert "CI installs every extra, but: replaylake_no_such_extra_module" in res.stdout
