"""The demo's truncated importance weights (`--tis-cap C`): the loss, the flag, and a real run that
reports them in its summary."""
from __future__ import annotations

import io
import json
import math
from dataclasses import replace

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from jobs.cli import app
from jobs.demo.config import DemoConfig
from jobs.demo.main import run
from jobs.demo.policy import DIGIT0, Policy, grpo_loss
from jobs.demo.trainer import tis_loss
from pipeline import ConfigError


def _tensors(policy: Policy, behind: float) -> dict[str, torch.Tensor]:
    """Two rows of digits; the rollout log-probs are the policy's own minus ``behind`` (so the
    importance ratio pi_old / pi_rollout is exp(behind) on every response token)."""
    ids = torch.tensor([[1, DIGIT0 + 3, DIGIT0 + 4, DIGIT0 + 5],
                        [1, DIGIT0 + 1, DIGIT0 + 2, DIGIT0 + 2]])
    mask = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1]])
    with torch.no_grad():
        own = policy.token_log_probs(ids)
    return {"input_ids": ids, "response_mask": mask,
            "rollout_log_probs": (own - behind) * mask,
            "token_staleness": torch.tensor([[0, 0, 1, 1], [0, 0, 0, 2]])}


def test_on_policy_tokens_weigh_one_and_give_the_plain_grpo_loss() -> None:
    torch.manual_seed(0)
    policy = Policy()
    t = _tensors(policy, 0.0)
    adv = torch.tensor([1.0, -0.5])
    loss, stats = tis_loss(policy, t, adv, 0.2, 2.0)
    plain, _ = grpo_loss(policy, t, adv, 0.2)
    assert float(loss.detach()) == pytest.approx(float(plain.detach()), abs=1e-6)
    assert stats["train/tis_weight_mean"] == pytest.approx(1.0)
    assert stats["train/tis_truncated_fraction"] == 0.0
    assert stats["train/token_staleness_mean"] == pytest.approx(1.0)     # (1 + 1 + 0 + 2) / 4


@pytest.mark.parametrize(("behind", "weight", "truncated"),
                         [(math.log(1.5), 1.5, 0.0), (math.log(3.0), 2.0, 1.0)])
def test_weights_are_the_ratio_up_to_the_cap_and_scale_the_gradient(behind: float, weight: float,
                                                                   truncated: float) -> None:
    torch.manual_seed(0)
    policy = Policy()
    adv = torch.tensor([1.0, -0.5])
    loss, stats = tis_loss(policy, _tensors(policy, behind), adv, 0.2, 2.0)
    assert stats["train/tis_weight_mean"] == pytest.approx(weight, rel=1e-5)
    assert stats["train/tis_truncated_fraction"] == truncated
    loss.backward()
    weighted = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad()
    base, _ = tis_loss(policy, _tensors(policy, 0.0), adv, 0.2, 2.0)
    base.backward()
    for g, b in zip(weighted, (p.grad for p in policy.parameters())):
        assert torch.allclose(g, weight * b, rtol=1e-4, atol=1e-7)   # a detached weight


@pytest.mark.parametrize("cap", [0, -1.0, float("inf"), float("nan")])
def test_a_cap_that_is_not_a_positive_number_is_refused(cap: float) -> None:
    with pytest.raises(ConfigError, match="tis_cap="):
        DemoConfig(tis_cap=cap)


def test_the_flag_takes_a_number_or_none() -> None:
    res = CliRunner().invoke(app, ["demo", "--tis-cap", "zero"])
    assert res.exit_code != 0 and "--tis-cap 'zero'" in res.output


def test_a_run_with_truncated_weights_trains_and_reports_them(tmp_path) -> None:
    out = tmp_path / "run"
    console = Console(file=io.StringIO(), width=80)
    run(replace(DemoConfig(), steps=4, tis_cap=2.0), out=out, use_wandb=False, console=console)
    summary = json.loads((out / "summary.json").read_text())
    tis = summary["tis"]
    assert summary["steps"] == 4 and tis["cap"] == 2.0
    assert 0.0 < tis["tis_weight_mean"] <= 2.0
    assert 0.0 <= tis["tis_truncated_fraction"] <= 1.0
    assert tis["token_staleness_mean"] >= 0.0
    assert "Truncated IS (cap 2):" in console.file.getvalue()
    assert json.loads((out / "config.json").read_text())["tis_cap"] == 2.0


def test_a_run_without_the_cap_reports_no_weights(tmp_path) -> None:
    out = tmp_path / "run"
    console = Console(file=io.StringIO(), width=80)
    run(replace(DemoConfig(), steps=2), out=out, use_wandb=False, console=console)
    assert "tis" not in json.loads((out / "summary.json").read_text())
    assert "Truncated IS" not in console.file.getvalue()
