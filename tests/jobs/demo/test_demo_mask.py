"""The demo under `--strategy mask`: with `--ahead 3` batches in the pipeline and threshold 2,
groups reach the trainer over the bound; they are trained masked, none is evicted as stale, and
nothing is generated again for staleness (every refill replaces a group evicted for another
reason: here a failed one). Read from the lake, as the summary reads it.

Without the DAPO filter (`--filter-metric none`) the regime does not hang on thread timing: the
first step dispatches three batches at once, so the third is trained at step 3 at group span 3,
over the bound, however fast the workers are (with the filter, refills can replace them first)."""
from __future__ import annotations

import io
import json
from dataclasses import replace

import pytest
from rich.console import Console

from jobs.demo.config import DemoConfig
from jobs.demo.main import run
from jobs.demo.summary import summarize
from pipeline.analysis.views import connect
from pipeline.lake import config as lake_config
from sql.loader import run as run_query

STEPS = 12


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo-mask") / "run"
    cfg = replace(DemoConfig(), steps=STEPS, strategy="mask", filter_metric=None)
    run(cfg, out=out, use_wandb=False, console=Console(file=io.StringIO(), width=80))
    return out


def test_mask_trains_stale_groups_marked_and_evicts_none_as_stale(run_dir) -> None:
    lake = run_dir / "lake"
    con = connect(lake)
    assert lake_config.current(lake)["max_off_policy_strategy"] == "mask"
    ((stale,),) = con.sql("select count(*) from decisions where kind = 'evict' "
                          "and reason = 'stale'").fetchall()
    assert stale == 0
    ((steps, groups, masked),) = con.sql(
        "select count(distinct step), count(*), count(*) filter (where reason = 'stale') "
        "from decisions where kind = 'select'").fetchall()
    assert (steps, groups) == (STEPS, STEPS * DemoConfig().batch_size)
    assert masked > 0          # the pipeline runs deeper than the bound: some groups go over it
    # the masked rows are exactly the rows the certificate audit names
    holds = run_query(con, "certificate_holds").to_pylist()
    assert {r["uid"] for r in holds} == {u for (u,) in con.sql(
        "select uid from decisions where kind = 'select' and reason = 'stale'").fetchall()}
    assert {r["strategy"] for r in holds} == {"mask"}


def test_mask_generates_nothing_again_for_staleness(run_dir) -> None:
    con = connect(run_dir / "lake")
    # every group a refill asked a prompt for was evicted, and for another reason than staleness
    reasons = dict(con.sql(
        "with replaced as (select unnest(replaces) as uid from decisions where kind = 'refill') "
        "select r.uid, list(distinct e.reason) from replaced as r "
        "left join decisions as e on e.kind = 'evict' and e.uid = r.uid "
        "group by r.uid").fetchall())
    assert reasons                                  # failed groups were refilled
    assert all(r and "stale" not in r for r in reasons.values())
    s = summarize(run_dir / "lake")
    assert (s.stale_refills, s.evictions["stale"]) == (0, 0)
    assert s.masked_groups > 0 and s.masked_rows == s.masked_groups * DemoConfig().n
    written = json.loads((run_dir / "summary.json").read_text())
    assert (written["stale_refills"], written["masked_groups"]) == (0, s.masked_groups)
