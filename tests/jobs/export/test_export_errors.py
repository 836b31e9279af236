"""`replaylake export`'s refusals of its options name each flag as the user typed it (`--steps
20:5`, never `steps=20:5`), in one `error:` line with exit 2, and write nothing."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.lake import small_trained_lake
from tests.support.os_refusals import one_error_line, replaylake


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small lake: 3 groups of 2 trajectories, 2 of them trained and released at step 1."""
    return small_trained_lake(tmp_path_factory.mktemp("export-errors") / "lake")


MISTAKES = [
    (["--steps", "20:5"], "error: --steps 20:5: the first step is after the last"),
    (["--rows-per-shard", "0"], "error: --rows-per-shard 0: give 1 or more"),
    (["--row-group-mb", "0"], "error: --row-group-mb 0: give 1 or more"),
    (["--format", "csv"], "error: --format csv: use parquet and/or pt (repeat --format for both)"),
    (["--format", "pt", "--format", "csv"],
     "error: --format csv: use parquet and/or pt (repeat --format for both)"),
    (["--tensor-layout", "flat"], "error: --tensor-layout flat: use packed or padded"),
    (["--partition", "nope"], "error: unknown partition(s) 'nope' (--partition); the lake at "
                              "{lake} has train"),
]


@pytest.mark.parametrize(("args", "line"), MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_an_option_error_names_the_flag_as_typed(lake, tmp_path, args, line) -> None:
    out = tmp_path / "out"
    proc = replaylake("export", "--lake", str(lake), "--out", str(out), "--no-progress", *args)
    assert one_error_line(proc) == line.format(lake=lake)
    assert not out.exists()
