"""Benchmark: time per `sample` of verl 0.9.1's ReplayBufferAsync vs replaylake's verl adapter, both
reading real TransferQueues, at several buffer sizes (4 trajectories per group), in one run.

Each implementation gets a TransferQueue of its own (tq_systems.py: verl lists every partition of
its TransferQueue on each poll, so a shared one made it pay for the others' keys), with one
partition filled once with the same finished groups (fields and tags as verl's agent loop writes
them, verl_groups.py). Each implementation, as a fresh instance, makes one cold call; then
`repeats` rounds follow, and in every round each implementation makes one timed call in turn
(interleaved call by call, so a slow moment of a shared machine falls on every side alike).
Before each timed call (untimed) the trainer clears that implementation's previous batch and 64
new groups arrive, so every partition keeps its size and every call has new data to take in, as
in a run. After each timed call of ours (untimed) the benchmark waits for the clears the call
left to the adapter's thread (`flush`), so that no clear of ours runs into the next timed call;
how long that took past the return is reported beside each of ours (`after_ms`). Implementations:
verl's buffer; ours reading only what decisions need
(`mirror_fields=decisions`, the default without a lake); ours also mirroring every reward for the
lake (`rewards`); and both with DAPO (`filter_groups_metric="reward"`, which makes each read
`rm_scores` of new groups). A sixth series, `tq_floor`, is no buffer (verl_floor.py): it times,
on its own TransferQueue of the same size, the bare TransferQueue calls a default-mode `sample`
of ours makes inside the call and cannot leave out (and, apart, the bare `kv_clear` of the
prompt keys), so that a ratio bounded by TransferQueue itself shows its bound in the same run.
Each series reports its median, its quartiles and its extremes.

A second phase plays a trainer step between calls: after the untimed clear and writes, the
benchmark sleeps `step_s` seconds (the trainer training) before the timed call. It times verl
again under those conditions, and ours with the background mirror (`mirror_max_lag=lag_s`), in
both mirror modes. This phase runs each implementation's calls alone, one implementation after
the other: a background thread kept alive during another implementation's timed call would take
CPU from that call. For each it also reports the process's CPU time during the step (the
background thread's listings and reads, and TransferQueue's client thread serving them; the
controller's own process is not counted, for either side) and how many timed calls found the
background view fresh enough to skip their listing.
"""
from __future__ import annotations

import json
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from jobs.bench import tq_systems
from jobs.bench.out import bound, figure, result_path
from jobs.bench.tq_systems import Systems
from jobs.bench.verl_floor import FLOOR, Floor, floor_figures
from jobs.bench.verl_groups import PART, PER_GROUP, STEP, spread, write_groups

IMPLS = ("verl", "ours", "ours_rewards", "verl_dapo", "ours_dapo")
STEP_IMPLS = ("verl", "ours_bg", "ours_rewards_bg")   # with a trainer step between calls


def _stop(tq: Any, started: bool, systems: Systems) -> None:
    """Clear what the benchmark left in TransferQueue, close the TransferQueues it added; stop
    TQ and Ray if this run started them."""
    try:
        for client in [systems.main, *(s.client for s in systems.owned)]:
            tq_systems.use(client)
            for part in _partitions(tq):
                _clear(tq, part)
    finally:
        tq_systems.use(systems.main)
        for system in systems.owned:
            system.close()
    if started:
        import ray
        tq.close()
        ray.shutdown()


def _clear(tq: Any, part: str) -> None:
    """Remove every key of ``part`` (kv_clear refuses an empty key list)."""
    keys = list(tq.kv_list(partition_id=part).get(part, {}))
    if keys:
        tq.kv_clear(keys=keys, partition_id=part)


def _partitions(tq: Any) -> list[str]:
    """The partitions this benchmark writes to (one per implementation) that hold keys."""
    listing = tq.kv_list()
    return [p for p in listing if p == PART or p.startswith(f"{PART}-")]


def _start() -> tuple[Any, bool]:
    """Ray (num_cpus=4: TransferQueue's actors each ask for a CPU) and TransferQueue, unless this
    process already has them (e.g. under pytest)."""
    os.environ.setdefault("TQ_LOGGING_LEVEL", "ERROR")
    warnings.filterwarnings("ignore")
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    return tq, started


def _make(impl: str, lag_s: float | None = None) -> Any:
    kw: dict[str, Any] = dict(trainer_mode="colocate_async", trainer_config={},
                              max_off_policy_threshold=8, max_off_policy_strategy="drop",
                              sampler_kwargs={}, poll_interval=0.05, refill_fn=lambda n: n)
    if impl.endswith("dapo"):
        kw["filter_groups_metric"] = "reward"
    if impl.startswith("verl"):
        from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
        return ReplayBufferAsync(**kw)
    from pipeline.adapters.verl import ReplayBufferAsync as Ours
    return Ours(**kw, mirror_fields="rewards" if impl.startswith("ours_rewards") else "decisions",
                mirror_max_lag=lag_s if impl.endswith("_bg") else None)


class _Runner:
    """One implementation over its own TransferQueue partition, the same size as every other's.

    `call` is one round's turn: (untimed) the trainer clears the previous batch and ``batch`` new
    groups arrive, then (``step_s``) the trainer trains, then the timed `sample`. So the buffer
    size stays constant and every call has new data to take in, as in a run."""

    def __init__(self, tq: Any, impl: str, part: str, batch: int, fresh: list[int],
                 systems: Systems, step_s: float = 0.0, lag_s: float | None = None):
        self.tq, self.impl, self.part, self.batch, self.fresh = tq, impl, part, batch, fresh
        self.systems = systems
        self.step_s, self.buf = step_s, _make(impl, lag_s)
        self.times: list[float] = []
        self.after: list[float] = []            # ours: until the clears it left are made
        self.cpu: list[float] = []
        self.last: list[str] | None = None
        self.served = 0

    def _refill(self) -> None:
        self.tq.kv_clear(keys=self.last, partition_id=self.part)
        write_groups(self.tq, [f"n{self.fresh[0] + i}" for i in range(self.batch)], self.part)
        self.fresh[0] += self.batch

    def call(self) -> None:
        self.systems.of(self.part)             # this implementation's TransferQueue
        if self.last is not None:
            self._refill()
        if self.step_s:                        # the trainer trains; our thread may mirror
            c = time.process_time()
            time.sleep(self.step_s)
            self.cpu.append(time.process_time() - c)
        if len(self.times) == 1:
            self.served = getattr(self.buf, "background_polls", 0)   # the cold call's not counted
        t = time.perf_counter()
        meta, _ = self.buf.sample(global_steps=STEP, partition_id=self.part,
                                  batch_size=self.batch)
        self.times.append(time.perf_counter() - t)
        if hasattr(self.buf, "flush") and not self.step_s:   # untimed, interleaved phase: the
            t = time.perf_counter()            # clears left to its thread end before others run
            self.buf.flush()
            self.after.append(time.perf_counter() - t)
        if len(meta.keys) != self.batch * PER_GROUP:
            raise RuntimeError(f"{self.impl}: {len(meta.keys)} keys for a batch of "
                               f"{self.batch} groups")
        self.last = list(meta.keys)

    def finish(self) -> dict:
        self.systems.of(self.part)
        self._refill()                          # keep the size constant for the next phase
        out = spread(self.times[1:], self.times[0])
        if self.after:
            out["after_ms"] = statistics.median(self.after[1:]) * 1e3
        if self.step_s:
            out["step_s"] = self.step_s
            out["step_cpu_ms"] = statistics.median(self.cpu[1:] or self.cpu) * 1e3
            out["calls_on_background_view"] = getattr(self.buf, "background_polls", 0) - self.served
        if hasattr(self.buf, "close"):
            self.buf.close()
        return out


def interleaved(runners: list[_Runner], repeats: int) -> dict[str, dict]:
    """Every implementation's cold call, then ``repeats`` rounds of one timed call each, in turn:
    a slow moment of the machine falls on every side alike."""
    for _ in range(repeats + 1):
        for r in runners:
            r.call()
    return {r.impl: r.finish() for r in runners}


def one_by_one(runners: list[_Runner], repeats: int) -> dict[str, dict]:
    """Each implementation's calls alone, one implementation after the other: for the
    background-mirror phase, whose thread, alive during another implementation's timed call,
    would take CPU from it."""
    out = {}
    for r in runners:
        for _ in range(repeats + 1):
            r.call()
        out[r.impl] = r.finish()
    return out


def _fill(tq: Any, part: str, n: int, systems: Systems) -> float:
    systems.of(part)
    _clear(tq, part)
    t = time.perf_counter()
    write_groups(tq, [f"b{i}" for i in range(n)], part)
    return time.perf_counter() - t


def run_size(tq: Any, n: int, batch: int, repeats: int, fresh: list[int], systems: Systems,
             step_s: float = 1.0, lag_s: float = 1.0) -> dict:
    """One buffer size: every implementation, each on its own TransferQueue holding one partition
    of ``n`` groups, timed call by call in turn (with the bare TransferQueue calls, `Floor`);
    then (``step_s`` > 0) the phase with a trainer step between calls."""
    parts = {impl: f"{PART}-{impl}" for impl in (*IMPLS, FLOOR)}
    fill_s = sum(_fill(tq, part, n, systems) for part in parts.values()) / len(parts)
    part = parts["verl"]
    systems.of(part)
    t = time.perf_counter()
    tq.kv_list(partition_id=part)
    list_ms = (time.perf_counter() - t) * 1e3
    impls = interleaved([_Runner(tq, impl, parts[impl], batch, fresh, systems) for impl in IMPLS]
                        + [Floor(tq, parts[FLOOR], n, batch, fresh, systems)], repeats)
    floor = impls.pop(FLOOR)
    med = {k: v["median_ms"] for k, v in impls.items()}
    out = {"groups": n, "trajectories": n * PER_GROUP, "fill_s": round(fill_s, 2),
           "kv_list_ms": list_ms, "order": "interleaved", "impls": impls,
           "verl_over_ours": med["verl"] / med["ours"],
           "verl_over_ours_rewards": med["verl"] / med["ours_rewards"], "tq_floor": floor,
           "verl_over_floor": med["verl"] / floor["decisions"]["median_ms"],
           "verl_over_floor_rewards": med["verl"] / floor["rewards"]["median_ms"],
           "verl_dapo_over_ours_dapo": med["verl_dapo"] / med["ours_dapo"],
           "first_call_verl_dapo_over_ours_dapo":
               impls["verl_dapo"]["first_ms"] / impls["ours_dapo"]["first_ms"]}
    if step_s > 0:
        step_parts = {"verl": parts["verl"], "ours_bg": parts["ours"],
                      "ours_rewards_bg": parts["ours_rewards"]}
        stepped = one_by_one([_Runner(tq, impl, step_parts[impl], batch, fresh, systems, step_s,
                                      lag_s) for impl in STEP_IMPLS], repeats)
        sm = {k: v["median_ms"] for k, v in stepped.items()}
        out.update(step_s=step_s, lag_s=lag_s, stepped=stepped,
                   stepped_verl_over_ours_bg=sm["verl"] / sm["ours_bg"],
                   stepped_verl_over_ours_rewards_bg=sm["verl"] / sm["ours_rewards_bg"])
    for p in parts.values():                   # the next size starts from empty partitions
        systems.of(p)
        _clear(tq, p)
    return out


def figures(sizes: tuple[int, ...], batch: int, repeats: int, step_s: float,
            lag_s: float) -> list[dict[str, Any]]:
    """`bench all`'s verl section: each size's figures, each beside verl's from the same run."""
    tq, started = _start()
    out, fresh, systems = [], [0], Systems()
    try:
        for n in sizes:
            r = run_size(tq, n, batch, repeats, fresh, systems, step_s, lag_s)
            goal = 1.5 if n >= 10_000 else 1.0
            out.extend(default_figures(r, n, goal))
            out.extend(floor_figures(r, n, r["impls"]["verl"]["median_ms"]))
            out.extend(_stepped_figures(r, n, goal))
    finally:
        _stop(tq, started, systems)
    return out


def default_figures(r: dict[str, Any], n: int, goal: float) -> list[dict[str, Any]]:
    """The default mode's figures (the mirror inside each `sample`), each against verl's and
    with its bound: verl's time over the bare TransferQueue calls that mode makes in the call
    (the `tq_floor` series, same rounds), the most any adapter making them could reach."""
    med = {k: v["median_ms"] for k, v in r["impls"].items()}
    out = []
    for mode, key, suffix in (("decisions", "ours", ""), ("rewards", "ours_rewards", "_rewards")):
        ratio, most = r[f"verl_over_{key}"], r[f"verl_over_floor{suffix}"]
        out.append(figure(f"verl adapter sample, {n:,} groups, {mode} mirror (interleaved, "
                          f"{r['impls'][key]['timed_calls']} calls each)",
                          med[key], "ms", "verl 0.9.1 ms", med["verl"], ratio, "x verl's speed",
                          f">= {goal}x verl", ratio >= goal,
                          bound=bound(most, "TransferQueue's bare calls (those this mode makes "
                                            "inside sample)", most >= goal)))
        after = r["impls"][key]["after_ms"]
        out.append(figure(f"its clears after the call, {n:,} groups, {mode} mirror (the "
                          "selected prompt keys' kv_clear, made by the adapter's thread once "
                          "sample has returned; verl makes it inside sample)", after, "ms",
                          "bare kv_clear ms", r["tq_floor"]["clear_ms"],
                          after / r["tq_floor"]["clear_ms"], "x the bare call", "", None,
                          in_summary=True))
    return out


def _stepped_figures(r: dict[str, Any], n: int, goal: float) -> list[dict[str, Any]]:
    """The background-mirror phase: `sample` after a trainer step, against verl timed the same
    way, and what the mirroring costs the process during the step (verl's CPU beside it)."""
    st, step, lag = r["stepped"], r["step_s"], r["lag_s"]
    verl = st["verl"]
    out = []
    for mode, key in (("decisions", "ours_bg"), ("rewards", "ours_rewards_bg")):
        ours = st[key]
        ratio = verl["median_ms"] / ours["median_ms"]
        where = (f"{n:,} groups, {mode} mirror, background (mirror_max_lag={lag:g} s, "
                 f"{step:g} s step, view used by {ours['calls_on_background_view']} of "
                 f"{ours['timed_calls']} calls)")
        out.append(figure(f"verl adapter sample after a step, {where}", ours["median_ms"], "ms",
                          "verl 0.9.1 ms, same steps", verl["median_ms"], ratio,
                          "x verl's speed", f">= {goal}x verl", ratio >= goal))
        out.append(figure(f"process CPU during each step, {n:,} groups, {mode} mirror, "
                          f"background (verl's: {verl['step_cpu_ms']:.0f} ms)",
                          ours["step_cpu_ms"], "ms", "step ms", step * 1e3,
                          ours["step_cpu_ms"] / (step * 1e3), "of a core", "", None,
                          in_summary=True))
    return out


def main(sizes: str = typer.Option("100,1000,10000", help="buffered groups, comma-separated"),
         repeats: int = typer.Option(15, help="timed sample calls per size and implementation"),
         batch: int = typer.Option(64, help="groups per sample"),
         step_s: float = typer.Option(1.0, help="seconds of 'training' between calls in the "
                                      "background-mirror phase; 0 skips that phase"),
         lag_s: float = typer.Option(1.0, help="mirror_max_lag of the background-mirror phase"),
         out: Path = typer.Option(Path("runs/bench/verl.json"),
                                  help="where to write results (a directory: verl.json in it)")
         ) -> None:
    """verl's ReplayBufferAsync vs replaylake's adapter through TransferQueue, same run.

    Examples:
        replaylake dev bench verl
        replaylake dev bench verl --sizes 100,1000 --repeats 3
    """
    out = result_path(out, "verl.json")
    console = Console()
    with console.status("starting Ray and TransferQueue ..."):
        tq, started = _start()
    results, fresh, systems = [], [0], Systems()
    try:
        for n in [int(s) for s in sizes.split(",")]:
            with console.status(f"{n:,} groups ..."):
                results.append(run_size(tq, n, batch, repeats, fresh, systems, step_s, lag_s))
    finally:
        _stop(tq, started, systems)
    console.print(_table(results, batch))
    if step_s > 0:
        console.print(_stepped_table(results, batch, step_s, lag_s))
    out.write_text(json.dumps({"batch": batch, "per_group": PER_GROUP, "results": results},
                              indent=2))
    console.print(f"written to {out}")


def _rows_table(title: str, columns: tuple[str, ...]) -> Table:
    """A table of one row per size and implementation, right-aligned (fits 80 columns)."""
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right")
    return table


def _table(results: list[dict], batch: int) -> Table:
    """Interleaved: one row per size and implementation (fits an 80-column terminal); each of
    ours against the verl implementation with the same options."""
    kv = ", ".join(f"{r['groups']:,} groups {r['kv_list_ms']:.1f} ms" for r in results)
    table = _rows_table(f"sample(batch {batch}) through TransferQueue, interleaved call by call, "
                        f"ms: median, quartiles, first call; each on its own TransferQueue; "
                        f"'after': ms until the clears ours leaves to its thread are made (on "
                        f"the tq row: the bare kv_clear); "
                        f"'tq': the bare TransferQueue calls ours makes inside the call, "
                        f"the bound (kv_list of one partition alone: {kv})",
                        ("groups", "impl", "median", "p25-p75", "first", "after",
                         "verl/ours"))
    for r in results:
        im = r["impls"]
        for i in IMPLS:
            ref = "verl_dapo" if i.endswith("dapo") else "verl"
            ratio = "" if i.startswith("verl") else f"{im[ref]['median_ms'] / im[i]['median_ms']:.2f}x"
            f = im[i]
            after = f"{f['after_ms']:.1f}" if "after_ms" in f else ""
            table.add_row(f"{r['groups']:,}", i, f"{f['median_ms']:.1f}",
                          f"{f['p25_ms']:.1f}-{f['p75_ms']:.1f}", f"{f['first_ms']:.0f}", after,
                          ratio)
        for mode in ("decisions", "rewards"):       # the bound TransferQueue sets, same run
            f = r["tq_floor"][mode]
            ratio = f"<={im['verl']['median_ms'] / f['median_ms']:.2f}x"
            clear = f"{r['tq_floor']['clear_ms']:.1f}" if mode == "decisions" else ""
            table.add_row(f"{r['groups']:,}", f"tq, {mode}", f"{f['median_ms']:.1f}",
                          f"{f['p25_ms']:.1f}-{f['p75_ms']:.1f}", f"{f['first_ms']:.0f}", clear,
                          ratio)
    return table


def _stepped_table(results: list[dict], batch: int, step_s: float, lag_s: float) -> Table:
    """One row per size and implementation, so that it fits an 80-column terminal."""
    table = _rows_table(f"with a {step_s:g} s trainer step between calls; ours with "
                        f"mirror_max_lag={lag_s:g}: sample(batch {batch}) median ms, process "
                        "CPU during the step, calls the background view served",
                        ("groups", "impl", "sample ms", "step CPU ms", "view", "verl/ours"))
    for r in results:
        st = r["stepped"]
        for i in STEP_IMPLS:
            f = st[i]
            ratio = st["verl"]["median_ms"] / f["median_ms"]
            view = "" if i == "verl" else f"{f['calls_on_background_view']}/{f['timed_calls']}"
            table.add_row(f"{r['groups']:,}", i, f"{f['median_ms']:.1f}",
                          f"{f['step_cpu_ms']:.0f}", view, "" if i == "verl" else f"{ratio:.2f}x")
    return table


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
