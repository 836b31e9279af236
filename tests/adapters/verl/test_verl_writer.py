"""The adapter against what verl's own code writes to TransferQueue, not an imitation of it.

The other adapter tests write keys, tags and fields the way verl's agent loop does. Here verl 0.9.1
writes them itself: its trainer's `_submit_batch_to_rollout` registers the prompts (tags
``is_prompt``, ``status: pending``, ``global_steps``, and the prompt fields), its TransferQueue
agent-loop worker (`AgentLoopWorkerTQ.generate_sequences` -> `_run_prompt` -> `_run_agent_loop`
-> `_agent_loop_postprocess`) marks each group running, writes every session's trajectory
(keys ``{uid}_{session}_{index}``, verl's tags and fields) and then the group's terminal status.
The only stand-in is the model: an agent loop registered through verl's own `register` hook that
returns fixed tokens and a reward instead of generating (there is no inference server on CPU),
and the worker is built without its constructor, which starts those servers. So a change in how
verl writes keys, tags or fields makes this test fail.
"""
from __future__ import annotations

import asyncio

import pytest
import torch

from pipeline.adapters.verl import ReplayBufferAsync
from pipeline.lake.writer import read_table

pytestmark = pytest.mark.verl

N_SESSIONS, STEP = 3, 4


def _verl():
    from omegaconf import OmegaConf
    from tensordict import NonTensorStack, TensorDict
    from verl.experimental.agent_loop import agent_loop as al
    from verl.trainer.ppo.v1 import agent_loop_tq, trainer_base
    from verl.utils import tensordict_utils as tu
    return OmegaConf, NonTensorStack, TensorDict, al, agent_loop_tq, trainer_base, tu


class _Manager:
    """The trainer's agent-loop manager: hands the batch to verl's worker and waits for its
    fire-and-forget tasks (the real manager spreads batches over Ray workers)."""

    def __init__(self, worker):
        self.worker = worker

    def generate_sequences(self, batch) -> None:
        async def run() -> None:
            await self.worker.generate_sequences(batch)
            while self.worker.background_tasks:
                await asyncio.gather(*list(self.worker.background_tasks))
        asyncio.run(run())


class CpuLoop:
    """A stand-in for the model, registered as a verl agent loop: session s answers 2 + s
    tokens with reward s % 2, produced by weights version STEP - 1."""

    def __init__(self, **_: object):
        pass

    async def run(self, sampling_params, **kw):
        from verl.experimental.agent_loop import agent_loop as al
        s = kw["session_id"]
        return al.AgentLoopOutput(
            prompt_ids=[7, 8, 9], response_ids=list(range(10, 12 + s)),
            response_mask=[1] * (2 + s), response_logprobs=[-0.5] * (2 + s),
            reward_score=float(s % 2), num_turns=2, metrics=al.AgentLoopMetrics(),
            extra_fields={"reward_extra_info": {"acc": float(s % 2)},
                          "min_global_steps": STEP - 1, "max_global_steps": STEP - 1})


def _worker(OmegaConf, al, agent_loop_tq):
    """verl's `AgentLoopWorkerTQ`, with the attributes its writer path reads; no servers."""
    name = "replaylake_cpu_loop"

    al.register(name)(CpuLoop)              # verl's hook: hydra builds it by its module path
    cls = agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__     # the class behind its actor
    w = object.__new__(cls)
    w.config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {
            "temperature": 1.0, "top_p": 1.0, "top_k": -1, "calculate_log_probs": True,
            "n": N_SESSIONS, "val_kwargs": {"n": 1, "top_p": 1.0, "top_k": -1,
                                            "temperature": 0.0},
            "agent": {"default_agent_loop": name}}},
        "data": {}})
    w.background_tasks = set()
    w.llm_client = w.tokenizer = w.processor = w.hf_model_type = w.dataset_cls = None
    w.tools = []
    w.reward_loop_worker_handles = None
    w.distillation_enabled = False
    return w


def test_groups_written_by_verls_own_trainer_and_agent_loop_are_sampled(tq, rollout,
                                                                       tmp_path) -> None:
    OmegaConf, NonTensorStack, TensorDict, al, agent_loop_tq, trainer_base, tu = _verl()
    uids = ["w0", "w1"]
    batch = TensorDict({"prompt_len": torch.tensor([3, 3])}, batch_size=[2])
    batch["uid"] = NonTensorStack(*uids)
    batch["index"] = NonTensorStack(0, 1)
    tu.assign_non_tensor_data(batch, "global_steps", STEP)

    class Trainer(trainer_base.PPOTrainer):      # the step hooks are not on the writer path
        def on_sample_end(self, *a, **k):
            pass

        def on_step_end(self, *a, **k):
            pass

    trainer = object.__new__(Trainer)
    trainer.trainer_mode, trainer.global_steps = "colocate_async", STEP
    trainer.agent_loop_manager = _Manager(_worker(OmegaConf, al, agent_loop_tq))
    assert trainer._submit_batch_to_rollout(batch) == 2           # verl writes everything

    listing = rollout.listing()
    assert {k: v["status"] for k, v in listing.items() if v.get("is_prompt")} == \
        {"w0": "finished", "w1": "finished"}
    assert sorted(k for k, v in listing.items() if not v.get("is_prompt")) == \
        [f"{u}_{s}_0" for u in uids for s in range(N_SESSIONS)]

    lake = tmp_path / "lake"
    buf = ReplayBufferAsync("colocate_async", {}, 8, "drop", {}, poll_interval=0.05,
                            lake_dir=lake)          # the default mirror: rewards, no tokens
    try:
        meta, metrics = buf.sample(global_steps=STEP, partition_id="train", batch_size=2)
        assert sorted(meta.keys) == sorted(f"{u}_{s}_0" for u in uids for s in range(N_SESSIONS))
        tags = dict(zip(meta.keys, meta.tags))
        assert tags["w1_2_0"]["response_len"] == 4 and tags["w1_2_0"]["prompt_len"] == 3
        assert tags["w0_0_0"]["min_global_steps"] == STEP - 1
        assert tags["w0_0_0"]["global_steps"] == STEP
        buf.flush()                                   # made by the adapter's thread
        assert "w0" not in rollout.listing()          # the selected prompt keys are cleared
    finally:
        buf.close()
    tq.kv_clear(keys=list(meta.keys), partition_id="train")      # the trainer's end of step
    # the lake holds each response's length (verl's `response_len` tag) and reward, no tokens
    rows = read_table(lake, "trajectories").to_pylist()
    assert sorted((r["uid"], r["session_id"], r["n_response_tokens"], r["reward"])
                  for r in rows) == [(u, s, 2 + s, float(s % 2))
                                     for u in uids for s in range(N_SESSIONS)]
    assert all(r["response_ids"] == [] for r in rows)
