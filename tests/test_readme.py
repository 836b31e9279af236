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
