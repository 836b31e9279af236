"""The words the demo prints for the user's shell (jobs/demo/shell.py), run by a real bash.

`make run` runs replaylake from `.venv` without activating it: a printed command must name the
program so that the user's shell finds it, and a printed path must work from where they stand.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from jobs.demo.shell import pasteable, program

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="runs the printed words in bash")


def _script(bin_dir: Path, name: str, says: str) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\necho {says} \"$@\"\n")
    script.chmod(0o755)
    return script


def _bash(line: str, cwd: Path, path: str) -> subprocess.CompletedProcess:
    return subprocess.run([BASH, "-c", line], cwd=cwd, env={**os.environ, "PATH": path},
                          capture_output=True, text=True, timeout=30)


def test_a_script_of_a_venv_that_is_not_active_is_printed_as_its_path_and_runs_as_printed(
        tmp_path):
    checkout = tmp_path / "checkout"
    _script(checkout / ".venv" / "bin", "replaylake", "ours")
    word = program("replaylake", scripts=checkout / ".venv" / "bin", cwd=checkout, path="/usr/bin")
    assert word == ".venv/bin/replaylake"
    res = _bash(f"{word} sql", checkout, "/usr/bin:/bin")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "ours sql\n"


def test_the_bare_name_is_printed_when_the_users_path_finds_this_very_script(tmp_path):
    bin_dir = tmp_path / ".venv" / "bin"
    _script(bin_dir, "replaylake", "ours")
    path = f"{bin_dir}:/usr/bin:/bin"
    assert program("replaylake", scripts=bin_dir, cwd=tmp_path, path=path) == "replaylake"
    assert _bash("replaylake demo", tmp_path / ".venv", path).stdout == "ours demo\n"


def test_another_install_first_on_the_path_does_not_count_as_this_one(tmp_path):
    ours = tmp_path / "checkout" / ".venv" / "bin"
    _script(ours, "replaylake", "ours")
    theirs = tmp_path / "elsewhere" / "bin"
    _script(theirs, "replaylake", "theirs")
    path = f"{theirs}:/usr/bin:/bin"
    word = program("replaylake", scripts=ours, cwd=tmp_path / "checkout", path=path)
    assert word == ".venv/bin/replaylake"
    assert _bash(word, tmp_path / "checkout", path).stdout == "ours\n"


def test_a_script_outside_the_users_directory_is_printed_absolute_and_quoted(tmp_path):
    bin_dir = tmp_path / "my tools" / "bin"
    _script(bin_dir, "wandb", "ours")
    here = tmp_path / "work"
    here.mkdir()
    word = program("wandb", scripts=bin_dir, cwd=here, path="/usr/bin")
    assert word == f"'{bin_dir / 'wandb'}'"
    res = _bash(f"{word} sync x", here, "/usr/bin:/bin")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "ours sync x\n"


def test_an_installation_without_the_script_falls_back_to_the_bare_name(tmp_path):
    assert program("replaylake", scripts=tmp_path, cwd=tmp_path, path="") == "replaylake"


def test_a_path_under_the_users_directory_is_printed_relative_and_others_stay_absolute(tmp_path):
    run = tmp_path / "runs" / "demo" / "20260101-000000" / "wandb" / "offline-run-x"
    assert pasteable(run, cwd=tmp_path) == "runs/demo/20260101-000000/wandb/offline-run-x"
    assert pasteable(run, cwd=tmp_path / "elsewhere") == str(run)
    assert pasteable(Path("runs/demo/x/lake"), cwd=tmp_path) == "runs/demo/x/lake"


def test_a_path_reached_through_a_symlinked_directory_is_still_printed_relative(tmp_path):
    real = tmp_path / "real"
    (real / "runs" / "lake").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    assert pasteable(real / "runs" / "lake", cwd=tmp_path / "link") == "runs/lake"
