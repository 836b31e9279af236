"""The runnable examples of docs/ray.md run as written, in order, on the session's Ray cluster."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.doc_commands import python_blocks

DOC = Path(__file__).resolve().parents[3] / "docs" / "ray.md"


@pytest.mark.usefixtures("ray_cluster")
def test_the_ray_guide_examples_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks(DOC)
    assert len(blocks) == 2
    namespace = {"__name__": "ray_doc"}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
