"""Weights & Biases tracking for anyone driving the buffer: step metrics and the DAPO table.

    from pipeline.adapters.wandb.tracker import WandbTracker

    with WandbTracker(dir="runs/x", project="my-run", config={"threshold": 2}) as tracker:
        for g in range(1, steps + 1):
            batch = buf.sample(g, "train", 32)
            ...                                    # train on it
            tracker.log_batch(batch, extra={"train/loss": loss})
            buf.release(batch)

Why a tracker of our own and not `wandb.log` calls in the trainer: the filtered-reward-counts
history has a documented shape that dashboards and verl users already read (one table under
``training/filter_groups/filtered_reward_counts``, columns ``step`` and ``reward_counts``, a row
only for steps that filtered something, logged at ``step=global_steps``, cells such as
``0:3, 1:2`` with the values ascending), and getting it both right and cheap takes care:

* The table is a ``wandb.Table(log_mode="INCREMENTAL")``: each log writes only the rows added
  since the previous log (one small ``.table.json`` per increment), where an ordinary table is
  rewritten whole at every step (quadratic over a run).
* An incremental table still carries the list of all its earlier increments in every log, so its
  cost per step grows slowly with the number of steps. W&B's UI shows only the latest 100
  increments of a table anyway, so after ``increments_per_table`` (default 100) increments the
  tracker starts a fresh table under the same key: the cost of a step stays bounded, and every
  row stays in the run's files.

Offline by default (``WANDB_MODE`` is respected when the user has set it; an explicit ``mode=``
wins over both). Runs land under ``dir`` (``<dir>/wandb/offline-run-...``). ``finish()`` closes
the run exactly once, however often it is called, and for an offline run returns only once the
run's files are complete (wandb's own ``finish`` may return earlier); the tracker is a context
manager too. wandb is imported when a tracker is made, never when this module is imported;
``pipeline.adapters.wandb.offline`` reads an offline run back.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.numbers_text import value_text

TABLE_KEY = "training/filter_groups/filtered_reward_counts"
TABLE_COLUMNS = ["step", "reward_counts"]
DEFAULT_INCREMENTS_PER_TABLE = 100


def format_reward_counts(counts: Mapping[float, int]) -> str:
    """`{1.0: 2, 0.0: 3}` -> ``"0:3, 1:2"``: values ascending, each ``value:count`` with the
    value in the fewest digits that read back as it (`value_text`)."""
    return ", ".join(f"{value_text(v)}:{int(c)}" for v, c in sorted(counts.items()))


def _number(name: str, value: Any, kind: type = float) -> Any:
    """``value`` as the ``kind`` (float or int) W&B stores; a value that is not a number, or
    for an int one with a fraction, is refused, naming it (never rounded to another)."""
    try:
        out = kind(value)
        if kind is int and not isinstance(value, (int, np.integer)) and float(value) != out:
            raise ValueError            # 1.9 is no step and 2.7 no count of groups
        return out
    except (TypeError, ValueError, OverflowError, RuntimeError):
        what = "a whole number" if kind is int else "a number"
        raise ConfigError(f"{name}={value!r} is not {what}; log a {kind.__name__} (leave the key "
                          "out at a step that has no value for it)") from None


def _reward_counts(counts: Mapping[float, int]) -> dict[float, int]:
    """``filtered_reward_counts`` as ``{reward: count}``, zero counts left out; a reward or count
    that is not a number is refused, naming it."""
    out: dict[float, int] = {}
    for value, count in counts.items():
        reward = _number("filtered_reward_counts key", value)
        n = _number(f"filtered_reward_counts[{value!r}]", count, int)
        if n < 0:
            raise ConfigError(f"filtered_reward_counts[{value!r}]={count!r}: a count of groups "
                              "is >= 0")
        if n:
            out[reward] = n
    return out


def resolve_mode(mode: str | None = None) -> str:
    """The W&B mode to use: the explicit argument, else ``WANDB_MODE``, else ``offline``."""
    return mode or os.environ.get("WANDB_MODE") or "offline"


class WandbTracker:
    """One W&B run: scalar metrics per step plus the incremental filtered-reward-counts table."""

    def __init__(self, *, dir: str | os.PathLike, project: str = "replaylake",
                 name: str | None = None, config: Mapping[str, Any] | None = None,
                 mode: str | None = None, tags: list[str] | None = None,
                 increments_per_table: int = DEFAULT_INCREMENTS_PER_TABLE):
        if not isinstance(increments_per_table, int) or increments_per_table < 1:
            raise ConfigError(f"increments_per_table={increments_per_table!r}: give a positive int "
                              "(W&B's UI shows the latest 100 increments of a table)")
        import wandb

        self._wandb = wandb
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.mode = resolve_mode(mode)
        self.increments_per_table = increments_per_table
        # console="off": the trainer's own progress bar owns the terminal; no system-stats thread,
        # no git or requirements capture -- a tracker should cost the training loop nothing.
        settings = wandb.Settings(console="off", x_disable_stats=True, disable_git=True,
                                  save_code=False, x_save_requirements=False, silent=True)
        self._run = wandb.init(project=project, name=name, dir=str(self.dir), mode=self.mode,
                               config=dict(config or {}), tags=tags, reinit="create_new",
                               settings=settings)
        self._table: Any = None
        self._increments = 0
        self._last_step: int | None = None

    # --- logging -------------------------------------------------------------------------------
    @property
    def run(self) -> Any:
        """The underlying `wandb.Run` (None once finished)."""
        return self._run

    @property
    def run_dir(self) -> Path | None:
        """The run's own directory (``<dir>/wandb/offline-run-...``); None when W&B is disabled."""
        if self._run is None or self.mode == "disabled":
            return None
        return Path(self._run.settings.sync_dir)

    def log_step(self, step: int, metrics: Mapping[str, float],
                 filtered_reward_counts: Mapping[float, int] | None = None) -> None:
        """Log one training step: scalar metrics, and a table row when something was filtered.

        Steps must increase (W&B drops rows logged at an earlier step); a step may be logged only
        once, so a trainer that samples several times per step merges first (StepAggregator).
        Every value is checked before anything is logged: a value that is not a number raises
        `ConfigError` naming its key, and the step counts as not logged (a corrected call for
        the same step is taken)."""
        if self._run is None:
            raise ConfigError("this WandbTracker is finished; make a new one to log again")
        step = _number("step", step, int)
        row: dict[str, Any] = {k: _number(f"metrics[{k!r}]", v) for k, v in metrics.items()}
        counts = _reward_counts(filtered_reward_counts or {})
        if self._last_step is not None and step <= self._last_step:
            raise ConfigError(f"step={step}: steps must increase (last logged {self._last_step})")
        if counts:
            row[TABLE_KEY] = self._table_with_row(step, format_reward_counts(counts))
        self._run.log(row, step=step)
        self._last_step = step

    def log_batch(self, batch: Any, extra: Mapping[str, float] | None = None) -> None:
        """Log a `Batch` from `sample` at its step: its metrics, its filtered reward counts, and
        ``extra`` (the trainer's own numbers: loss, reward, ...)."""
        self.log_step(batch.step, {**batch.metrics, **(extra or {})},
                      batch.filtered_reward_counts)

    def _table_with_row(self, step: int, cell: str) -> Any:
        if self._table is None or self._increments >= self.increments_per_table:
            self._table = self._wandb.Table(columns=TABLE_COLUMNS, log_mode="INCREMENTAL")
            self._increments = 0
        self._table.add_data(step, cell)
        self._increments += 1
        return self._table

    # --- closing -------------------------------------------------------------------------------
    def finish(self, exit_code: int = 0, timeout: float = 30.0) -> None:
        """Close the run; for an offline run, return once its files are complete on disk (up
        to `timeout` seconds: `wandb.Run.finish()` may return while wandb's core process is
        still writing). Safe to call any number of times."""
        run, self._run = self._run, None
        if run is None:
            return
        run_dir = Path(run.settings.sync_dir) if self.mode == "offline" else None
        run.finish(exit_code=exit_code)
        if run_dir is not None:
            from pipeline.adapters.wandb.offline import wait_complete
            if not wait_complete(run_dir, timeout):
                import warnings
                warnings.warn(f"W&B offline run {run_dir} still incomplete after {timeout} s",
                              RuntimeWarning, stacklevel=2)

    def __enter__(self) -> WandbTracker:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.finish(exit_code=1 if exc_type is not None else 0)
