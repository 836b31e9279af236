"""Hypothesis: random interleavings of register / put / status changes / sample / release /
reissue / restart, for both presets, against a small reference model of the sampling, eviction
and refill rules.

Properties: every batch is exactly the model's oldest whole groups; no group is handed out twice;
conservation (every registered group is live, sampled, released or evicted, and the lake's
decision log agrees); no sampled group exceeds the staleness bound under async `drop`; restoring
from the lake gives the same buffer as the live one.
"""
from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pipeline import EmptyBatchError, ReplayBuffer, SampleTimeout, UnknownGroupError
from pipeline.lake.writer import read_table
from tests.support.lake import traj

TERMINAL = ("finished", "failure")
THRESHOLD = 3
MAX_STEP = 12


@dataclass
class G:
    """The model of one group."""

    gs: int
    status: str = "pending"
    n_traj: int = 0
    term: int = -1                  # order in which it turned terminal
    where: str = "live"             # live | sampled | released | evicted


class BufferMachine(RuleBasedStateMachine):
    """Drives a real buffer on a real lake and a model side by side."""

    preset = "sync"

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="replaylake-prop-"))
        self.lake = self.dir / "lake"
        self.buf = self.open()
        self.step = 1
        self.groups: dict[str, G] = {}
        self.terms = 0
        self.held: dict[int, list[str]] = {}
        self.handed_out: set[str] = set()

    def open(self) -> ReplayBuffer:
        if self.preset == "async":
            return ReplayBuffer.async_(lake=self.lake, poll_interval=0.01,
                                       max_off_policy_threshold=THRESHOLD)
        return ReplayBuffer.sync(lake=self.lake, poll_interval=0.01)

    def uids(self, *, where: str = "live", status: tuple[str, ...] | None = None) -> list[str]:
        return sorted(u for u, g in self.groups.items() if g.where == where
                      and (status is None or g.status in status))

    def expected_counts(self) -> dict[str, int]:
        out = {"pending": 0, "running": 0, "finished": 0, "failure": 0, "sampled": 0}
        for g in self.groups.values():
            if g.where == "live":
                out[g.status] += 1
            elif g.where == "sampled":
                out["sampled"] += 1
        return out

    # --- producers ---------------------------------------------------------------------------
    @initialize(sizes=st.lists(st.integers(0, 2), max_size=5))
    def some_finished_groups(self, sizes):
        """Start with a few finished groups, so that sampling has material early."""
        for k in sizes:
            self.whole_group(k, 0)

    @rule(k=st.integers(1, 3), lag=st.integers(0, 3))
    def register(self, k, lag):
        gs = max(self.step - lag, 0)
        new = [f"u{len(self.groups) + i}" for i in range(k)]
        self.buf.register(partition="train", uids=new, global_steps=gs)
        for u in new:
            self.groups[u] = G(gs)

    @rule(k=st.integers(0, 2), lag=st.integers(0, 3))
    def whole_group(self, k, lag):
        """Register, fill and finish one group in a row (the common case of a rollout)."""
        self.register(1, lag)
        uid = f"u{len(self.groups) - 1}"
        if k:
            self.put_rows(uid, k)
        self.finish_group(uid, "finished")

    @precondition(lambda self: self.uids(status=("pending", "running")))
    @rule(data=st.data(), k=st.integers(1, 2))
    def put(self, data, k):
        self.put_rows(data.draw(st.sampled_from(self.uids(status=("pending", "running")))), k)

    def put_rows(self, uid: str, k: int) -> None:
        g = self.groups[uid]
        v = max(g.gs - 1, 0)
        rows = [traj(uid, g.n_traj + s, min_gs=max(v - 1, 0), max_gs=v, reward=float(s))
                for s in range(k)]
        assert self.buf.put(rows) == k
        g.n_traj += k

    @precondition(lambda self: self.uids(status=("pending",)))
    @rule(data=st.data())
    def start(self, data):
        uid = data.draw(st.sampled_from(self.uids(status=("pending",))))
        self.buf.update_status(partition="train", uids=[uid], status="running")
        self.groups[uid].status = "running"

    @precondition(lambda self: self.uids(status=("pending", "running")))
    @rule(data=st.data(), status=st.sampled_from(TERMINAL))
    def finish(self, data, status):
        self.finish_group(data.draw(st.sampled_from(self.uids(status=("pending", "running")))),
                          status)

    def finish_group(self, uid: str, status: str) -> None:
        self.buf.update_status(partition="train", uids=[uid], status=status)
        g = self.groups[uid]
        g.status, g.term = status, self.terms
        self.terms += 1

    @precondition(lambda self: any(g.where != "live" or g.status in TERMINAL
                                   for g in self.groups.values()))
    @rule(data=st.data())
    def late_trajectory_is_rejected(self, data):
        closed = sorted(u for u, g in self.groups.items()
                        if g.where != "live" or g.status in TERMINAL)
        uid = data.draw(st.sampled_from(closed))
        with pytest.raises(UnknownGroupError):
            self.buf.put([traj(uid, 99)])

    # --- the trainer -------------------------------------------------------------------------
    @precondition(lambda self: self.step < MAX_STEP)
    @rule()
    def advance(self):
        self.step += 1

    @rule(size=st.integers(1, 3))
    def sample(self, size):
        live = [u for u in self.uids(status=TERMINAL)]
        if self.preset == "async":              # failures (incl. empty finished) and stale
            for u in live:
                g = self.groups[u]
                if g.status == "failure" or g.n_traj == 0 or self.step - g.gs + 1 > THRESHOLD:
                    g.where = "evicted"
                    event("sample: evicted a group")
            live = [u for u in live if self.groups[u].where == "live"]
        ranked = sorted(live, key=lambda u: (self.groups[u].gs, self.groups[u].term))
        chosen = ranked[:size]
        if len(ranked) < size:
            with pytest.raises(SampleTimeout) as info:
                self.buf.sample(self.step, "train", size, timeout=0)
            assert info.value.counts == self.expected_counts()
            event("sample: timed out")
            return
        if self.preset == "sync" and sum(self.groups[u].n_traj for u in chosen) == 0:
            with pytest.raises(EmptyBatchError):
                self.buf.sample(self.step, "train", size, timeout=0)
            event("sample: empty batch refused")
            return                              # nothing consumed
        batch = self.buf.sample(self.step, "train", size, timeout=0)
        assert batch.uids == chosen
        assert len(batch) == sum(self.groups[u].n_traj for u in chosen)
        assert not self.handed_out & set(chosen), "a group was handed out twice"
        if self.preset == "async" and len(batch):
            assert max(batch.table["group_span"].to_pylist()) <= THRESHOLD
        event("sample: batch")
        self.handed_out |= set(chosen)
        self.held[batch.batch_id] = chosen
        for u in chosen:
            self.groups[u].where = "sampled"

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data):
        batch_id = data.draw(st.sampled_from(sorted(self.held)))
        self.buf.release(batch_id)
        for u in self.held.pop(batch_id):
            self.groups[u].where = "released"

    @precondition(lambda self: self.uids(status=("pending", "running")))
    @rule()
    def reissue(self):
        inflight = self.uids(status=("pending", "running"))
        assert self.buf.reissue(self.step) == {"train": inflight}
        for u in inflight:
            self.groups[u] = G(self.step)

    @rule()
    def restart(self):
        self.buf.close()
        self.buf = self.open()

    # --- properties --------------------------------------------------------------------------
    @invariant()
    def live_counts_match_the_model(self):
        assert self.buf.counts("train") == self.expected_counts()

    def teardown(self):
        try:
            if not self.groups:
                return
            counts = self.buf.counts("train")
            sampleable = self.buf.get_sampleable_count(self.step, "train")
            self.buf.close()
            self.conservation_holds_in_the_lake()
            with self.open() as restored:
                assert restored.counts("train") == counts
                assert restored.get_sampleable_count(self.step, "train") == sampleable
        finally:
            self.buf.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def conservation_holds_in_the_lake(self):
        events = read_table(self.lake, "group_events")
        registered = events.filter(pc.equal(events["event"], "registered"))["uid"].to_pylist()
        assert sorted(registered) == sorted(self.groups)
        dec = read_table(self.lake, "decisions")

        def uids_of(kind: str) -> list[str]:
            return dec.filter(pc.equal(dec["kind"], kind))["uid"].to_pylist()

        selected, evicted, released = uids_of("select"), uids_of("evict"), uids_of("release")
        assert len(selected) == len(set(selected)), "a group was selected twice"
        assert set(evicted) == set(self.uids(where="evicted"))
        assert set(selected) == set(self.uids(where="sampled")) | set(self.uids(where="released"))
        assert sorted(released) == self.uids(where="released")
        assert not set(selected) & set(evicted)
        live = self.uids(where="live")
        assert len(live) + len(set(selected)) + len(set(evicted)) == len(self.groups)


class AsyncBufferMachine(BufferMachine):
    preset = "async"


# Interleavings need more and longer runs than a plain property: twice the profile's examples.
_RUNS = settings(settings.default, max_examples=2 * settings.default.max_examples,
                 stateful_step_count=50)
TestSyncPresetInterleavings = BufferMachine.TestCase
TestSyncPresetInterleavings.settings = _RUNS
TestAsyncPresetInterleavings = AsyncBufferMachine.TestCase
TestAsyncPresetInterleavings.settings = _RUNS
