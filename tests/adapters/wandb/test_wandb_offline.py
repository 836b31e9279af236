"""Reading an offline W&B run back from its file (pipeline/adapters/wandb/offline.py)."""
from __future__ import annotations

import pytest

from pipeline.adapters.wandb.tracker import WandbTracker
from tests.support.extras import need

need("wandb", "wandb")
from pipeline.adapters.wandb.offline import (  # noqa: E402 - after the extra is known
    WandbRunFormatError,
    is_complete,
    read_records,
    read_run,
    run_file,
)


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory):
    """A real offline run of 40 steps, large enough that records cross 32 KiB blocks."""
    root = tmp_path_factory.mktemp("wb")
    with WandbTracker(dir=root, mode="offline") as tracker:
        for g in range(1, 41):
            tracker.log_step(g, {"loss": 1.0 / g, "step_squared": float(g * g)}, {0.0: g, 1.0: 1})
        run_dir = tracker.run_dir
    return run_dir


def test_every_logged_step_reads_back_in_order(offline_run):
    run = read_run(offline_run)
    assert run.finished and is_complete(offline_run)
    assert run.values("step_squared") == {g: g * g for g in range(1, 41)}
    assert run.values("loss")[8] == pytest.approx(0.125)
    assert run_file(offline_run).stat().st_size > 32768


def test_a_torn_last_chunk_ends_the_records_without_an_error(offline_run, tmp_path):
    data = run_file(offline_run).read_bytes()
    whole = read_records(run_file(offline_run))
    torn = tmp_path / "run-torn.wandb"
    torn.write_bytes(data[:-5])
    records = read_records(torn)
    assert records == whole[:len(records)] and len(records) == len(whole) - 1


def test_a_damaged_chunk_inside_the_file_is_an_error_naming_its_offset(offline_run, tmp_path):
    data = bytearray(run_file(offline_run).read_bytes())
    data[200] ^= 0xFF
    bad = tmp_path / "run-bad.wandb"
    bad.write_bytes(bytes(data))
    with pytest.raises(WandbRunFormatError, match="bad checksum in the chunk at offset"):
        read_records(bad)


def test_a_file_that_is_not_a_run_file_is_refused(tmp_path):
    other = tmp_path / "run-x.wandb"
    other.write_bytes(b"hello, not a run")
    with pytest.raises(WandbRunFormatError, match="not a W&B run file"):
        read_records(other)
    assert not is_complete(tmp_path)
