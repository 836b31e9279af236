"""A newcomer's first five minutes, as the README's first screen tells them: `make run`, then the
commands it prints, pasted into the same shell.

The demo runs as `make run` runs it (the venv's own `replaylake` executable, the venv not
activated, in a directory of its own as a fresh checkout would be), only shorter. Then every
"Try" command it printed runs in bash from that directory, and so does the W&B upload command
(with `--dry-run`: it must find the run the demo wrote, without uploading it). Any
`command not found`, traceback or empty answer fails the test.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPTS = Path(sysconfig.get_path("scripts"))
REPLAYLAKE = SCRIPTS / "replaylake"
BASH = shutil.which("bash")
STEPS = 6          # the smoke run of test_demo.py: a few real steps, evictions included

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not REPLAYLAKE.is_file(), reason="needs the installed `replaylake` script"),
    pytest.mark.skipif(BASH is None, reason="pastes the printed commands into bash"),
]


def _users_shell() -> dict[str, str]:
    """The environment of a user who ran `make run`: the venv is not on PATH, nothing is
    activated, and no W&B session of this test process is shared (wandb hands its service to
    child processes through WANDB_* variables; a run of this process's may have started one).
    PYTHONPATH names this checkout, so the venv's executable runs this tree's code even where
    its editable install points at another one (a no-op in a plain checkout)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("WANDB_")}
    scripts = SCRIPTS.resolve()
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != scripts)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.update(WANDB_MODE="offline", COLUMNS="80", PYTHONHASHSEED="0")
    return env


def _failures(res: subprocess.CompletedProcess) -> list[str]:
    said = res.stdout + res.stderr
    return [why for why, bad in (("exit status", res.returncode != 0),
                                 ("command not found", "command not found" in said
                                  or "No such file or directory" in said),
                                 ("traceback", "Traceback" in said),
                                 ("empty answer", not res.stdout.strip() and not res.stderr.strip()))
            if bad]


def _section(text: str, heading: str) -> list[str]:
    """The lines under a heading of the summary, up to the next blank line."""
    lines = text.splitlines()
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """`make run` in a fresh directory, shorter: (the directory, the shell, what it printed)."""
    here = tmp_path_factory.mktemp("checkout")
    env = _users_shell()
    res = subprocess.run([str(REPLAYLAKE), "demo", "--steps", str(STEPS)], cwd=here, env=env,
                         capture_output=True, text=True, timeout=300)
    assert not _failures(res), (res.stdout, res.stderr)
    return here, env, res.stdout


def test_the_test_runs_the_demo_the_way_make_run_does():
    recipe = re.search(r"^run:.*\n\t(.+)$", (REPO / "Makefile").read_text(), re.M)
    assert recipe is not None and recipe.group(1) == "$(BIN)/replaylake demo"


def test_every_command_the_demo_suggests_runs_as_printed_from_where_the_user_stands(first_run):
    here, env, printed = first_run
    block = _section(printed, "Try")
    commands = "\n".join(block).split("\n  # ")
    commands = [c.split("\n", 1)[1] for c in commands if "\n" in c]
    assert len(commands) == 3, printed
    for command in commands:
        res = subprocess.run([BASH, "-c", command], cwd=here, env=env, capture_output=True,
                             text=True, timeout=120)
        assert not _failures(res), (command, res.stdout, res.stderr)
        rows = re.search(r"\((\d+) rows?", res.stdout)
        assert rows and int(rows.group(1)) > 0, (command, res.stdout)


def test_the_printed_lake_and_w_and_b_run_are_found_from_where_the_user_stands(first_run):
    here, env, printed = first_run
    where = _section(printed, "Where to look")
    lake = next(x for x in where if x.startswith("  lake ")).split(None, 1)[1]
    assert lake.startswith("runs/demo/")            # as the user sees it: relative to here
    assert (here / lake).is_dir() and (here / lake).parent.name in printed
    at = next(i for i, x in enumerate(where) if x.startswith("  W&B run "))
    upload = "\n".join(where[at + 1:])
    assert " sync " in upload and "offline-run-" in upload, printed
    dry_run = upload.replace(" sync ", " sync --dry-run ", 1)
    res = subprocess.run([BASH, "-c", dry_run], cwd=here, env=env, capture_output=True,
                         text=True, timeout=120)
    assert not _failures(res), (dry_run, res.stdout, res.stderr)
    assert "Would sync 1 run" in res.stdout + res.stderr, (res.stdout, res.stderr)


def test_the_closing_what_if_command_runs_as_printed(first_run):
    here, env, printed = first_run
    command = printed.split("# the whole run, every figure, and what each replay "
                            "approximates:\n")[1].strip()
    assert command.count("\n") == command.count("\\\n"), command      # one command, continued
    res = subprocess.run([BASH, "-c", command], cwd=here, env=env, capture_output=True,
                         text=True, timeout=300)
    assert not _failures(res), (command, res.stdout, res.stderr)
    assert f"replayed 3 policies x {STEPS} sample calls" in res.stdout
    assert "whatif.html" in res.stdout.split("wrote:")[1]
