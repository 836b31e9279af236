"""One Ray cluster and one TransferQueue per test session, shared by every verl test.

Ray is the session's one cluster (the `ray_cluster` fixture of tests/conftest.py: two nodes
started with `ray start`, 6 CPUs in all: on these 2-core machines TransferQueue's actors each ask
for a CPU and would otherwise wait forever), then `transfer_queue.init()` with one storage unit
(each unit is a process that imports torch: one is enough for tests and starts several seconds
sooner).
The tests are skipped only when verl 0.9.1 / TransferQueue are not importable (and fail then in
CI: `make test` installs them).
"""
from __future__ import annotations

import os
import warnings

import pytest

from tests.adapters.verl._harness import Rollout
from tests.support.extras import missing


def _import_stack():
    try:
        import ray
        import transfer_queue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import verl.trainer.ppo.v1.replay_buffer  # noqa: F401
    except ImportError as exc:  # pragma: no cover - only without the verl extra
        missing(f"verl 0.9.1 / TransferQueue 0.1.11 not importable ({exc}); `make test` "
                "installs them")
    return ray, transfer_queue


@pytest.fixture(scope="session")
def tq(ray_cluster):
    """The `transfer_queue` module, initialised on the session's Ray cluster (tests/conftest.py:
    one cluster per session, started before TransferQueue, shut down after it closes)."""
    os.environ.setdefault("TQ_LOGGING_LEVEL", "ERROR")
    _ray, transfer_queue = _import_stack()
    from omegaconf import OmegaConf
    transfer_queue.init(OmegaConf.create(
        {"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    yield transfer_queue
    transfer_queue.close()


@pytest.fixture
def rollout(tq):
    """A writer that plays verl's trainer + agent loop; TransferQueue is empty before each test."""
    r = Rollout(tq)
    r.clear_all()
    yield r
    r.clear_all()
