"""The README's Python example runs as written (with a real refill_fn and a lake in tmp_path)."""
from __future__ import annotations

import os
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs(tmp_path, monkeypatch):
    block = re.search(r"## Python in ten lines\n\n```python\n(.*?)```", README.read_text(), re.S)
    assert block is not None, "the README lost its Python example"
    monkeypatch.chdir(tmp_path)
    calls: list[int] = []
    scope = {"my_dispatch": calls.append}
    exec(compile(block.group(1), "README.md", "exec"), scope)   # noqa: S102 - our own README
    assert scope["batch"].uids == ["p0"]
    assert scope["tensors"]["input_ids"].shape == (2, 4)
    assert os.path.isdir(tmp_path / "runs" / "exp1" / "lake" / "trajectories")
    assert calls == []          # nothing was filtered: rewards 0 and 1 differ
