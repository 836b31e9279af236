"""The suite stands without the optional extras: with verl, TransferQueue, vLLM, Ray and W&B made
unimportable (exactly as if they were not installed), every test module still collects, and the
tests that need one of them are skipped rather than failing or erroring.

The packages are hidden by a `sitecustomize` on PYTHONPATH that puts an import finder first on
`sys.meta_path`; it raises ModuleNotFoundError, which is what Python raises for a missing
package, so `pytest.importorskip` and the code under test see the same thing a user without the
extra sees."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.lake import ROOT, python_env

EXTRAS = ("verl", "transfer_queue", "vllm", "ray", "wandb")

BLOCKER = f'''
import sys
from importlib.abc import MetaPathFinder

HIDDEN = {EXTRAS!r}


class HideExtras(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, HideExtras())
'''

# Tests that need an extra for real (files also hold tests that run without it, e.g. vLLM's
# shape checks): each target must report a skip, and none may fail or error.
NEEDS_EXTRAS = [
    "tests/adapters/ray/test_ray.py",
    "tests/adapters/ray/test_ray_export.py",
    "tests/adapters/wandb/test_wandb_offline.py",
    "tests/adapters/wandb/test_wandb_tracker.py",
    "tests/adapters/verl/test_verl_hook.py",
    "tests/adapters/vllm/test_vllm.py",
    "tests/jobs/bench/test_bench_all.py::"
    "test_bench_all_quick_writes_every_section_with_its_reference_and_a_markdown_table",
    "tests/jobs/demo/test_demo.py::test_smoke_run_trains_every_step_and_writes_its_own_run_directory",
]

# A plugin that runs only NEEDS_EXTRAS after collecting every module: one child pytest checks
# both that the whole suite collects and that those tests skip (two children took twice as long).
SELECT = f'''
KEEP = {tuple(NEEDS_EXTRAS)!r}


def pytest_collection_modifyitems(config, items):
    kept = [i for i in items if i.nodeid.startswith(KEEP)]
    config.hook.pytest_deselected(items=[i for i in items if i not in kept])
    items[:] = kept
'''


def hidden_env(tmp_path: Path) -> dict[str, str]:
    """A child environment in which the extras cannot be imported."""
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    (tmp_path / "needs_extras_only.py").write_text(SELECT)
    env = python_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    env.pop("CI", None)               # a developer's machine; CI's own run is the next case's
    return env


def test_the_blocker_hides_each_extra_like_a_missing_package(tmp_path):
    code = (f"import importlib\nfor m in {EXTRAS!r}:\n    try:\n"
            "        importlib.import_module(m)\n"
            "    except ModuleNotFoundError:\n        print('hidden', m)\n")
    out = subprocess.run([sys.executable, "-c", code], env=hidden_env(tmp_path),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"hidden {m}" for m in EXTRAS]


def test_the_suite_collects_and_tests_needing_an_extra_skip_without_the_extras(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "needs_extras_only",
         "-rs", "tests"], cwd=ROOT, env=hidden_env(tmp_path), capture_output=True, text=True,
        timeout=300)
    text = res.stdout + res.stderr
    summary = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr
    assert res.returncode == 0, text[-5000:]
    assert "ERROR" not in text and "Error" not in text, text[-5000:]   # no module failed to load
    assert "failed" not in summary and "error" not in summary, summary
    assert int(re.search(r"(\d+) deselected", summary).group(1)) > 500, summary   # all collected
    skips = [line for line in res.stdout.splitlines() if line.startswith("SKIPPED")]
    for target in NEEDS_EXTRAS:
        assert any(f" {target.partition('::')[0]}:" in line for line in skips), (target, skips)


def test_in_ci_the_same_missing_extras_fail_the_run_naming_each(tmp_path):
    """What CI would do if an extra stopped installing: the run fails, each missing module
    named, instead of the tests above turning into skips."""
    env = dict(hidden_env(tmp_path), CI="true")
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "needs_extras_only",
         "-rs", "tests"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    text = res.stdout + res.stderr
    assert res.returncode != 0, text[-5000:]
    for module in ("wandb", "transfer_queue"):
        assert f"CI installs every extra, but: {module} is not importable" in text, text[-5000:]
