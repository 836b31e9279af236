"""The runnable examples of docs/vllm.md run as written (```python blocks; ```py ones need vLLM)."""
from __future__ import annotations

from pathlib import Path

from tests.support.doc_commands import python_blocks

DOC = Path(__file__).resolve().parents[3] / "docs" / "vllm.md"


def test_the_vllm_guide_examples_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks(DOC)
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {"__name__": "vllm_doc"})
