"""What a test does when something it needs is not installed, decided in one place.

`need(module, extra)` imports ``module`` for a test. Where it is missing, a developer's run skips
the test (naming the extra and the command that installs it), but a CI run (``CI=true``) fails
it: CI installs every extra, so a missing one means the install broke, and a green run made of
skips would hide it. Only two things may skip in CI: a test that needs a GPU and a test that needs
a vLLM install (see `ci_skips.ALLOWED`); every other skip in a CI run fails the session.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set to true, as CI services do)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def need(module: str, extra: str, install: str = "make test") -> ModuleType:
    """``module`` imported, or this test skipped (fails under CI) naming the ``extra`` it comes
    with and the command that installs it."""
    __tracebackhide__ = True          # a skip is reported at the test that needs the module
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing(f"{module} is not importable ({exc}); it comes with the {extra} extra and "
                f"`{install}` installs it")
        raise  # pragma: no cover - missing() never returns


def missing(message: str) -> None:
    """Skip the running test for ``message`` (a missing install), or fail it in CI."""
    __tracebackhide__ = True
    if in_ci():
        pytest.fail(f"CI installs every extra, but: {message}", pytrace=False)
    pytest.skip(message, allow_module_level=True)
