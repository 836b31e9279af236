"""Where `bench ray` says the single actor saturates: the first producer count whose next count
adds less than 10 % throughput (no Ray needed: the rule is a function of the sweep's rows)."""
from __future__ import annotations

import pytest

from jobs.bench.ray import check_producers, saturation, saturation_line
from pipeline.errors import ConfigError


def _rows(*tput: float) -> list[dict]:
    return [{"producers": p, "trajectories_per_s": t} for p, t in zip((1, 2, 4, 8), tput)]


def test_the_first_step_under_ten_percent_is_the_saturation_point():
    sat = saturation(_rows(100, 200, 219.9, 400))      # 2 -> 4 adds 9.95 %: saturated at 2
    assert sat["producers"] == 2
    assert sat["peak_producers"] == 8 and sat["peak_trajectories_per_s"] == 400
    assert sat["growth"][4] == pytest.approx(0.0995)
    assert "saturates at 2 producer processes" in saturation_line(sat)


def test_exactly_ten_percent_still_counts_as_growing():
    assert saturation(_rows(100, 200, 220, 242))["producers"] is None
    assert saturation(_rows(100, 200, 220, 241.9))["producers"] == 4
    assert "did not saturate" in saturation_line(saturation(_rows(100, 200, 220, 242)))


def test_a_drop_is_saturation_and_the_rows_are_read_in_count_order():
    rows = list(reversed(_rows(100, 150, 120, 130)))
    assert saturation(rows)["producers"] == 2
    assert saturation(rows)["growth"] == pytest.approx({2: 0.5, 4: -0.2, 8: 1 / 12})


def test_producer_counts_that_do_not_split_the_groups_into_rounds_are_refused():
    check_producers((1, 2, 4, 8), 20)
    with pytest.raises(ConfigError, match=r"bad: \[3\]"):
        check_producers((1, 3), 20)          # 1280 groups are not rounds of 4 for 3 producers
    with pytest.raises(ConfigError, match="--batches >= 2"):
        check_producers((1,), 1)
    with pytest.raises(ConfigError, match=r"bad: \[0\]"):
        check_producers((0, 1), 20)
