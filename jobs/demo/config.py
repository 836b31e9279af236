"""The demo's configuration and its run directory (which never overwrites anything).

Why a run directory of its own: a demo that deletes whatever sits at a path it was given can
destroy a user's notes or a real lake. Every run gets a fresh directory (by default
``runs/demo/<timestamp>/`` holding ``lake/``, ``wandb/``, ``config.json`` and a marker file);
a directory given with ``--out`` must be missing or empty, and nothing is ever removed.
``runs/demo/latest`` points at the newest default run, so ``runs/demo/latest/lake`` always names
the lake to query.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError, ReplayLakeError

DEFAULT_ROOT = Path("runs/demo")
MARKER = ".replaylake-demo"


class RunDirError(ReplayLakeError):
    """The demo refuses a run directory: it exists, is not empty, and may hold someone's data."""


def _flag(default: Any, help: str) -> Any:
    """A field that is also a `replaylake demo` flag (`--batch-size` for ``batch_size``): its
    default and ``help`` are the flag's, written here once (jobs/demo/flags.py reads them)."""
    return field(default=default, metadata={"flag": help})


@dataclass(frozen=True)
class DemoConfig:
    """Everything that shapes a demo run (recorded in ``config.json`` and in W&B)."""

    steps: int = _flag(300, "training steps")
    batch_size: int = _flag(32, "prompts (groups) per step")
    n: int = 8                         # responses per prompt
    threshold: int | None = _flag(2, "max_off_policy_threshold: an int, or 'none'")
    strategy: str = _flag("drop", "max_off_policy_strategy: drop | wait | admit | mask")
    filter_metric: str | None = _flag("reward", "DAPO filter metric: reward, or 'none'")
    failure_rate: float = _flag(0.005, "probability that a session fails")
    ahead: int = _flag(3, "batches of prompts kept in the pipeline")
    workers: int = 2                   # rollout threads
    waves: int = 2                     # a group's sessions are generated in this many waves, each
    #                                    put as soon as it is done (a crash keeps the waves put)
    token_delay_ms: float = _flag(4.0, "decode time per token, ms")
    lr: float = 1e-3                   # Adam learning rate (>= 3e-3 collapses)
    clip: float = 0.2                  # PPO clip range
    tis_cap: float | None = _flag(None, "truncated importance weights: cap C (per-token weight "
                                        "min(pi_old / pi_rollout, C)), or 'none'")
    seed: int = _flag(0, "seed of the policy, prompts and sampling")
    whatif_calls: int = _flag(40, "closing what-if: replay the first N steps under a tighter "
                                  "and a looser bound and admit (0: none)")
    torch_threads: int = 1             # intra-op threads: tiny ops run best on one
    sample_timeout_s: float = 120.0    # a stuck run fails loudly instead of hanging

    def __post_init__(self) -> None:
        positive = ("steps", "batch_size", "n", "ahead", "workers", "waves", "torch_threads")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r}: give a positive integer")
        if not isinstance(self.whatif_calls, int) or self.whatif_calls < 0:
            raise ConfigError(f"whatif_calls={self.whatif_calls!r}: give a number of steps >= 0 "
                              "(0: no closing what-if)")
        if self.n < 2:
            raise ConfigError(f"n={self.n}: GRPO compares responses within a group; give n >= 2")
        if self.waves > self.n:
            raise ConfigError(f"waves={self.waves}: a group of n={self.n} sessions is generated "
                              "in at most n waves; give waves <= n")
        if not (0.0 <= self.failure_rate < 1.0):
            raise ConfigError(f"failure_rate={self.failure_rate!r}: give a probability in [0, 1)")
        for name in ("token_delay_ms", "lr", "clip", "sample_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name}={value!r}: give a finite number >= 0")
        if self.tis_cap is not None and not (isinstance(self.tis_cap, (int, float))
                                             and math.isfinite(self.tis_cap)
                                             and self.tis_cap > 0):
            raise ConfigError(f"tis_cap={self.tis_cap!r}: give a finite number > 0 (e.g. 2), "
                              "or 'none' to train without importance weights")
        if self.lr <= 0 or self.clip <= 0:
            raise ConfigError(f"lr={self.lr!r}, clip={self.clip!r}: both must be > 0")

    def lines(self) -> list[str]:
        """``key value`` pairs, three to a line, for an 80-column terminal."""
        cells = [f"{k:<17}{'off' if v is None else v!s:<9}" for k, v in asdict(self).items()]
        return ["  " + "".join(cells[i:i + 3]).rstrip() for i in range(0, len(cells), 3)]


def make_run_dir(out: Path | None, root: Path = DEFAULT_ROOT) -> Path:
    """Create the run's directory: `out` when given (missing or empty only), else a fresh
    ``<root>/<timestamp>`` (with a suffix if that name is taken). Marks it as a demo run."""
    if out is not None:
        out = Path(out)
        if out.exists():
            if not out.is_dir():
                raise RunDirError(f"{out} exists and is not a directory; the demo leaves it alone")
            if any(out.iterdir()):
                what = ("an earlier demo run" if (out / MARKER).exists()
                        else "files the demo did not write")
                raise RunDirError(
                    f"{out} is not empty (it holds {what}); the demo never writes into or deletes "
                    "an existing directory. Pass a new --out path, or omit --out for a fresh "
                    f"{root}/<timestamp> directory.")
        run_dir = out
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = root / stamp
        k = 2
        while run_dir.exists():
            run_dir, k = root / f"{stamp}-{k}", k + 1
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / MARKER).write_text("written by `replaylake demo`\n")
    if out is None:
        _point_latest(root, run_dir)
    return run_dir


def _point_latest(root: Path, run_dir: Path) -> None:
    """``<root>/latest`` -> the newest run (only ever replaces a symlink, never a real file)."""
    latest = root / "latest"
    if latest.exists() and not latest.is_symlink():
        return
    tmp = root / f".latest-{os.getpid()}"
    try:
        if tmp.is_symlink():
            tmp.unlink()
        tmp.symlink_to(run_dir.name)
        os.replace(tmp, latest)
    except OSError:                   # no symlinks here (some filesystems): nothing to point
        if tmp.is_symlink():
            tmp.unlink()


def read_config(run_dir: Path) -> DemoConfig:
    """The configuration a demo run directory was written with (to resume it)."""
    run_dir = Path(run_dir)
    path = run_dir / "config.json"
    if not (run_dir / MARKER).exists() or not path.exists():
        raise RunDirError(f"{run_dir} is not a demo run directory (no {MARKER} and config.json "
                          "in it); pass the directory an earlier `replaylake demo` wrote")
    known = {f.name for f in fields(DemoConfig)}
    return DemoConfig(**{k: v for k, v in json.loads(path.read_text()).items() if k in known})


def write_config(run_dir: Path, cfg: DemoConfig, extra: dict | None = None) -> Path:
    path = run_dir / "config.json"
    path.write_text(json.dumps({**asdict(cfg), **(extra or {})}, indent=1) + "\n")
    return path
