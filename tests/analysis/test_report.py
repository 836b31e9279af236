"""`replaylake report`: a self-contained HTML page whose figures are real PNGs and whose headline
numbers are what SQL says about the same lake; lakes with nothing to show get a clear message."""
from __future__ import annotations

import base64
import html
import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image as mpimg
from typer.testing import CliRunner

from jobs.cli import app
from pipeline import ReplayBuffer
from pipeline.analysis.report.data import ReportError, gather, parse_steps
from pipeline.analysis.report.figures import FIGURES
from pipeline.analysis.views import connect
from tests.support.lake import add_group
from tests.support.sql_runs import shared_run

ROOT = Path(__file__).resolve().parents[2]
_IMG = re.compile(r"<img [^>]*src='data:image/png;base64,([A-Za-z0-9+/=]+)'")


def _report(lake: Path, out: Path, *args: str) -> str:
    res = CliRunner().invoke(app, ["report", str(lake), "-o", str(out), "--no-progress", *args])
    assert res.exit_code == 0, res.output
    return out.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def async_page(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _report(shared_run("async").lake, tmp_path_factory.mktemp("report") / "r.html")


def _pngs(page: str) -> list[np.ndarray]:
    return [mpimg.imread(io.BytesIO(base64.b64decode(b)), format="png")
            for b in _IMG.findall(page)]


def test_every_figure_of_every_trained_partition_is_an_embedded_png_that_decodes(
        async_page: str) -> None:
    images = _pngs(async_page)
    assert len(images) == 2 * len(FIGURES)          # partitions train and val
    for img in images:
        h, w = img.shape[:2]
        assert w >= 800 and h >= 250
        assert img[..., :3].std() > 0.05             # drawn on, not a blank canvas
    for spec in FIGURES:
        assert f"id='train-{spec.key}'" in async_page and f"id='val-{spec.key}'" in async_page
        assert html.escape(spec.caption) in async_page


def test_the_page_refers_to_no_other_file_or_site(async_page: str) -> None:
    text = _IMG.sub("<img>", async_page)
    assert "http://" not in text and "https://" not in text
    assert re.findall(r"(?:src|href)\s*=", text) == []
    assert "url(" not in text and "@import" not in text


def test_the_headline_numbers_agree_with_sql_on_the_same_lake(async_page: str) -> None:
    lake = shared_run("async").lake
    data = gather(lake)
    con = connect(lake)
    for p in data.partitions:
        h, args = p.headline, {"p": p.name}

        def one(q: str, args: dict = args) -> tuple:
            return con.execute(q, args).fetchone()
        assert h["batches"] == one("select count(*) from batches where partition = $p")[0]
        n, tokens, mean, worst, span = one(
            "select count(*), sum(n_response_tokens), avg(staleness), max(staleness), avg(span) "
            "from provenance where partition = $p and not is_padding")
        assert (h["trajectories"], h["response_tokens"], h["staleness_max"]) == \
            (n, tokens, worst)
        assert h["staleness_mean"] == pytest.approx(mean)
        assert h["span_mean"] == pytest.approx(span)
        fates = dict(con.execute("select fate, count(*) from groups where partition = $p "
                                 "group by fate", args).fetchall())
        assert h["groups_trained"] == fates.get("sampled", 0) > 0
        assert h["groups_evicted"] == fates.get("evicted", 0)
        assert h["groups_live"] == fates.get("live", 0)
        assert h["groups_dispatched"] == sum(fates.values())
        assert h["groups_filtered"] == one(
            "select count(distinct uid) from decisions where partition = $p and kind = 'evict' "
            "and reason = 'zero_variance'")[0]
        # the page shows the same figures
        assert f"<td class='num'>{h['batches']:,}</td>" in async_page
        assert f"<td class='num'>{h['staleness_mean']:,.3f}</td>" in async_page
    train = next(p for p in data.partitions if p.name == "train").headline
    assert train["groups_evicted"] > 0 and train["groups_filtered"] > 0


def test_a_step_window_keeps_only_its_steps_and_its_headline_counts_only_them(
        tmp_path: Path) -> None:
    lake = shared_run("async").lake
    data = gather(lake, steps=(3, 5), partitions=["train"])
    (p,) = data.partitions
    assert (p.headline["first_step"], p.headline["last_step"]) == (3, 5)
    want = connect(lake).execute("select count(*) from batches where partition = 'train' and "
                                 "step between 3 and 5").fetchone()[0]
    assert p.headline["batches"] == want == 3
    for name, rows in p.tables.items():
        col = "dispatch_step" if name == "selection_bias" else "step"
        assert rows and all(3 <= r[col] <= 5 for r in rows), name
    page = _report(lake, tmp_path / "w.html", "--steps", "3:5", "--partition", "train")
    assert "steps 3 to 5" in page and len(_IMG.findall(page)) == len(FIGURES)


def test_a_sync_dapo_run_reports_its_surplus_discards(tmp_path: Path) -> None:
    lake = shared_run("sync").lake
    page = _report(lake, tmp_path / "s.html")
    (p,) = gather(lake).partitions
    discarded = connect(lake, filter_metric="acc").execute(
        "select count(*) from groups where fate = 'discarded'").fetchone()[0]
    assert p.headline["groups_discarded"] == discarded > 0
    assert len(_pngs(page)) == len(FIGURES)
    assert "<th>filter_groups_metric</th><td>acc</td>" in page


@pytest.mark.parametrize(("text", "want"), [
    (None, (None, None)), (":", (None, None)), ("3:9", (3, 9)), ("3:", (3, None)),
    (":9", (None, 9)), ("4:4", (4, 4)), ("5", (5, 5)), ("0", (0, 0))])
def test_steps_are_read_as_an_inclusive_window(text: str | None, want: tuple) -> None:
    assert parse_steps(text) == want


@pytest.mark.parametrize(("text", "message"), [
    ("9:3", "the first step is after the last"), ("a:b", "write A:B"), ("1:2:3", "write A:B"),
    ("x", "write A:B"), ("-5:3", "trainer steps count from 0"),
    (":-1", "trainer steps count from 0"), ("-5", "trainer steps count from 0")])
def test_a_malformed_step_window_is_refused(text: str, message: str) -> None:
    with pytest.raises(ReportError, match=f"--steps '{re.escape(text)}': {message}"):
        parse_steps(text)


def test_a_single_step_is_a_window_and_a_negative_one_is_refused(tmp_path: Path) -> None:
    lake = shared_run("async").lake
    (p,) = gather(lake, steps=(4, 4), partitions=["train"]).partitions
    assert (p.headline["first_step"], p.headline["last_step"], p.headline["batches"]) == (4, 4, 1)
    page = _report(lake, tmp_path / "one.html", "--steps", "4", "--partition", "train")
    assert "steps 4 to 4" in page
    out = _cli_error(str(lake), "--steps", "-5:3", "-o", str(tmp_path / "neg.html"))
    assert "--steps '-5:3': trainer steps count from 0" in out
    assert not (tmp_path / "neg.html").exists()


def test_a_window_outside_the_run_is_refused_before_any_query_naming_the_trained_steps() -> None:
    lake = shared_run("async").lake
    first, last = connect(lake).execute(
        "select min(step), max(step) from batches").fetchone()
    ran: list[str] = []
    with pytest.raises(ReportError) as err:
        gather(lake, steps=(last + 100, last + 200), progress=ran.append)
    assert ran == []                                  # not one of the report's queries
    message = " ".join(str(err.value).split())
    assert f"in steps {last + 100}:{last + 200}: no batch was handed out there" in message
    assert f"the run trained steps {first}..{last}" in message


def test_the_heatmaps_tick_exact_steps_including_both_ends(tmp_path: Path) -> None:
    from tests.analysis.test_whatif import _pipelined_run
    lake = _pipelined_run(tmp_path / "lake", steps=64)       # trains steps 1 to 64

    def ticks(steps: tuple[int | None, int | None]) -> list[list[str]]:
        (p,) = gather(lake, steps=steps).partitions
        figs = [spec.draw(p) for spec in FIGURES if spec.key in ("staleness", "span")]
        assert len(figs) == 2
        return [[t.get_text() for t in fig.axes[1].get_xticklabels()] for fig in figs]
    for got in ticks((10, 20)):                               # one column per step
        assert got == [str(s) for s in range(10, 21)]
    for got in ticks((None, None)):                           # columns of two steps each
        assert got[0] == "1" and got[-1] == "64"
        assert all(t.isdigit() and 1 <= int(t) <= 64 for t in got)


def _cli_error(*args: str) -> str:
    res = CliRunner().invoke(app, ["report", *args, "--no-progress"])
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit)      # a message, not a traceback
    return res.output


def test_an_empty_lake_gets_a_clear_message_and_no_page(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    ReplayBuffer.async_(lake=lake, max_off_policy_threshold=2).close()
    out = _cli_error(str(lake), "-o", str(tmp_path / "r.html"))
    assert "nothing to report" in out and "no group was registered" in out
    assert not (tmp_path / "r.html").exists()


def test_a_lake_without_trained_batches_gets_a_clear_message(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=2) as buf:
        add_group(buf, "u1", 1)
        add_group(buf, "u2", 1, status="running")
    out = _cli_error("--lake", str(lake), "-o", str(tmp_path / "r.html"))
    assert "nothing to report" in out and "no batch was handed out" in out


def test_a_window_without_batches_a_missing_lake_and_an_unknown_partition_are_clear(
        tmp_path: Path) -> None:
    lake = shared_run("async").lake
    out = " ".join(_cli_error(str(lake), "--steps", "500:600").split())
    assert "no batch was handed out" in out
    assert "the run trained steps 1..8 (partitions train 1..8, val 3..6)" in out
    assert "no lake at" in _cli_error(str(tmp_path / "nowhere"))
    assert "no partition 'test'" in _cli_error(str(lake), "--partition", "test")
    assert "missing the lake" in _cli_error()
    assert "name the lake once" in _cli_error(str(lake), "--lake", str(tmp_path))


def test_the_help_shows_an_example() -> None:
    res = CliRunner().invoke(app, ["report", "--help"])
    assert res.exit_code == 0
    assert "Examples:" in res.output
    assert "replaylake report runs/demo/latest/lake -o report.html" in res.output


@pytest.mark.slow
def test_the_demo_lake_reports_through_the_installed_command_line(tmp_path: Path) -> None:
    run = tmp_path / "demo"
    subprocess.run([sys.executable, "-m", "jobs.cli", "demo", "--steps", "8", "--no-wandb",
                    "--out", str(run)], cwd=ROOT, check=True, capture_output=True, timeout=600)
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "report", "--lake",
                           str(run / "lake"), "--out", str(tmp_path / "demo.html")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr and "report:" not in proc.stderr   # a pipe: no bar frames
    assert "wrote" in proc.stdout and "6 figures" in proc.stdout
    images = _pngs((tmp_path / "demo.html").read_text(encoding="utf-8"))
    assert len(images) == len(FIGURES) and all(i[..., :3].std() > 0.05 for i in images)


def test_the_shared_views_are_computed_once_into_temporary_tables_with_the_same_rows() -> None:
    from pipeline.analysis.report.data import QUERIES, SHARED_VIEWS, materialise
    from sql import loader
    lake = shared_run("async").lake
    plain, shared = connect(lake), connect(lake)
    materialise(shared, SHARED_VIEWS)
    temp = {r[0] for r in shared.sql(
        "select table_name from duckdb_tables() where temporary").fetchall()}
    assert set(SHARED_VIEWS) <= temp
    params = {"report_headline": {"first_step": -1, "last_step": 2**62}}
    for name in QUERIES:
        want = loader.run(plain, name, **params.get(name, {})).to_pylist()
        assert want and loader.run(shared, name, **params.get(name, {})).to_pylist() == want


def test_the_prompts_section_ranks_the_wasteful_and_the_solved_prompts(tmp_path: Path) -> None:
    from pipeline.analysis.report.data import PROMPTS_TOP
    from sql import loader
    from tests.support.prompt_runs import prompt_run
    lake = prompt_run(tmp_path / "lake")
    (p,) = gather(lake, steps=(4, 4)).partitions        # the window does not cut the history
    assert p.prompts == loader.run(connect(lake), "prompt_leaders",
                                   top=PROMPTS_TOP).to_pylist()
    assert [(r["board"], r["rank"], r["prompt_id"], r["tokens_wasted"]) for r in p.prompts] == [
        ("wasteful", 1, 1, 14), ("wasteful", 2, 4, 12), ("wasteful", 3, 2, 7),
        ("solved", 1, 1, 14)]
    page = _report(lake, tmp_path / "p.html")
    section = page[page.index("id='train-prompts'"):]
    wasteful, solved = section.split("<h4>")[1:3]
    cells = re.compile(r"<tr><td class='num'>(\d+)</td><td class='num'>(\d+)</td>"
                       r"<td class='num'>([\d,.]+)</td>")
    assert wasteful.startswith("Prompts that waste the most generation")
    assert cells.findall(wasteful) == [("1", "1", "14"), ("2", "4", "12"), ("3", "2", "7")]
    assert solved.startswith("Solved prompts")
    assert cells.findall(solved) == [("1", "1", "6")]           # 6 responses


def test_a_lake_without_prompt_ids_says_so_in_its_prompts_section(async_page: str) -> None:
    for part in ("train", "val"):
        section = async_page.split(f"id='{part}-prompts'")[1].split("<h2>")[0]
        assert "carry no prompt id" in section and "<table>" not in section


def test_the_page_fits_a_phone_its_tables_scroll_and_its_labels_read_once(async_page: str) -> None:
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in async_page
    tables = async_page.count("<table")
    assert tables and async_page.count("<div class='scroll'><table") == tables
    assert "((" not in async_page                       # no doubled brackets in the labels


def _ticks(axis: object) -> list[float]:
    lo, hi = sorted(axis.get_view_interval())
    return [t for t in axis.get_majorticklocs() if lo - 1e-9 <= t <= hi + 1e-9]


def test_a_one_step_report_ticks_whole_steps_and_draws_that_step_visibly() -> None:
    lake = shared_run("async").lake
    (p,) = gather(lake, steps=(4, 4), partitions=["train"]).partitions
    for spec in FIGURES:
        fig = spec.draw(p)
        fig.canvas.draw()
        for ax in fig.axes:
            if "step" not in ax.get_xlabel() or ax.get_label() == "<colorbar>":
                continue
            ticks = [t.get_text() for t in ax.get_xticklabels()]     # heatmaps: columns
            assert ticks and all(t.isdigit() for t in ticks), (spec.key, ticks)
            if "dispatch" not in ax.get_xlabel():
                assert ticks == ["4"], (spec.key, ticks)
            assert ax.lines or ax.patches or ax.collections, spec.key    # not empty axes
            if spec.key in ("evictions", "filtered", "occupancy"):       # counts come whole
                assert all(t == round(t) for t in _ticks(ax.yaxis)), spec.key
                lo, hi = ax.get_xlim()
                bar = max(b.get_width() for b in ax.patches)
                assert lo <= 4 - bar / 2 and 4 + bar / 2 <= hi and bar <= (hi - lo) / 2


def test_an_out_that_is_a_directory_is_refused_up_front_and_leaves_no_temp_file(
        tmp_path: Path) -> None:
    out = tmp_path / "pages"
    out.mkdir()
    message = _cli_error(str(shared_run("async").lake), "-o", str(out))
    assert f"-o {out} is a directory" in message and str(out / "report.html") in message
    assert list(out.iterdir()) == [] and sorted(tmp_path.iterdir()) == [out]


def test_filtered_values_that_agree_in_six_digits_keep_a_legend_entry_each() -> None:
    """Two metric values `:g` printed alike (0.123456) were drawn as one series with one
    color; each keeps its own, labelled in full."""
    from pipeline.analysis.report.data import PartitionData
    from pipeline.analysis.report.figures import filtered
    rows = [{"step": 1, "value": 0.1234561, "n_groups": 2},
            {"step": 1, "value": 0.1234564, "n_groups": 3},
            {"step": 2, "value": 1.0, "n_groups": 1}]
    fig = filtered(PartitionData("train", {}, {"filtered_rewards": rows}))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["all = 0.1234561 (2)", "all = 0.1234564 (3)", "all = 1 (1)"]


def test_a_partition_without_rewards_or_tokens_says_so_before_its_figures(tmp_path: Path,
                                                                          async_page: str) -> None:
    """A lake whose producer sent no rewards and neither tokens nor their count (rewards null,
    token lists empty): the report says what its trajectories lack instead of drawing zeros as
    the run's; a lake that has them says nothing of the kind."""
    lake = tmp_path / "lake"
    with ReplayBuffer.sync(lake=lake) as buf:
        for i, step in enumerate((1, 2, 3)):
            buf.register(partition="train", uids=[f"g{i}"], global_steps=step, n=2)
            buf.put([{"partition": "train", "uid": f"g{i}", "session_id": s,
                      "min_global_steps": step - 1, "max_global_steps": step - 1, "reward": None,
                      "prompt_ids": [], "response_ids": []} for s in range(2)])
            buf.update_status(partition="train", uids=[f"g{i}"], status="running")
            buf.update_status(partition="train", uids=[f"g{i}"], status="finished")
            buf.release(buf.sample(step, "train", 1))
    (p,) = gather(lake).partitions
    assert p.missing == ("rewards", "response tokens")
    page = _report(lake, tmp_path / "r.html")
    assert page.count("trajectories hold no") == 2
    assert page.index("hold no rewards") < page.index("<img")
    assert "trajectories hold no" not in async_page
