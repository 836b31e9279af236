"""The custom-sampler hook: `ReplaylakeSampler` built by verl's own trainer code
(`PPOTrainer._build_replay_buffer`, which loads `trainer.v1.sampler.custom_sampler.path/name` with
`load_extern_type` and passes only the base keywords), and compared with the built-in buffer the
same trainer code builds from the equivalent `algorithm.filter_groups` settings.
"""
from __future__ import annotations

import types
import warnings

import pytest
from omegaconf import OmegaConf

from pipeline.adapters.verl.dropin import ReplayBufferAsync, ReplaylakeSampler
from pipeline.errors import ConfigError
from tests.adapters.verl._harness import G, assert_same, run_both

pytestmark = [pytest.mark.verl, pytest.mark.filterwarnings("ignore::FutureWarning")]

HOOK = {"path": "pkg://pipeline.adapters.verl", "name": "ReplaylakeSampler"}


def trainer_config(mode: str, custom: bool, **sampler_kwargs) -> OmegaConf:
    """The slice of verl's ppo_trainer.yaml that `_build_replay_buffer` reads."""
    return OmegaConf.create({
        "data": {"train_batch_size": 2, "gen_batch_size": 1},
        "algorithm": {"filter_groups": {"enable": not custom, "metric": "acc",
                                        "max_num_gen_batches": 0, "max_inflight_gen_batches": 2}},
        "reward": {"reward_model": {"enable": False, "enable_resource_pool": False}},
        "trainer": {"v1": {
            "trainer_mode": mode, mode: {"parameter_sync_step": 1},
            "sampler": {"max_off_policy_threshold": 3, "max_off_policy_strategy": "drop",
                        "sync_refill_failed_groups": False,
                        "custom_sampler": HOOK if custom else {"path": None, "name": None},
                        "sampler_kwargs": sampler_kwargs}}},
    })


def build_with_verl(mode: str, custom: bool, refill, **sampler_kwargs):
    """verl's own `_build_replay_buffer` on a stand-in trainer (config, mode, refill_fn)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    fake = types.SimpleNamespace(config=trainer_config(mode, custom, **sampler_kwargs),
                                 trainer_mode=mode, _add_prompts_to_generate=refill)
    fake._resolve_filter_groups_metric = lambda: PPOTrainer._resolve_filter_groups_metric(fake)
    return PPOTrainer._build_replay_buffer(fake)


HOOK_KWARGS = {"filter_groups_metric": "acc", "train_batch_size": "${data.train_batch_size}",
               "gen_batch_size": "${data.gen_batch_size}", "max_inflight_gen_batches": 2,
               "poll_interval": 0.05}


def test_verl_loads_the_hook_class_and_it_picks_async_for_separate_async(tq):
    buf = build_with_verl("separate_async", True, print, **HOOK_KWARGS)
    assert type(buf) is ReplaylakeSampler and buf.preset == "async"
    assert buf.filter_groups_metric == "acc" and buf.poll_interval == 0.05
    assert buf.train_batch_size == 2                       # the interpolation was resolved
    for method in ("wait_for_sampleable", "get_sampleable_count"):   # verl's hybrid check
        assert hasattr(buf, method)
    assert buf.core.config.stale.threshold == 3 and buf.core.config.preset == "async"


def test_hook_picks_sync_for_sync_mode_with_dapo_from_sampler_kwargs(tq):
    buf = build_with_verl("sync", True, print, **HOOK_KWARGS)
    assert buf.preset == "sync" and buf.core.config.refill.max_inflight_gen_batches == 2


def test_hook_rejects_an_unknown_sampler_kwarg(tq):
    with pytest.raises(ConfigError, match="filter_group_metric"):
        build_with_verl("colocate_async", True, print, filter_group_metric="acc")


def test_direct_class_takes_options_from_sampler_kwargs_too(tq):
    cfg = OmegaConf.create({"filter_groups_metric": "reward"})
    buf = ReplayBufferAsync("colocate_async", {}, 4, "wait", cfg, refill_fn=print)
    assert buf.filter_groups_metric == "reward"
    with pytest.raises(ConfigError, match="given twice"):
        ReplayBufferAsync("colocate_async", {}, 4, "wait", cfg, refill_fn=print,
                          filter_groups_metric="acc")


@pytest.mark.parametrize("mode", ["colocate_async", "sync"])
def test_hook_built_by_verl_matches_the_builtin_buffer_built_by_verl(tq, mode):
    """Same trainer code, same scenario: the built-in class with algorithm.filter_groups vs our
    hook class with the same options in sampler_kwargs."""
    def scenario(ctx):
        def refill(n):
            call = len(ctx.refill_log) + 1
            ctx.refill_log.append(n)
            ctx._refills.append(n)
            ctx.rollout.groups([G(f"r{call}x{i}", 10 * call + i) for i in range(n)])
            return n
        ctx.rollout.groups([G("old", 1), G("z", 2, rewards=[1, 1]), G("f", 3, "failure"),
                            G("a", 4), G("b", 5, rewards=[0.0, 1.0, 0.0])])
        buf = build_with_verl(mode, ctx.impl == "ours", refill, **HOOK_KWARGS)
        if ctx.impl == "verl":
            buf.poll_interval = 0.05
        ctx.sample(buf, 5, 2)
        ctx.rollout.groups([G("c", 6)])
        ctx.sample(buf, 6, 1)
    assert_same(*run_both(tq, scenario))


def test_direct_replacement_of_verls_classes_gets_every_builtin_keyword(tq, monkeypatch):
    """Way 1: swap the classes verl's trainer module builds; verl then passes all its keywords
    (filter metric from algorithm.filter_groups, batch sizes, in-flight limit)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import verl.trainer.ppo.v1.trainer_base as tb
    import pipeline.adapters.verl as ours
    monkeypatch.setattr(tb, "ReplayBuffer", ours.ReplayBuffer)
    monkeypatch.setattr(tb, "ReplayBufferAsync", ours.ReplayBufferAsync)
    sync = build_with_verl("sync", False, print, lake_dir=None)
    assert type(sync) is ours.ReplayBuffer and sync.filter_groups_metric == "acc"
    assert (sync.train_batch_size, sync.gen_batch_size, sync.max_inflight_gen_batches) == (2, 1, 2)
    asyn = build_with_verl("separate_async", False, print)
    assert type(asyn) is ours.ReplayBufferAsync and asyn.core.config.preset == "async"
