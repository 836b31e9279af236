"""The lake jobs draw a progress bar on a terminal only: their output to a pipe or a log file
(cron, a scheduler) holds the job's summary, never redrawn bar frames."""
from __future__ import annotations

import pytest

from jobs.progress import hidden
from tests.support.lake import small_trained_lake
from tests.support.os_refusals import replaylake


@pytest.mark.parametrize("job", [["compact"], ["retain", "--older-than", "0"],
                                 ["export", "--out", "{out}"], ["report", "-o", "{out}.html"]],
                         ids=["compact", "retain", "export", "report"])
def test_a_job_writing_to_a_pipe_draws_no_bar(tmp_path, job) -> None:
    lake = small_trained_lake(tmp_path / "lake")
    args = [a.replace("{out}", str(tmp_path / "out")) for a in job]
    if job[0] == "report":
        args = ["report", str(lake), *args[1:]]
    else:
        args = [args[0], "--lake", str(lake), *args[1:]]
    proc = replaylake(*args)        # stdout and stderr are pipes here
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr and "%|" not in proc.stderr, proc.stderr


def test_the_option_decides_only_where_a_bar_could_show() -> None:
    assert hidden(False) is True        # --no-progress: never
    assert hidden(True) is None         # tqdm's own test: a terminal only
