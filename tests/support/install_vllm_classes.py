"""Install vLLM 0.33.0's Python sources, without its engine, for the tests of the vLLM adapter.

The adapter reads vLLM's output classes (`RequestOutput`, `CompletionOutput`, `Logprob`,
`FlatLogprobs`) by duck typing and never imports vLLM. Its tests build outputs from look-alike
classes (tests/support/vllm_shapes.py) and, with ``REPLAYLAKE_REAL_VLLM=1``, from vLLM's real ones.
A full vLLM install brings a CUDA torch (gigabytes) and its compiled engine; the output classes
need neither. So `make test` runs this script once: it downloads the vLLM wheel (336 MB; pip's
cache keeps it) and the five small packages its output modules import, pinned, extracts every
file of the wheel but its compiled libraries (about 180 MB) and installs the small packages
beside them, all into one directory (`.venv/vllm-classes`) that only the real-class test run
puts on its path: nothing of it can shadow the test environment's own packages.

Usage: python tests/support/install_vllm_classes.py TARGET_DIR
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VLLM = "vllm==0.33.0"
# what `import vllm.outputs, vllm.logprobs` needs beyond the test environment's packages
SMALL = ("cbor2==6.3.0", "openai-harmony==0.0.8", "openai==3.57.0", "httpx2==2.16.2",
         "pybase64==1.5.1")


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], check=True)


def install(target: Path) -> None:
    """vLLM's sources and the small packages in ``target`` (made afresh)."""
    if target.exists():
        shutil.rmtree(target)
    with tempfile.TemporaryDirectory() as tmp:
        _pip("download", "--no-deps", "-d", tmp, VLLM)
        (wheel,) = Path(tmp).glob("vllm-*.whl")
        with zipfile.ZipFile(wheel) as z:
            z.extractall(target, members=[n for n in z.namelist() if not n.endswith(".so")])
    _pip("install", "--no-deps", "--target", str(target), *SMALL)
    (target / ".installed").write_text(f"{VLLM} {' '.join(SMALL)}\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    install(Path(sys.argv[1]))
