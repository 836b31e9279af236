"""`replaylake dev resume-harness`: the demo killed at positions of its run, resumed with sibling
reuse, and what each restart cost, read back from the lake.

    replaylake dev resume-harness --steps 8 --at 3
    replaylake dev resume-harness --positions put,sample --no-reuse

For every position, a child process runs a small demo (jobs/demo: real policy, rollout threads,
the trainer's checkpoint per step) and dies by SIGKILL there, once step ``--at`` is done:

- ``generation``: on a rollout worker's first token of a wave once the wave before it was put
  (its groups half generated, the wave under way lost);
- ``put``: half way through writing the second put after it (a torn write in the lake);
- ``sample``: inside the next `sample`, after its selection is written (the batch is held);
- ``step``: between two steps (the checkpoint written, the batch released);
- ``compaction``: inside a compaction of the lake the child runs itself (its segments rolled
  after every call), after the Parquet copy of a segment is in place;
- ``register``: half way through registering the next prompts.

A second child resumes the run (`replaylake demo --resume`: the checkpoint, then
`ReplayBuffer.resume`, or `reissue` with ``--no-reuse``) and finishes it. The figures then come
from the lake alone (sql/analysis/resume_figures.sql and redispatch_lengths.sql), and every
audit of sql/audits/ must pass.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

POSITIONS = ("generation", "put", "sample", "step", "compaction", "register")
DEFAULT_POSITIONS = POSITIONS[:5]
# the lake write point each position arms once step `at` is done (`pipeline.lake.kill`)
_POINTS = {"put": "trajectories.data_torn:2", "sample": "metrics.data_torn:1",
           "compaction": "compact.renamed:1", "register": "group_events.data_torn:1"}
# (torch._dynamo: what Adam's constructor imports, seconds on a busy machine)
_PRELOAD = ["torch", "torch.optim", "torch._dynamo", "numpy", "pyarrow", "polars", "duckdb",
            "pipeline", "pipeline.buffer", "pipeline.analysis", "pipeline.lake.compaction",
            "jobs.demo.main", "jobs.demo.policy", "jobs.demo.rollout", "jobs.demo.trainer",
            "jobs.demo.resume", "jobs.demo.summary", "rich.console", "rich.live"]


class HarnessError(RuntimeError):
    """A child did not die where it was asked to, or the resumed run failed."""


def small_demo(steps: int, seed: int = 0, **over: Any) -> Any:
    """The harness's demo: small batches, a short decode delay, the demo's buffer settings."""
    from jobs.demo.config import DemoConfig
    base = dict(steps=steps, batch_size=4, n=4, ahead=3, seed=seed, waves=2,
                sample_timeout_s=60.0)
    return DemoConfig(**{**base, **over})


class Killer:
    """The demo's probe in the killed child: arms the position once step ``at`` is done."""

    def __init__(self, position: str, at: int, lake: Path):
        self.position, self.at, self.lake = position, at, lake
        self.armed = False
        self.between: set[int] = set()      # rollout threads between two waves of their groups

    def __call__(self, event: str, value: Any) -> None:
        if event == "opened" and self.position == "compaction":
            value.lake.roll_bytes = 1          # every call finishes its segment: sealed ones
        elif event == "step" and value == self.at:
            self._arm()
        elif event == "wave" and self.armed:
            self.between.add(threading.get_ident())
        elif event == "token" and threading.get_ident() in self.between:
            _die()                             # its groups' first wave is in, the next begins

    def _arm(self) -> None:
        from pipeline.lake import kill as lake_kill
        if self.position == "step":
            _die()
        if self.position == "generation":
            self.armed = True
            return
        os.environ[lake_kill.ENV] = _POINTS[self.position]
        lake_kill.arm()
        if self.position == "compaction":
            from pipeline.lake import compact
            compact(self.lake)


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _quiet() -> Any:
    import logging

    from rich.console import Console
    logging.getLogger("replaylake").setLevel(logging.ERROR)   # the killed run's stale lock
    return Console(file=open(os.devnull, "w"))


def _killed(run_dir: str, cfg: dict, position: str, at: int) -> None:
    from jobs.demo.config import DemoConfig
    from jobs.demo.main import run
    try:
        run(DemoConfig(**cfg), out=Path(run_dir), use_wandb=False, console=_quiet(),
            probe=Killer(position, at, Path(run_dir) / "lake"), report=False)
    except BaseException:
        import traceback
        os.write(2, traceback.format_exc().encode())
        os._exit(4)
    os._exit(3)                                 # it never got there


def _resumed(run_dir: str, reuse: bool) -> None:
    from jobs.demo.main import run
    try:
        run(None, resume=Path(run_dir), reuse=reuse, use_wandb=False, console=_quiet(),
            report=False)
    except BaseException:
        import traceback
        os.write(2, traceback.format_exc().encode())
        os._exit(4)
    os._exit(0)


_CTX: Any = None


def _context() -> Any:
    """Children fork from a fork server that imported torch and the demo and ran nothing (a
    fork of this process would copy thread pools whose threads the child lacks)."""
    global _CTX
    if _CTX is None:
        import multiprocessing
        _CTX = multiprocessing.get_context("forkserver")
        _CTX.set_forkserver_preload(_PRELOAD)
    return _CTX


def _child(target: Callable[..., None], *args: Any) -> int:
    proc = _context().Process(target=target, args=args)
    proc.start()
    proc.join()
    return proc.exitcode


@dataclass
class Outcome:
    """One position: the lake's figures (resume_figures' row and redispatch_lengths' rows for
    the train partition), the failed audits, and what the resumed run said it handed back."""

    position: str
    figures: dict[str, Any]
    lengths: dict[str, dict[str, Any]]
    failed_audits: list[str]
    handed_back: dict[str, Any] = field(default_factory=dict)


def lake_figures(lake: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """resume_figures' and redispatch_lengths' rows of partition train."""
    from pipeline.analysis import connect
    from sql import loader
    con = connect(lake)
    fig = [r for r in loader.run(con, loader.load("resume_figures")).to_pylist()
           if r["partition"] == "train"]
    lengths = {r["sessions"]: r for r in
               loader.run(con, loader.load("redispatch_lengths")).to_pylist()
               if r["partition"] == "train"}
    return (fig[0] if fig else {}), lengths


def run_position(position: str, cfg: Any, at: int, workdir: Path, reuse: bool = True,
                 audits: bool = True) -> Outcome:
    """Kill the demo at ``position`` after step ``at``, resume it, read the lake (and run every
    audit over it, unless ``audits=False``)."""
    from jobs.audit import run_audits
    if position not in POSITIONS:
        raise typer.BadParameter(f"unknown position {position!r}; known: {', '.join(POSITIONS)}")
    run_dir = workdir / position
    shutil.rmtree(run_dir, ignore_errors=True)
    code = _child(_killed, str(run_dir), asdict(cfg), position, at)
    if code != -signal.SIGKILL:
        raise HarnessError(f"{position}: the demo was not killed there (exit {code}; 3: the run "
                           f"ended first, give more --steps than --at {at})")
    code = _child(_resumed, str(run_dir), reuse)
    if code != 0:
        raise HarnessError(f"{position}: the resumed run failed (exit {code}); its run "
                           f"directory is {run_dir}")
    lake = run_dir / "lake"
    figures, lengths = lake_figures(lake)
    failed = [a.name for a in run_audits(lake) if a.status == "FAIL"] if audits else []
    back = json.loads((run_dir / "resumed-1.json").read_text())
    return Outcome(position, figures, lengths, failed, back)


def run_harness(positions: list[str], cfg: Any, at: int, workdir: Path, reuse: bool = True,
                progress: Callable[[int, Outcome], None] | None = None,
                audits: bool = True) -> list[Outcome]:
    """`run_position` at each position in turn; ``progress(done, outcome)`` after each."""
    out = []
    for i, position in enumerate(positions):
        out.append(run_position(position, cfg, at, workdir, reuse, audits))
        if progress is not None:
            progress(i + 1, out[-1])
    return out


# --- the table (80 columns) ----------------------------------------------------------------------
def _share(kept: int, done: int) -> str:
    return f"{kept / done:.0%}" if done else "n/a"


def _secs(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def table(outcomes: list[Outcome]) -> list[str]:
    """The harness's report: one row per position and a total, then the lengths."""
    head = (f"{'killed at':<11}{'groups':>7}{'reused':>15}{'lost':>6}{'skipped':>8}"
            f"{'twice':>6}{'saved tok':>10}{'saved s':>9}{'audits':>8}")
    lines = ["Restart cost, from the lake (reused = kept / completed sessions in flight)",
             head, "-" * len(head)]
    tot = dict.fromkeys(("interrupted_groups", "sessions_kept", "sessions_at_restart",
                         "trajectories_lost", "prompts_skipped", "trajectories_trained_twice",
                         "tokens_saved"), 0)
    secs, failed = 0.0, 0
    for o in outcomes:
        f = o.figures
        for k in tot:
            tot[k] += int(f.get(k) or 0)
        secs += f.get("seconds_saved") or 0.0
        failed += len(o.failed_audits)
        lines.append(_row(o.position, f, len(o.failed_audits)))
    lines.append("-" * len(head))
    lines.append(_row("total", {**tot, "seconds_saved": secs}, failed))
    lines += ["", "Response length (tokens) of re-dispatched sessions vs all sessions",
              f"{'killed at':<11}{'sessions':<15}{'n':>6}{'mean':>7}{'p10':>5}{'p50':>5}"
              f"{'p90':>5}{'max':>5}"]
    for o in outcomes:
        for label in ("re-dispatched", "all"):
            r = o.lengths.get(label)
            if r is None:
                lines.append(f"{o.position:<11}{label:<15}{0:>6}")
                continue
            lines.append(f"{o.position:<11}{label:<15}{r['n']:>6}{r['len_mean']:>7.2f}"
                         f"{r['len_p10']:>5}{r['len_p50']:>5}{r['len_p90']:>5}{r['len_max']:>5}")
    return lines


def _row(name: str, f: dict[str, Any], failed: int) -> str:
    reused = (f"{f.get('sessions_kept', 0)}/{f.get('sessions_at_restart', 0)} "
              f"{_share(f.get('sessions_kept', 0), f.get('sessions_at_restart', 0)):>4}")
    return (f"{name:<11}{f.get('interrupted_groups', 0):>7}{reused:>15}"
            f"{f.get('trajectories_lost', 0):>6}{f.get('prompts_skipped', 0):>8}"
            f"{f.get('trajectories_trained_twice', 0):>6}{f.get('tokens_saved', 0):>10}"
            f"{_secs(f.get('seconds_saved')):>9}{'pass' if not failed else f'{failed} FAIL':>8}")


def main(
    positions: Annotated[str, typer.Option(help=f"comma-separated kill positions, of "
                                                f"{', '.join(POSITIONS)}")
                         ] = ",".join(DEFAULT_POSITIONS),
    steps: Annotated[int, typer.Option(help="demo steps per run")] = 8,
    at: Annotated[int, typer.Option(help="kill once this step is done")] = 3,
    reuse: Annotated[bool, typer.Option("--reuse/--no-reuse", help="resume with sibling reuse "
                                        "(--no-reuse: reissue whole groups, to compare)")] = True,
    seed: Annotated[int, typer.Option(help="seed of the demo runs")] = 0,
    workdir: Annotated[Path | None, typer.Option(help="where the run directories go (default: "
                                                      "a temporary directory, removed)")] = None,
) -> None:
    """Kill the demo (SIGKILL) at positions of its run, resume it, and report from the lake what
    each restart lost, skipped, trained twice and saved; with reuse, exit 1 if anything was lost,
    skipped or trained twice, or an audit failed.

    Examples:
        replaylake dev resume-harness
        replaylake dev resume-harness --positions generation,put --steps 10 --at 4
    """
    chosen = [p.strip() for p in positions.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in POSITIONS]
    if unknown or not chosen:
        raise typer.BadParameter(f"--positions {positions!r}: give some of "
                                 f"{', '.join(POSITIONS)}")
    if not 1 <= at < steps:
        raise typer.BadParameter(f"--at {at}: give a step in 1..{steps - 1} (--steps {steps})")
    cfg = small_demo(steps, seed)
    own = workdir is None
    root = Path(tempfile.mkdtemp(prefix="resume-harness-")) if own else Path(workdir)

    def progress(i: int, o: Outcome) -> None:
        f = o.figures
        print(f"[{i}/{len(chosen)}] {o.position}: killed after step {at}, resumed with "
              f"{o.handed_back.get('groups', 0)} group(s) handed back, "
              f"{f.get('sessions_kept', 0)} session(s) kept", file=sys.stderr, flush=True)

    try:
        outcomes = run_harness(chosen, cfg, at, root, reuse, progress)
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
    for line in table(outcomes):
        print(line)
    bad = [o.position for o in outcomes if o.failed_audits or any(
        o.figures.get(k) for k in ("trajectories_lost", "prompts_skipped",
                                   "trajectories_trained_twice"))]
    if bad and reuse:
        print(f"restarts that cost something: {', '.join(bad)}", file=sys.stderr)
        raise typer.Exit(1)


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
