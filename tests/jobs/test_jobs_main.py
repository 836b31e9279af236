"""Every job module runs as `python -m jobs.<name>` (or `jobs.<package>.<name>`) too (the
`replaylake` CLI is one way in; a module that ignored `-m` would exit 0 having done nothing)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import python_ast
from tests.support.lake import ROOT

JOBS = sorted(p for p in (ROOT / "jobs").rglob("*.py")
              if any(isinstance(n, ast.FunctionDef) and n.name == "main"
                     for n in python_ast.parse(p.read_text()).body))


def _runs_main(path: Path) -> bool:
    for node in python_ast.parse(path.read_text()).body:
        if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and ast.unparse(node.test) in ("__name__ == '__main__'", '__name__ == "__main__"')):
            return "main" in ast.unparse(node)
    return False


@pytest.mark.parametrize("path", JOBS, ids=lambda p: str(p.relative_to(ROOT / "jobs")))
def test_a_job_with_a_main_runs_it_under_dash_m(path: Path) -> None:
    assert _runs_main(path), f"{path.name}: add `if __name__ == \"__main__\": typer.run(main)`"


def test_dash_m_prints_the_jobs_help() -> None:
    out = subprocess.run([sys.executable, "-m", "jobs.bench.table", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--doc" in out.stdout
