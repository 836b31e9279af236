"""The vLLM adapter's conversion and resume tests, run again against vLLM 0.33.0's real output
classes (`make test` installs vLLM's sources without its engine into `.venv/vllm-classes`: see
tests/support/install_vllm_classes.py). A separate pytest session, because the real classes are
chosen when the test modules load (``REPLAYLAKE_REAL_VLLM=1``) and that directory must be on the
path of that session only."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.support.extras import missing
from tests.support.lake import ROOT

CLASSES = ROOT / ".venv" / "vllm-classes"
TESTS = ("tests/adapters/vllm/test_vllm.py", "tests/adapters/vllm/test_vllm_resume.py")


def test_the_vllm_tests_pass_against_vllms_own_classes() -> None:
    if not (CLASSES / ".installed").is_file():
        missing(f"vLLM's output classes are not installed in {CLASSES}; `make test` installs "
                "them (tests/support/install_vllm_classes.py)")
    env = dict(os.environ, REPLAYLAKE_REAL_VLLM="1",
               PYTHONPATH=os.pathsep.join([str(CLASSES), str(ROOT)]))
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs",
                          *TESTS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert " skipped" not in out.splitlines()[-1], out        # the field-for-field test ran too
    passed = int(re.search(r"(\d+) passed", out).group(1))
    assert passed >= 27, out
