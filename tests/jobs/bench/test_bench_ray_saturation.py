"""Where `bench ray` says the single actor saturates: the first producer count that no larger
count beats by 10 % or more (no Ray needed: the rule is a function of the sweep's rows)."""
from __future__ import annotations

import pytest

from jobs.bench.ray import check_producers, saturation, saturation_line
from pipeline.errors import ConfigError


def _rows(*tput: float) -> list[dict]:
    return [{"producers": p, "trajectories_per_s": t} for p, t in zip((1, 2, 4, 8), tput)]


def test_the_first_count_no_larger_count_beats_by_ten_percent_is_the_saturation_point():
    sat = saturation(_rows(100, 200, 219.9, 210))      # 4 and 8 add at most 9.95 % over 2
    assert sat["producers"] == 2
    assert sat["peak_producers"] == 4 and sat["peak_trajectories_per_s"] == 219.9
    assert sat["growth"] == pytest.approx({2: 1.0, 4: 0.0995, 8: 210 / 219.9 - 1})
    assert "saturates at 2 producer processes" in saturation_line(sat)


def test_exactly_ten_percent_still_counts_as_growing():
    assert saturation(_rows(100, 200, 220, 242))["producers"] is None
    assert saturation(_rows(100, 200, 220, 241.9))["producers"] == 4
    assert "did not saturate" in saturation_line(saturation(_rows(100, 200, 220, 242)))


def test_a_dip_is_not_saturation_while_a_larger_count_still_gains():
    assert saturation(_rows(100, 95, 100, 130))["producers"] is None     # 8 adds 30 % over 1
    rows = list(reversed(_rows(100, 150, 120, 130)))                      # read in count order
    assert saturation(rows)["producers"] == 2
    assert saturation(rows)["growth"] == pytest.approx({2: 0.5, 4: -0.2, 8: 1 / 12})
    assert saturation(_rows(100))["producers"] is None                   # nothing to compare


def test_producer_counts_that_do_not_split_the_groups_into_rounds_are_refused():
    check_producers((1, 2, 4, 8), 20)
    with pytest.raises(ConfigError, match=r"bad: \[3\]"):
        check_producers((1, 3), 20)          # 1280 groups are not rounds of 4 for 3 producers
    with pytest.raises(ConfigError, match="--batches >= 2"):
        check_producers((1,), 1)
    with pytest.raises(ConfigError, match=r"bad: \[0\]"):
        check_producers((0, 1), 20)


def test_one_producer_count_is_not_judged_and_says_what_to_give() -> None:
    line = saturation_line(saturation(_rows(100)))
    assert line.startswith("saturation not judged: one producer count measured (100 "
                           "trajectories/s with 1 producer process)")
    assert "--producers two counts or more" in line and "; )" not in line
