"""`replaylake dev big-lake`: write a lake at the scale of a real RL run, through the buffer.

    replaylake dev big-lake --lake runs/big/lake --steps 80            # about 51 GB on disk
    replaylake dev big-lake --lake /tmp/small/lake --steps 3 --groups 8 --tokens 50:100

What it writes is what an async RL run archives, step by step: ``--groups`` prompts of ``--n``
responses each are registered, generated (random token ids over a 151,936-token vocabulary,
response lengths drawn uniformly from ``--tokens``, log-probs and a loss mask for every response
token, prompts of 256 to 1,024 tokens), put and settled; then the trainer samples a batch of
``--batch`` groups at that step and releases it. The rollout side runs one weight version behind
the trainer (one group in ten two), so the async preset (threshold 2, `drop`, DAPO filter on the
reward) evicts those and the untrained surplus of the step before as stale; a quarter of the
groups have no reward variance (evicted by the filter) and 3 % fail. Every ``--compact-every``
steps the sealed segments are compacted, as the scheduled `compact` job of a run does
(jobs/schedule.toml), so the lake at rest is mostly Parquet. ``--first-step`` goes on with an
existing lake in a new buffer session (a run's restart).

Defaults give about 0.6 GB of Parquet per step (512 groups x 16 responses of 2,000 to 22,000
tokens; docs/jobs.md, "At the scale of a real run"). Deterministic for a given ``--seed``.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import numpy as np
import pyarrow as pa
import typer

from jobs.synthetic import length_range, token_lists
from schemas import TRAJECTORIES_INPUT

PART = "train"
VOCAB = 151_936          # a Qwen-sized vocabulary: token ids as random as a real run's
PROMPT = (256, 1024)
CHUNK_GROUPS = 64        # groups generated and put at once (bounds the writer's memory)


def _rewards(rng: np.random.Generator, groups: int, n: int) -> np.ndarray:
    """Per response: a quarter of the groups all 0 or all 1 (no variance), the rest mixed."""
    r = (rng.random((groups, n)) < 0.5).astype(np.float64)
    flat = rng.random(groups) < 0.25
    r[flat] = rng.integers(0, 2, size=(int(flat.sum()), 1))
    return r.ravel()


def _table(uids: list[str], versions: np.ndarray, n: int, tokens: tuple[int, int],
           rng: np.random.Generator) -> pa.Table:
    rows = len(uids) * n
    resp_len = rng.integers(tokens[0], tokens[1] + 1, size=rows)
    resp = token_lists(resp_len, rng, VOCAB)
    v = np.repeat(versions, n)
    cols = {
        "partition": pa.array([PART] * rows),
        "uid": pa.array(np.repeat(np.asarray(uids, dtype=object), n).tolist()),
        "session_id": pa.array(np.tile(np.arange(n, dtype=np.int32), len(uids))),
        "index": pa.array(np.zeros(rows, dtype=np.int32)),
        "min_global_steps": pa.array(v.astype(np.int64)),
        "max_global_steps": pa.array(v.astype(np.int64)),
        "reward": pa.array(_rewards(rng, len(uids), n)),
        "reward_info": pa.nulls(rows, TRAJECTORIES_INPUT.field("reward_info").type),
        "prompt_ids": token_lists(np.repeat(rng.integers(*PROMPT, size=len(uids)), n), rng, VOCAB),
        "response_ids": resp,
        "response_mask": pa.ListArray.from_arrays(resp.offsets, pa.array(
            np.ones(len(resp.values), dtype=np.int8))),
        "rollout_log_probs": pa.ListArray.from_arrays(resp.offsets, pa.array(
            np.log(np.maximum(rng.random(len(resp.values), dtype=np.float32), 1e-6)))),
        "version_spans": pa.nulls(rows, TRAJECTORIES_INPUT.field("version_spans").type),
        "is_padding": pa.array(np.zeros(rows, dtype=bool)),
        "versions_inferred": pa.array(np.zeros(rows, dtype=bool)),
        "generation_s": pa.array(resp_len / 2000.0),
        "n_response_tokens": pa.nulls(rows, pa.int64()),     # the tokens say it
    }
    return pa.Table.from_arrays([cols[f.name] for f in TRAJECTORIES_INPUT],
                                schema=TRAJECTORIES_INPUT)


def write(lake: Path, steps: int, groups: int, n: int, tokens: tuple[int, int], batch: int,
          compact_every: int, seed: int, first_step: int = 1, log=lambda s: None) -> dict:
    """Write ``steps`` steps from ``first_step`` on (see the module doc); what was written."""
    from pipeline import ReplayBuffer, SampleTimeout
    from pipeline.lake import compact

    rng = np.random.default_rng([seed, first_step])
    made = trained = short = 0
    with ReplayBuffer.async_(lake=lake, max_off_policy_threshold=2,
                             filter_groups_metric="reward", refill_fn=lambda k: None) as buf:
        for step in range(first_step, first_step + steps):
            t0 = time.perf_counter()
            for first in range(0, groups, CHUNK_GROUPS):
                k = min(CHUNK_GROUPS, groups - first)
                uids = [f"s{step:05d}g{first + i:05d}" for i in range(k)]
                # dispatched with the weights of the step before (one in ten a step earlier: stale)
                versions = np.maximum(step - 1 - (rng.random(k) < 0.1), 0)
                for v in np.unique(versions):
                    buf.register(partition=PART, uids=[u for u, x in zip(uids, versions)
                                                       if x == v], global_steps=int(v), n=n)
                failed = rng.random(k) < 0.03
                ok = [u for u, f in zip(uids, failed) if not f]
                if ok:
                    buf.put(_table(ok, versions[~failed], n, tokens, rng))
                    buf.update_status(partition=PART, uids=ok, status="finished")
                if failed.any():
                    buf.update_status(partition=PART, uids=[u for u, f in zip(uids, failed) if f],
                                      status="failure")
                made += k
            try:
                b = buf.sample(step, PART, batch, timeout=5.0)
                trained += len(set(b.table["uid"].to_pylist()))
                buf.release(b)
            except SampleTimeout:
                short += 1
            if compact_every and step % compact_every == 0:
                compact(lake)
            log(f"step {step}/{first_step + steps - 1}: {time.perf_counter() - t0:.1f} s")
    compact(lake)
    return {"steps": steps, "groups": made, "trajectories_put": made * n,
            "groups_trained": trained, "short_steps": short}


def main(
    lake: Annotated[Path, typer.Option(help="the lake directory to create")],
    steps: Annotated[int, typer.Option(help="training steps (one sample call each)")] = 85,
    groups: Annotated[int, typer.Option(help="groups (prompts) generated per step")] = 512,
    n: Annotated[int, typer.Option(help="responses per group")] = 16,
    tokens: Annotated[str, typer.Option(help="response length, lo:hi tokens")] = "2000:22000",
    batch: Annotated[int, typer.Option(help="groups trained per step")] = 256,
    compact_every: Annotated[int, typer.Option(help="compact the sealed segments every this "
                                                    "many steps (0: only at the end)")] = 4,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    first_step: Annotated[int, typer.Option(help="the first step to write: above 1, the lake "
                                                 "exists and a new buffer session goes on "
                                                 "with it (a run's restart)")] = 1,
) -> None:
    """Write a lake at the scale of a real RL run through the buffer (about 0.6 GB a step).

    Examples:
        replaylake dev big-lake --lake runs/big/lake --steps 80
        replaylake dev big-lake --lake runs/big/lake --steps 5 --first-step 81
    """
    if first_step < 1:
        raise typer.BadParameter(f"--first-step {first_step}: steps count from 1")
    if first_step == 1 and lake.exists():
        raise typer.BadParameter(f"{lake} exists; give a new directory, or --first-step to go "
                                 "on with it")
    if first_step > 1 and not lake.is_dir():
        raise typer.BadParameter(f"--first-step {first_step}: no lake at {lake} to go on with")
    if not 0 < batch <= groups:
        raise typer.BadParameter(f"--batch {batch}: give 1 to --groups ({groups}) groups")
    t0 = time.perf_counter()
    got = write(lake, steps, groups, n, length_range(tokens), batch, compact_every, seed,
                first_step, log=typer.echo)
    files = [p for p in lake.rglob("*") if p.is_file()]
    typer.echo(f"{lake}: {sum(p.stat().st_size for p in files) / 1e9:.2f} GB in {len(files)} "
               f"files, {got['steps']} steps, {got['groups']} groups, "
               f"{got['trajectories_put']} trajectories put, {got['groups_trained']} groups "
               f"trained ({got['short_steps']} short steps), {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    from jobs.cli import run
    run(main)       # through the one handler of user errors
