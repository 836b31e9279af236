"""Run a to_torch test module on both writer paths: the compiled extension and the numpy writers.

``both_writers`` is a module-scoped autouse fixture (module scope, so hypothesis's tests take it
too): a module that imports it runs every test twice, once with the extension (skipped where it
was not built) and once with ``REPLAYLAKE_PURE_PYTHON=1``.
"""
from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from pipeline.to_torch import runs as run_copies
from tests.support.extras import missing


@pytest.fixture(scope="module", params=["compiled", "numpy"], autouse=True)
def both_writers(request: pytest.FixtureRequest) -> Iterator[str]:
    name = run_copies.ENV_PURE_PYTHON
    if request.param == "compiled" and not run_copies.HAVE_EXTENSION:
        missing("the compiled extension pipeline.to_torch._runs was not built; "
                "`pip install -e .` (run by `make test`) builds it")
    before = os.environ.get(name)
    os.environ[name] = "1" if request.param == "numpy" else "0"
    try:
        yield request.param
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
