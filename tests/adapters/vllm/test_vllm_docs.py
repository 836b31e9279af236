"""The runnable examples of docs/vllm.md run as written (```python blocks; ```py ones need vLLM)."""
from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[3] / "docs" / "vllm.md"


def python_blocks(doc: Path) -> list[str]:
    """The ```python blocks of a markdown file, in order (```py blocks are illustrations)."""
    return re.findall(r"^```python\n(.*?)^```", doc.read_text(), flags=re.S | re.M)


def test_the_vllm_guide_examples_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks(DOC)
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {"__name__": "vllm_doc"})
