"""The main job (`make run`): a real tiny policy learns with asynchronous GRPO through replaylake.

Reads top to bottom: flags -> config, a fresh run directory, the buffer (async preset, `drop`,
DAPO filter, `refill_fn` = the rollout side's dispatch), rollout threads, the trainer loop with a
progress line, W&B (offline) and, at the end, a summary read back from the lake with SQL plus
three `replaylake sql` commands to try. The pieces live beside it in jobs/demo/.
"""
from __future__ import annotations

import inspect
import json
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from jobs.demo import flags
from jobs.demo.config import DemoConfig, make_run_dir, write_config

Opt = typer.Option
# the closing line when no step trained a token (every row masked): no ratio is a figure then
NO_TOKEN_TRAINED = ("Importance ratios: none (no step trained a token: every row of every batch "
                    "was masked)")


def _check_buffer(buffer_kwargs: dict[str, Any]) -> None:
    """The buffer's own checks of the flags, their errors told in the flags' names."""
    from pipeline.config import STRATEGIES, StrategyError, ThresholdError, async_config
    from pipeline.errors import ConfigError
    try:
        async_config(**buffer_kwargs, refill_fn=lambda k: None)
    except StrategyError:
        raise ConfigError(f"--strategy {buffer_kwargs['max_off_policy_strategy']!r}: use one of "
                          f"{', '.join(STRATEGIES)}") from None
    except ThresholdError as exc:
        raise ConfigError(f"--threshold {buffer_kwargs['max_off_policy_threshold']!r}: "
                          f"{exc}") from None


def _intro(cfg: DemoConfig, on_ray: bool = False) -> str:
    """What the run is about to do, in words that follow the flags."""
    import textwrap

    evicted = []
    if cfg.threshold is not None and cfg.strategy in ("drop", "admit"):
        # group span g - global_steps + 1 > threshold
        evicted.append(f"groups dispatched {cfg.threshold} or more steps before the step that "
                       "would train them")
    if cfg.filter_metric:
        evicted.append(f"groups whose answers all scored the same {cfg.filter_metric} (DAPO)")
    evicted.append("failed groups")
    who = "Rollout workers (Ray actors)" if on_ray else "Rollout threads"
    text = (f"{who} answer each prompt {cfg.n} times with the newest weights (picking "
            "up new weights mid-answer) and write the groups into replaylake; the trainer "
            f"samples {cfg.batch_size} groups per step. replaylake evicts "
            + ", ".join(evicted[:-1]) + (" and " if len(evicted) > 1 else "") + evicted[-1]
            + ", and asks for new prompts to replace them.")
    if on_ray:
        text += (" The buffer is a Ray actor that owns the lake; the trainer is this process.")
    if cfg.threshold is not None and cfg.strategy == "wait":
        text += (" With strategy 'wait' the trainer waits for late groups instead of evicting "
                 "stale ones.")
    if cfg.threshold is not None and cfg.strategy == "admit":
        text += (" With strategy 'admit' the rollout side dispatches only as many prompts as "
                 "can be trained before they go stale (buf.dispatch_capacity), so staleness "
                 "evictions should not happen at all.")
    if cfg.threshold is not None and cfg.strategy == "mask":
        text += (f" With strategy 'mask' a group dispatched {cfg.threshold} or more steps "
                 "before the step that would train it is not evicted but trained with its "
                 "loss switched off (batch.to_torch()['loss_mask']), so nothing is generated "
                 "again for staleness.")
    return textwrap.fill(text, width=80)


def refuse_finished(run_dir: Path, steps: int) -> None:
    """A run whose last checkpoint is its last step has nothing left to resume: refused before
    anything is written (a resume would dispatch new groups and rewrite its summary)."""
    from jobs.demo.resume import restored_step
    from pipeline.errors import ConfigError
    done = restored_step(run_dir)
    if done >= steps:
        raise ConfigError(f"--resume {run_dir}: the run already trained all its {steps} steps "
                          "(its checkpoint is after the last one); nothing to resume. Read it "
                          f"with: replaylake sql --lake {run_dir / 'lake'}, or start a new run")


def refuse_on_ray(*, resume: Path | None, probe: Any) -> None:
    """What `--ray` does not offer, refused before anything is started or written."""
    from pipeline.errors import ConfigError
    if resume is not None:
        raise ConfigError("--resume does not work with --ray: a resumed run hands its in-flight "
                          "groups back to rollout threads of this process; run it without "
                          "--ray (the lake is the same)")
    if probe is not None:
        raise ConfigError("probe= does not work with on_ray=True: the resume harness kills a "
                          "process that runs the whole job")


class _Status:
    """The line under the progress bar: the reward of the answers generated over the last 10
    steps, the staleness of the batch just trained, evictions so far per reason (evictions, not
    groups: a group evicted as stale and zero-variance counts under both; a rich renderable)."""

    def __init__(self) -> None:
        self.text = "waiting for the first batch ..."
        self._rewards: deque[float] = deque(maxlen=10)

    def __rich__(self) -> str:
        return self.text

    def update(self, info: Any) -> None:
        from jobs.demo.trainer import STALENESS_KEY
        m, ev = info.metrics, info.evicted
        if info.rollout_reward is not None:
            self._rewards.append(info.rollout_reward)
        reward = f"{sum(self._rewards) / len(self._rewards):.2f}" if self._rewards else "n/a"
        self.text = (f"reward {reward}  staleness {m.get(STALENESS_KEY, 0.0):.2f}  "
                     f"evictions stale {ev['stale']:,}, zero-var {ev['zero_variance']:,}, "
                     f"failed {ev['failure']:,}")


def run(cfg: DemoConfig | None, *, out: Path | None = None, use_wandb: bool = True,
        console: Any = None, resume: Path | None = None, reuse: bool = True,
        probe: Any = None, report: bool = True, on_ray: bool = False) -> Path:
    """Run the demo; returns its run directory. The buffer, the workers and the W&B run are
    closed whatever happens, so a failed or interrupted run still leaves a readable lake.

    ``resume``: a run directory an earlier (crashed or stopped) run wrote; the run goes on from
    its checkpoint with the configuration it was started with (``cfg`` is not used), handing the
    in-flight groups back with sibling reuse (``reuse=False``: whole groups again, see
    jobs/demo/resume.py). ``probe(event, value)`` sees ``("opened", buf)``, ``("token",
    None)``, ``("wave", None)`` and ``("step", g)`` (the resume harness kills the process there);
    ``report=False`` skips the summary read back from the lake.

    ``on_ray``: the buffer and the rollout workers are Ray actors (jobs/demo/on_ray.py); the
    summary then says where each piece ran (summary.json's ``placement``)."""
    import torch
    from rich.console import Console, Group
    from rich.live import Live
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.text import Text

    from jobs.demo.config import read_config
    from jobs.demo.policy import Policy
    from jobs.demo.resume import checkpoint, hand_back, restore
    from jobs.demo.rollout import Rollout, WeightStore
    from jobs.demo.summary import render, render_placement, summarize
    from jobs.demo.trainer import Trainer, ratio_summary, run_steps, tis_summary
    from jobs.demo.whatif import closing_whatif
    from pipeline import ReplayBuffer

    console = console or Console()
    if on_ray:
        refuse_on_ray(resume=resume, probe=probe)
    if resume is not None:
        cfg = read_config(resume)
        refuse_finished(Path(resume), cfg.steps)
    # the buffer's own checks (threshold, strategy, filter metric) before anything is written
    buffer_kwargs = dict(max_off_policy_threshold=cfg.threshold,
                         max_off_policy_strategy=cfg.strategy,
                         filter_groups_metric=cfg.filter_metric, poll_interval=0.05)
    if cfg.strategy == "admit":          # admission counts places per step
        buffer_kwargs["train_batch_size"] = cfg.batch_size
    _check_buffer(buffer_kwargs)
    run_dir = make_run_dir(out) if resume is None else Path(resume)
    lake = run_dir / "lake"
    if resume is None:
        write_config(run_dir, cfg, {"lake": str(lake), **({"ray": True} if on_ray else {})})
    console.print("[bold]replaylake demo[/]: a tiny GRU learns to reverse 1-3 digits with async "
                  "GRPO.")
    console.print(_intro(cfg, on_ray), markup=False, highlight=False)
    console.print(f"[bold]configuration[/] (also in {run_dir / 'config.json'})", highlight=False)
    for line in cfg.lines():
        console.print(line, markup=False, highlight=False)

    torch.set_num_threads(cfg.torch_threads)
    torch.manual_seed(cfg.seed)
    policy = Policy()
    trainer = Trainer(policy, cfg.lr, cfg.clip, cfg.tis_cap)
    done = restore(run_dir, trainer) if resume is not None else 0
    weights = WeightStore(policy)
    weights.publish(policy, done)
    holder: dict[str, Rollout] = {}
    side = None
    if on_ray:
        from jobs.demo.on_ray import RaySide
        side = RaySide.start(lake, buffer_kwargs)
        buf = side.buf
    else:
        buf = ReplayBuffer.async_(lake=lake, refill_fn=lambda k: holder["rollout"].dispatch(k),
                                  **buffer_kwargs)
    # a resumed run's new prompts get uids of their own (r1p..., r2p...: one per restart)
    restarts = len(list(run_dir.glob("resumed-*.json"))) + (resume is not None)
    rollout = holder["rollout"] = Rollout(
        buf, weights, n=cfg.n, workers=cfg.workers, failure_rate=cfg.failure_rate,
        seed=cfg.seed + 1000 * restarts, token_delay=cfg.token_delay_ms / 1000.0,
        capacity=(lambda g: buf.dispatch_capacity(g, "train")) if cfg.strategy == "admit"
        else None, waves=cfg.waves, uid_prefix=f"r{restarts}p" if restarts else "p",
        probe=None if probe is None else (lambda event: probe(event, None)))
    if probe is not None:
        probe("opened", buf)
    back = None
    if resume is not None:
        try:
            back = hand_back(buf, rollout, n=cfg.n, done=done, reuse=reuse)
        except BaseException:
            buf.close()                   # a later --resume starts from what the lake holds
            raise
        (run_dir / f"resumed-{restarts}.json").write_text(json.dumps(
            {"after_step": done, "reuse": reuse, **back.figures()}) + "\n")
        console.print(f"resumed after step {done}: {back.groups} in-flight group(s) handed back, "
                      f"{back.kept} finished session(s) kept, {back.sessions} to generate"
                      + (f"; batch {back.held.batch_id} of step {back.held.step} trained first"
                         if back.held is not None else ""), highlight=False)
    tracker = None
    if use_wandb:
        from pipeline.adapters.wandb import WandbTracker
        tracker = WandbTracker(dir=run_dir, project="replaylake-demo", name=run_dir.name,
                               config=asdict(cfg))
    status = _Status()
    progress = Progress(TextColumn("[bold]training"), BarColumn(bar_width=24),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=console)
    task = progress.add_task("steps", total=cfg.steps)

    def on_step(info: Any) -> None:
        if tracker is not None:
            tracker.log_step(info.step, info.metrics, info.reward_counts)
        status.update(info)
        progress.update(task, completed=info.step)
        if probe is not None:
            probe("step", info.step)

    started = time.perf_counter()
    ok = False
    history: list = []
    placement = None
    try:
        if side is not None:
            rollout.start(side.work(rollout, cfg.torch_threads))
            side.serve_refills(rollout)
        else:
            rollout.start()
        progress.update(task, completed=done)
        first_top_up = None
        if back is not None:       # the pipeline as it was: `ahead` batches in flight or ready
            first_top_up = max(0, cfg.ahead * cfg.batch_size - back.groups
                               - buf.get_sampleable_count(done + 1, "train"))
        with Live(Group(progress, status), console=console, refresh_per_second=8):
            history = run_steps(steps=cfg.steps, batch_size=cfg.batch_size, ahead=cfg.ahead, buf=buf,
                      rollout=rollout, weights=weights, trainer=trainer,
                      timeout=cfg.sample_timeout_s, on_step=on_step, start=done + 1,
                      held=back.held if back is not None else None, first_top_up=first_top_up,
                      checkpoint=lambda g: checkpoint(run_dir, trainer, g))
        ok = True
    finally:
        if side is not None:
            side.stop_refills()
        rollout.stop()
        if side is not None:
            try:
                placement = side.locate() if ok else None
            finally:
                side.close()
        else:
            buf.close()
        wandb_dir = tracker.run_dir if tracker is not None else None
        if tracker is not None:
            tracker.finish(exit_code=0 if ok else 1)
    wall = time.perf_counter() - started
    if not report:                    # the resume harness reads the lake itself
        return run_dir
    summary = summarize(lake)
    console.print("")
    for line in render(summary, run_dir=run_dir, lake=lake, wandb_dir=wandb_dir, wall_s=wall):
        console.print(line, highlight=False)
    extra: dict[str, Any] = {}
    console.print("")                 # the "Try" commands above end at a blank line
    if placement is not None:
        extra["placement"] = placement
        for line in render_placement(placement):
            console.print(line, highlight=False)
        console.print("")
    if cfg.tis_cap is not None:       # the trainer's own figures: the lake holds no loss
        tis = extra["tis"] = tis_summary(history, cfg.tis_cap)
        console.print(f"Truncated IS (cap {tis['cap']:g}): mean weight "
                      f"{tis['tis_weight_mean']:.3f}, {tis['tis_truncated_fraction']:.1%} of "
                      f"tokens truncated, token staleness {tis['token_staleness_mean']:.2f}"
                      if tis["tis_weight_mean"] is not None else NO_TOKEN_TRAINED,
                      highlight=False)
    else:                             # what the PPO ratios against the rollouts' log-probs did
        r = extra["ratios"] = ratio_summary(history)
        console.print(f"Importance ratios: mean {r['ratio_mean']:.3f}, std {r['ratio_std']:.3f} "
                      f"(max step {r['ratio_std_max']:.3f}), {r['clip_fraction']:.1%} clipped"
                      if r["ratio_mean"] is not None else NO_TOKEN_TRAINED, highlight=False)
    (run_dir / "summary.json").write_text(
        json.dumps({**asdict(summary), "wall_s": round(wall, 2), **extra}, indent=1) + "\n")
    console.print("")
    with console.status("what if: replaying this run's lake under other settings ..."):
        closing = closing_whatif(cfg, lake, run_dir, resumed=restarts > 0)
    for line in closing:
        console.print(Text.from_markup(line) if line.startswith("[bold]") else Text(line),
                      highlight=False)
    return run_dir


def main(
    *,
    out: Annotated[Path | None, Opt(help="run directory (must be new or empty); default "
                                          "runs/demo/<timestamp>")] = None,
    wandb: Annotated[bool, Opt("--wandb/--no-wandb", help="track in W&B (offline unless "
                                                          "WANDB_MODE says otherwise)")] = True,
    resume: Annotated[Path | None, Opt(help="go on with the run in this directory after a crash "
                                            "or Ctrl-C, from its last checkpoint, with its own "
                                            "configuration (of the other flags only --wandb/"
                                            "--no-wandb is used)")] = None,
    reuse: Annotated[bool, Opt("--reuse/--no-reuse", help="with --resume: keep the finished "
                                                          "sessions of in-flight groups and "
                                                          "generate only the missing ones "
                                                          "(--no-reuse: whole groups again)")
                     ] = True,
    ray: Annotated[bool, Opt("--ray", help="run the buffer and the rollout workers as Ray "
                                           "actors (joins RAY_ADDRESS's cluster, else starts a "
                                           "local one); the trainer stays here. Not with "
                                           "--resume")] = False,
    **settings: Any,
) -> None:
    """Train a tiny GRU policy with asynchronous GRPO through replaylake (about a minute on 2
    CPU cores), tracked in W&B offline; then see what happened with SQL over the lake.

    Examples:
        replaylake demo
        replaylake demo --steps 150 --threshold 3 --failure-rate 0.02
        replaylake demo --resume runs/demo/latest
        replaylake demo --ray --steps 100
    """
    if ray:                           # before the configuration is read from --resume's run
        refuse_on_ray(resume=resume, probe=None)
    run(flags.config(settings), out=out, use_wandb=wandb, resume=resume, reuse=reuse,
        on_ray=ray)


# what typer reads: DemoConfig's flags (jobs/demo/flags.py), then --out and --wandb; `eval_str`
# turns this module's postponed annotations back into the Annotated options typer looks for
_own = inspect.signature(main, eval_str=True)
main.__signature__ = _own.replace(parameters=[  # type: ignore[attr-defined]
    *flags.parameters(), *(p for p in _own.parameters.values() if p.kind is not p.VAR_KEYWORD)])


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
