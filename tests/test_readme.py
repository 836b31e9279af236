"""The README's Python example runs as written, twice in a row on the same lake (the second run
restores the first one's lake and adds its own group)."""
from __future__ import annotations

import os
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs_twice_as_written(tmp_path, monkeypatch, capsys):
    block = re.search(r"## Python in a few lines\n\n```python\n(.*?)```", README.read_text(), re.S)
    assert block is not None, "the README lost its Python example"
    monkeypatch.chdir(tmp_path)
    code = compile(block.group(1), "README.md", "exec")
    uids = []
    for _ in range(2):
        scope: dict = {}
        exec(code, scope)   # noqa: S102 - our own README, run as a user would
        assert scope["batch"].uids == [scope["uid"]]
        assert scope["tensors"]["input_ids"].shape == (2, 4)
        uids.append(scope["uid"])
    assert uids[0] != uids[1]
    assert os.path.isdir(tmp_path / "runs" / "exp1" / "lake" / "trajectories")
    assert "please dispatch" not in capsys.readouterr().out   # nothing filtered: rewards 0, 1


def test_readme_time_travel_lineage_and_prompt_examples_print_what_the_readme_shows(tmp_path):
    """The run of "Time travel, lineage and prompts" is executed as written, then every
    `$ replaylake sql ...` line of that section is run in an 80-column terminal and must print
    exactly the lines shown under it."""
    import shlex
    import subprocess
    import sys

    section = README.read_text().split("### Time travel, lineage and prompts", 1)[1]
    section = section.split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "the time-travel section lost its Python run"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(code.group(1), "README.md", "exec"), {})   # noqa: S102 - our own README
    finally:
        os.chdir(cwd)
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, re.S)   # fences in pairs, in order
    shown = [body for lang, body in blocks if lang == "console"]
    commands = [c for block in shown for c in re.split(r"^(?=\$ )", block, flags=re.M) if c]
    assert len(commands) == 4
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(README.parent)}   # a terminal's width
    for command in commands:
        line, _, expected = command.partition("\n")
        argv = shlex.split(line[2:])
        assert argv[:2] == ["replaylake", "sql"]
        out = subprocess.run([sys.executable, "-m", "jobs.cli", *argv[1:]], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.rstrip("\n") == expected.rstrip("\n"), line
