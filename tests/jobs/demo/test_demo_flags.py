"""The demo's flags are its configuration's fields: each flag's default and help come from the
field, a field that may be None takes 'none', and the words of a flag are checked as the field."""
from __future__ import annotations

from dataclasses import fields

import pytest
from typer.core import TyperOption
from typer.testing import CliRunner

from jobs import cli
from jobs.demo import flags
from jobs.demo.config import DemoConfig
from pipeline import ConfigError


def options() -> dict[str, TyperOption]:
    cmd = cli.build("demo")
    return {p.name: p for p in cmd.params if isinstance(p, TyperOption) and p.name != "help"}


def test_every_flag_is_a_config_field_marked_as_one_with_its_default_and_help():
    marked = {f.name: f for f in fields(DemoConfig) if "flag" in f.metadata}
    shown = options()
    # besides the configuration: where the run goes, W&B, resuming a run directory, and Ray
    assert set(shown) == {*marked, "out", "wandb", "resume", "reuse", "ray"}
    assert {"n", "lr", "workers"}.isdisjoint(shown)     # knobs the command line does not offer
    for name, f in marked.items():
        default = "none" if f.default is None else f.default
        assert shown[name].default in (default, str(default)), name
        assert shown[name].help == f.metadata["flag"], name


def test_the_flags_defaults_make_the_default_configuration():
    defaults = {p.name: p.default for p in flags.parameters()}
    assert flags.config(defaults) == DemoConfig()


def test_none_or_off_turns_a_field_that_may_be_none_off():
    cfg = flags.config({"threshold": "none", "filter_metric": "Off", "steps": 5})
    assert (cfg.threshold, cfg.filter_metric, cfg.steps) == (None, None, 5)
    assert flags.config({"threshold": "3"}).threshold == 3


def test_a_flag_that_is_not_a_number_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"^--threshold 'two': give an integer or 'none'"):
        flags.config({"threshold": "two"})


@pytest.mark.parametrize("flag, value, said", [
    ("--strategy", "bogus", "--strategy 'bogus': use one of drop, wait, admit, mask"),
    ("--threshold", "-1", "--threshold -1: "),
])
def test_the_buffers_refusal_of_a_flag_names_the_flag(tmp_path, flag, value, said):
    """The buffer's own checks run before anything is written; their errors name the demo's
    flag (they said `Invalid max off policy strategy: max_off_policy_strategy='bogus'`)."""
    from typer.testing import CliRunner

    from jobs.cli import app
    out = CliRunner().invoke(app, ["demo", "--steps", "2", "--no-wandb", "--out",
                                   str(tmp_path / "run"), flag, value])
    assert out.exit_code == 2 and said in out.output, out.output
    assert not (tmp_path / "run").exists()


def test_ray_with_resume_is_refused_naming_the_flag_before_anything_starts(tmp_path):
    res = CliRunner().invoke(cli.app, ["demo", "--ray", "--resume", str(tmp_path / "nowhere")])
    assert res.exit_code != 0
    assert "--resume does not work with --ray" in res.output
    assert list(tmp_path.iterdir()) == []               # nothing written


def test_the_ray_flag_is_in_the_demo_help():
    help_text = options()["ray"].help
    assert "Ray actors" in help_text and "--resume" in help_text
