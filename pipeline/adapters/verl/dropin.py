"""verl 0.9.1 drop-in: `ReplayBuffer`, `ReplayBufferAsync` and the custom-sampler class
`ReplaylakeSampler`, reading verl's TransferQueue and deciding with replaylake's policies.

Each instance owns a core `pipeline.ReplayBuffer` (the `sync` or `async` preset, over an optional
lake). Before every poll it mirrors the partition's TransferQueue keys into the core
(mirror.py); the core decides; a listener owes TransferQueue exactly the effects verl's buffer
has: an evicted or discarded group loses its prompt key and all its trajectory keys, a selected
group only its prompt key, and `kv_clear` never gets an empty list. The adapter's thread makes
those clears right after the call, not inside it (background.py), and any listing waits for them.
`sample` returns TransferQueue's own `KVBatchMeta` (the selected trajectory keys in TransferQueue
order, with their tags as listed) and verl's metric dict. Where verl is defective the
core's behaviour is kept; the README's verl section lists every difference.

Importing this module needs neither verl nor TransferQueue; both are imported at first use.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.adapters.verl import options as vo
from pipeline.adapters.verl.background import BackgroundMirror, check_max_lag, usable
from pipeline.adapters.verl.keys import batch_meta
from pipeline.adapters.verl.mirror import PartitionMirror
from pipeline.arguments import flag_arg
from pipeline.buffer import ReplayBuffer
from pipeline.decide import typed
from pipeline.errors import EmptyBatchError
from pipeline.ingest import check_partition

DAPO_FILTERED_REWARD_COUNTS_KEY = "_dapo_filtered_reward_counts"
FILTER_GROUPS_REWARD_METRIC = "reward"
VerlThresholdError = vo.VerlThresholdError
VerlStrategyError = vo.VerlStrategyError

_VERL_EMPTY = "Sync replay buffer selected terminal groups with no materializable trajectories."

__all__ = [
    "DAPO_FILTERED_REWARD_COUNTS_KEY", "FILTER_GROUPS_REWARD_METRIC", "VerlBuffer",
    "ReplayBufferAsync", "ReplaylakeSampler", "VerlStrategyError", "VerlThresholdError",
]


def verl_metrics(scalars: dict[str, float], reward_counts: dict[float, int]) -> dict[str, Any]:
    """The core's eviction metrics with verl's value types, as each key declares them (counts as
    int, the three staleness values as numpy float64), and the filtered reward counts as a plain
    {float: int} dict under `_dapo_filtered_reward_counts` (verl's step aggregator merges it only
    if it is a dict)."""
    out: dict[str, Any] = {}
    for k, v in scalars.items():
        t = typed(k, v)
        out[k] = np.float64(t) if isinstance(t, float) else t
    if reward_counts:
        out[DAPO_FILTERED_REWARD_COUNTS_KEY] = {float(v): int(c) for v, c in reward_counts.items()}
    return out


class VerlBuffer:
    """verl's `ReplayBuffer`, exported under that name by `pipeline.adapters.verl` (sync:
    on-policy; staleness settings validated, then ignored).

    Keywords are verl 0.9.1's, in its order, plus replaylake's: ``lake_dir`` (None = memory only;
    else every trajectory and decision also lands in that lake), ``max_num_gen_batches`` (bounds
    DAPO refills; 0 = unbounded), ``fsync`` (the lake's writes also survive power loss),
    ``rules`` (opt-in rules by name, ``{"overlong": {"max_response_length": 12}}``; checked
    as the core's presets check it), ``max_response_length`` (shorthand for the overlong entry;
    None = off) and ``mirror_fields``: which
    TransferQueue fields are read
    per new trajectory — `decisions` (only what a rule needs: `rm_scores` for metric `reward`,
    `extra_fields` for a named metric or when the tags carry no versions), `rewards` (also every
    reward and `reward_extra_info`, for the lake; ~80 us per trajectory, once), `full` (also the
    token payload), `auto` (= `rewards` with a lake, `decisions` without). Every mode knows each
    response's length (verl tags it, `response_len`), so rules comparing lengths run in any.
    ``mirror_max_lag`` (seconds; None = off, the default): a background thread mirrors TransferQueue every
    ``mirror_max_lag / 2`` seconds, and a call's first poll uses that view instead of listing
    when it is at most ``mirror_max_lag`` seconds old (background.py).
    ``reuse_siblings`` (default False: verl clears partial trajectories when it resumes): when
    verl re-issues in-flight prompts after a restart, keep their completed sessions (the core's
    `resume`) instead of dropping them; for a rollout side that leaves those sessions' keys in
    TransferQueue and generates only the missing ones (`missing_sessions(partition_id)` lists
    them per uid). ``dataset_field`` (default None: no group has a dataset, as in verl): the
    prompt-key field naming each prompt's dataset, e.g. ``"data_source"``; read once per new
    prompt when it is registered, it lets ``max_off_policy_threshold`` map datasets to bounds
    (``{"math": 4, "code": 8, "*": 6}``) and the starvation signal count by dataset. verl
    stores prompt fields only outside ``trainer_mode="sync"``; a prompt whose field cannot be read
    gets no dataset (the ``"*"`` bound) and is named in a warning. Every option except
    ``refill_fn`` may also come in ``sampler_kwargs`` (verl's custom-sampler hook passes nothing
    else)."""

    _preset = "sync"

    def __init__(self, trainer_mode: str, trainer_config: Any, max_off_policy_threshold: int | None,
                 max_off_policy_strategy: str, sampler_kwargs: Any, poll_interval: float = 2.0,
                 refill_fn: Callable[[int], Any] | None = None,
                 filter_groups_metric: str | None = None, train_batch_size: int | None = None,
                 gen_batch_size: int | None = None, max_inflight_gen_batches: int = 1,
                 sync_refill_failed_groups: bool = False, *,
                 lake_dir: str | os.PathLike | None = None, max_num_gen_batches: int = 0,
                 mirror_fields: str = "auto", fsync: bool = False,
                 max_response_length: int | None = None, rules: Any = None,
                 mirror_max_lag: float | None = None, reuse_siblings: bool = False,
                 dataset_field: str | None = None) -> None:
        opts = vo.merge({
            "poll_interval": poll_interval, "refill_fn": refill_fn,
            "filter_groups_metric": filter_groups_metric, "train_batch_size": train_batch_size,
            "gen_batch_size": gen_batch_size, "max_inflight_gen_batches": max_inflight_gen_batches,
            "sync_refill_failed_groups": sync_refill_failed_groups, "lake_dir": lake_dir,
            "fsync": fsync, "max_response_length": max_response_length, "rules": rules,
            "max_num_gen_batches": max_num_gen_batches, "mirror_fields": mirror_fields,
            "mirror_max_lag": mirror_max_lag, "reuse_siblings": reuse_siblings,
            "dataset_field": dataset_field,
        }, sampler_kwargs)
        opts["mirror_max_lag"] = check_max_lag(opts["mirror_max_lag"])
        opts["dataset_field"] = vo.check_dataset_field(opts["dataset_field"])
        config = vo.core_config(self._preset, opts, max_off_policy_threshold,
                                max_off_policy_strategy)
        self.trainer_mode = trainer_mode
        self.trainer_config = trainer_config
        self.max_off_policy_threshold = max_off_policy_threshold
        self.max_off_policy_strategy = max_off_policy_strategy
        self.sampler_kwargs = sampler_kwargs
        for k in (*vo.VERL_DEFAULTS, *vo.EXTRA_DEFAULTS):
            setattr(self, k, opts[k])
        self.reuse_siblings = flag_arg("reuse_siblings", vo.flag(opts, "reuse_siblings"),
                                       "ReplayBuffer")
        self.core = ReplayBuffer(config, lake=opts["lake_dir"], fsync=vo.flag(opts, "fsync"))
        self.core.add_listener(self._on_decision)
        self.last_batch = None          # the core's Batch of the last sample (Arrow, provenance)
        self._mirrors: dict[str, PartitionMirror] = {}
        self._owed: list = []           # each mirror's `OwedClears` (background.py collects them)
        self._lock = threading.RLock()  # one public call at a time (verl's trainer is serial)
        self._tq: Any = None
        self._background: BackgroundMirror | None = None
        self.background_polls = 0       # polls (and counts) the background mirror's view served

    # --- plumbing --------------------------------------------------------------------------------
    @property
    def tq(self) -> Any:
        """The `transfer_queue` module (imported at first use; the trainer has called init())."""
        if self._tq is None:
            import transfer_queue
            self._tq = transfer_queue
        return self._tq

    def _mirror(self, partition_id: str) -> PartitionMirror:
        check_partition(partition_id)
        m = self._mirrors.get(partition_id)
        if m is None:
            mode = vo.mirror_mode(self.mirror_fields, self.lake_dir)
            m = self._mirrors[partition_id] = PartitionMirror(
                self.core, self.tq, partition_id, mode, self.filter_groups_metric,
                reuse=self.reuse_siblings, dataset_field=self.dataset_field)
            self._owed.append(m.owed)
            if self._background is None:      # makes the clears a call leaves behind
                self._background = BackgroundMirror(self, self._lock, self.mirror_max_lag,
                                                    self._owed)
        return m

    def _poller(self, m: PartitionMirror) -> Callable[[], None]:
        """`before_poll` of one call: the first poll may use the background mirror's view (when
        it is fresh enough); every later poll lists TransferQueue."""
        first = [True]

        def before_poll() -> None:
            if first[0]:
                first[0] = False
                if usable(m, self.mirror_max_lag):
                    self.background_polls += 1
                    return
            m.sync()
        return before_poll

    def mirror_lag(self, partition_id: str) -> float | None:
        """Seconds since the listing behind the partition's mirrored state began, if a call's
        first poll could use that state now (`mirror_max_lag` set and the view fresh enough);
        None when the next call will list TransferQueue itself."""
        with self._lock:
            m = self._mirrors.get(partition_id)
            if m is None or not usable(m, self.mirror_max_lag):
                return None
            return time.monotonic() - m.listed_at

    def missing_sessions(self, partition_id: str) -> dict[str, list[int] | None]:
        """With ``reuse_siblings``: per uid re-issued by verl after a restart, the session ids
        still to generate (its completed ones were kept); empty otherwise."""
        m = self._mirrors.get(partition_id)
        return dict(m.missing) if m is not None else {}

    def partition_mirrors(self) -> list[PartitionMirror]:
        """The partitions mirrored so far, as a snapshot (the background mirror walks it)."""
        with self._lock:
            return list(self._mirrors.values())

    def _on_decision(self, kind: str, partition: str, uids: list[str], batch_id: int | None) -> None:
        """The core's listener (under its lock): verl's effects on TransferQueue, owed to the
        adapter's thread, which makes them right after the call (background.py)."""
        m = self._mirrors.get(partition)
        if m is None:
            return
        if kind in ("evict", "discard"):   # only keys still listed (a vanished group's are gone)
            m.clear_keys([k for k in m.on_remove(uids) if k in m.listing], defer=True)
        elif kind == "select":
            m.on_select(uids, batch_id)
            m.clear_keys(list(uids), defer=True)
        if m.deferred:                     # (a mirror exists only with the thread, `_mirror`)
            self._background.wake()

    # --- verl's API --------------------------------------------------------------------------------
    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict]:
        """Whole groups, oldest dispatch first (ties: arrival of the terminal status),
        after this preset's evictions and refills; returns (KVBatchMeta, verl's metric dict)."""
        with self._lock:
            m = self._mirror(partition_id)
            try:
                batch = self.core.sample(global_steps, partition_id, batch_size,
                                         before_poll=self._poller(m))
            except EmptyBatchError as exc:
                hint = "" if self.sync_refill_failed_groups else (
                    " Enable trainer.v1.sampler.sync_refill_failed_groups to replace failed groups.")
                raise EmptyBatchError(f"{_VERL_EMPTY}{hint} ({exc})") from exc
            self.last_batch = batch
            keys = m.batch_keys(batch.batch_id, len(batch))
            meta = batch_meta(partition_id, keys, [m.listing.get(k, {}) for k in keys])
            return meta, verl_metrics(batch.eviction_metrics, batch.filtered_reward_counts)

    def retire(self, partition_id: str, uids: list[str], reason: str = "retired") -> list[str]:
        """Take live, unselected groups out for good (not in verl: an addition): the core's
        `retire`, recorded in the lake as evictions with ``reason``, and their prompt and
        trajectory keys cleared from TransferQueue. The way on for groups a MissingMetricError
        names: ``buffer.retire(partition_id, uids, reason='missing_metric')``. Returns the uids
        retired (unknown or already removed ones are skipped)."""
        with self._lock:
            m = self._mirror(partition_id)      # so the listener clears their keys
            retired = self.core.retire(partition_id, uids, reason=reason)
            try:
                m.flush()                       # cleared when it returns
            except Exception as exc:
                exc.add_note(f"(retire: {len(retired)} group(s) of partition {partition_id!r} "
                             "are retired all the same; their keys stay owed, and the next "
                             "call of this buffer clears them before it lists)")
                raise
            return retired

    def flush(self) -> int:
        """Make now every `kv_clear` a call left behind (the selected groups' prompt keys,
        evicted or discarded groups' keys; the adapter's thread makes them right after each
        call, so this returns at once unless that clear is still under way). Returns how many
        keys this call cleared. Not in verl (an addition): for code that lists TransferQueue
        right after `sample` and must not see the batch's prompt keys. Raises what TransferQueue
        raises; the keys then stay owed."""
        with self._lock:
            return sum(m.flush() for m in self._mirrors.values())

    def close(self) -> None:
        """Stop the background mirror (if any) and make the clears it still owed, then close the
        lake (if any); TransferQueue stays up (it belongs to the trainer)."""
        if self._background is not None:
            self._background.stop()
        with self._lock:
            try:
                for m in self._mirrors.values():
                    m.flush()
            finally:
                self.core.close()


class _DepthQueries:
    """`get_sampleable_count` / `wait_for_sampleable` (verl's async class and the separate-async
    trainer's hybrid switching need them), and replaylake's `dispatch_capacity`."""

    def _mirror_for_read(self, partition_id: str) -> None:
        """Bring the partition's mirror up to date for a read (call with the lock held)."""
        m = self._mirror(partition_id)
        if usable(m, self.mirror_max_lag):
            self.background_polls += 1
        else:
            # a depth query changes nothing in TransferQueue (beyond clears an earlier
            # call deferred, which any listing makes first)
            m.sync(clear_orphans=False)

    def get_sampleable_count(self, global_steps: int, partition_id: str) -> int:
        """Groups `sample` could hand out now; mirrors TransferQueue but evicts, refills and
        clears nothing, and (as verl) ignores the wait gate."""
        with self._lock:
            self._mirror_for_read(partition_id)
            return self.core.get_sampleable_count(global_steps, partition_id)

    def dispatch_capacity(self, global_steps: int, partition_id: str,
                          batch_size: int | None = None) -> int:
        """How many more prompts the rollout side may dispatch now, tagged ``global_steps``,
        so that none can be trained over `max_off_policy_threshold` when the trainer takes
        ``batch_size`` groups per step (default: `train_batch_size`). Not in verl (an
        addition): see `ReplayBuffer.dispatch_capacity`. Mirrors TransferQueue first, clears
        nothing. With `max_off_policy_strategy="admit"` the buffer's own refills keep to it."""
        with self._lock:
            self._mirror_for_read(partition_id)
            return self.core.dispatch_capacity(global_steps, partition_id,
                                               batch_size=batch_size)

    def wait_for_sampleable(self, global_steps: int, partition_id: str,
                            target_count: int) -> tuple[set[str], dict]:
        """Evict and refill as `sample` would until `target_count` groups are sampleable and the
        gate is open; returns (every sampleable uid, verl's metric dict); consumes nothing."""
        with self._lock:
            m = self._mirror(partition_id)
            _, scalars = self.core.wait_for_sampleable(global_steps, partition_id, target_count,
                                                       before_poll=self._poller(m))
            uids = set(self.core.sampleable_uids(partition_id))
            return uids, verl_metrics(dict(scalars), scalars.reward_counts)


class ReplayBufferAsync(_DepthQueries, VerlBuffer):
    """verl's `ReplayBufferAsync`: bounded staleness (drop / wait), every failure evicted, k
    evicted groups refilled at once; sync-only keywords are accepted and ignored (as verl)."""

    _preset = "async"


class ReplaylakeSampler(_DepthQueries, VerlBuffer):
    """The class for verl's custom-sampler hook (`trainer.v1.sampler.custom_sampler.path/name`).

    verl constructs it with trainer_mode, trainer_config, max_off_policy_threshold,
    max_off_policy_strategy, sampler_kwargs and refill_fn only: `trainer_mode == "sync"` picks the
    sync preset, any other mode (`colocate_async`, `separate_async`) the async one, and every
    other option comes from `sampler_kwargs`."""

    def __init__(self, trainer_mode: str, trainer_config: Any, max_off_policy_threshold: int | None,
                 max_off_policy_strategy: str, sampler_kwargs: Any = None,
                 refill_fn: Callable[[int], Any] | None = None, **options: Any) -> None:
        self._preset = "sync" if trainer_mode == "sync" else "async"
        super().__init__(trainer_mode, trainer_config, max_off_policy_threshold,
                         max_off_policy_strategy, sampler_kwargs, refill_fn=refill_fn, **options)

    @property
    def preset(self) -> str:
        return self._preset

