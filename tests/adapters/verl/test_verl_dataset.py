"""`dataset_field` on the verl adapter (an addition: verl's groups have no dataset): the prompt
field verl's async trainer stores with each prompt key (``data_source``) names the group's
dataset, so per-dataset bounds judge each group by it; off by default, and a prompt without the
field (verl's sync trainer mode stores tags only) gets the default bound and a warning."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from pipeline.adapters.verl.dropin import ReplayBufferAsync
from pipeline.analysis.views import connect
from pipeline.errors import ConfigError
from tests.adapters.verl._harness import G, uids_of

pytestmark = pytest.mark.verl

BOUNDS = {"math": 2, "*": 3}


def _prompts_with_fields(tq, uids, gs, sources) -> None:
    """Prompt keys as verl's trainer writes them outside trainer_mode='sync': tags plus the
    batch's per-row fields (built by verl's own TensorDict helper, as its dataloader batch)."""
    import torch
    from verl.utils import tensordict_utils as tu
    batch = tu.get_tensordict({"input_ids": torch.zeros(len(uids), 3, dtype=torch.int64),
                               "data_source": np.array(sources, dtype=object),
                               "uid": np.array(uids, dtype=object)})
    tq.kv_batch_put(keys=list(uids), partition_id="train", fields=batch,
                    tags=[{"is_prompt": True, "status": "running", "global_steps": gs}
                          for _ in uids])


def _settle(rollout, groups) -> None:
    rollout.trajectories(groups)
    rollout.status([g.uid for g in groups], "finished")


def make(**kw):
    return ReplayBufferAsync("colocate_async", {}, BOUNDS, "drop", {}, poll_interval=0.05, **kw)


def _datasets(lake) -> dict:
    return dict(connect(lake).sql("select uid, dataset from groups").fetchall())


def test_each_group_is_held_to_its_data_sources_bound(tq, rollout, tmp_path):
    """At step 3 every group (dispatched at step 1) is at group span 3: over math's bound 2,
    exactly at the default 3 of `web`, which the mapping does not name."""
    _prompts_with_fields(tq, ["m", "w", "w2"], 1, ["math", "web", "web"])
    _settle(rollout, [G("m", 1), G("w", 1), G("w2", 1)])
    buf = make(dataset_field="data_source", lake_dir=tmp_path / "lake")
    meta, metrics = buf.sample(global_steps=3, partition_id="train", batch_size=2)
    assert uids_of(meta.keys) == ["w", "w2"]
    assert metrics["training/off_policy/evicted_samples"] == 1
    assert buf.last_batch.certificate.rows.column("bound").to_pylist() == [3] * 4
    buf.close()
    assert _datasets(tmp_path / "lake") == {"m": "math", "w": "web", "w2": "web"}


def test_by_default_no_field_is_read_and_every_group_has_the_default_bound(tq, rollout,
                                                                           tmp_path):
    _prompts_with_fields(tq, ["m", "w"], 1, ["math", "web"])
    _settle(rollout, [G("m", 1), G("w", 1)])
    buf = make(lake_dir=tmp_path / "lake")          # dataset_field off: as verl, no dataset
    meta, metrics = buf.sample(global_steps=3, partition_id="train", batch_size=2)
    assert uids_of(meta.keys) == ["m", "w"]              # both at the default bound 3
    assert metrics.get("training/off_policy/evicted_samples", 0) == 0
    buf.close()
    assert _datasets(tmp_path / "lake") == {"m": None, "w": None}


def test_a_prompt_without_the_field_gets_the_default_bound_and_a_warning(tq, rollout, caplog):
    rollout.groups([G("t", 1)])           # tags only: what trainer_mode='sync' writes
    _prompts_with_fields(tq, ["m"], 1, ["math"])
    _settle(rollout, [G("m", 1)])
    # the option may come in sampler_kwargs, as verl's custom-sampler hook passes it
    buf = ReplayBufferAsync("colocate_async", {}, BOUNDS, "drop",
                            {"dataset_field": "data_source"}, poll_interval=0.05)
    with caplog.at_level(logging.WARNING, logger="replaylake.verl"):
        meta, _ = buf.sample(global_steps=3, partition_id="train", batch_size=1)
    assert uids_of(meta.keys) == ["t"]      # no dataset: the default 3; m (math, 3 > 2) evicted
    assert buf.core.lookup("train", "t").dataset is None
    assert buf._mirrors["train"].datasets_unread == 1
    assert "1 prompt(s) of partition 'train' have no readable 'data_source' field" in caplog.text
    assert "['t']" in caplog.text
    buf.close()


@pytest.mark.parametrize("bad", ["", 3, ["data_source"]])
def test_a_bad_dataset_field_is_refused(bad):
    with pytest.raises(ConfigError, match=r"dataset_field=.*give the name of the prompt field"):
        make(dataset_field=bad)


@pytest.mark.parametrize("name", ["fsync", "reuse_siblings", "sync_refill_failed_groups"])
@pytest.mark.parametrize("bad", ["no", 0, "false"])
def test_a_yes_no_option_that_is_not_a_bool_is_refused(name, bad):
    """`bool("no")` is True: a YAML string or a number was read as its truth value (fsync on,
    sibling reuse on); the option is refused by name instead. Unset (None) stays off."""
    with pytest.raises(ConfigError, match=rf"{name}={bad!r} must be True or False"):
        ReplayBufferAsync("colocate_async", {}, 8, "drop", {name: bad}, refill_fn=lambda n: n)
    buf = ReplayBufferAsync("colocate_async", {}, 8, "drop", {name: None}, refill_fn=lambda n: n)
    assert getattr(buf, name) in (None, False)
    buf.close()
