import math

import pytest

from sapo_async.experiment.report import (
    cumulative_reward,
    markdown_table,
    moving_average,
    plot_traces,
    rounds_to_threshold,
)


def test_cumulative_reward_sums_nodes_and_rounds():
    assert cumulative_reward([[0.1, 0.2], [0.3, 0.4]]) == pytest.approx(1.0)


def test_moving_average_is_trailing_with_short_start():
    assert moving_average([1, 2, 3, 4], 2) == [1.0, 1.5, 2.5, 3.5]
    with pytest.raises(ValueError, match="window"):
        moving_average([1.0], 0)


def test_rounds_to_threshold_uses_swarm_mean_moving_average():
    trace = [[0.0] * 5 + [1.0] * 10, [0.0] * 5 + [1.0] * 10]
    assert rounds_to_threshold(trace, 0.5, window=4) == 7
    assert rounds_to_threshold(trace, 2.0, window=4) is None


def test_markdown_table_reports_ratio_to_baseline_and_paper():
    results = {"8/0": {0: [[1.0, 1.0]]}, "4/4": {0: [[2.0, 2.0]]}}
    table = markdown_table(results, threshold=0.5)
    assert "| 4/4 | 0 | 4.00 | 2.00x |" in table
    assert "1093.31" in table
    assert "1.95x" in table  # the paper's 4/4 over 8/0


def test_plot_writes_a_png(tmp_path):
    out = tmp_path / "fig.png"
    plot_traces({"8/0": [[0.0, 0.1, 0.2]], "4/4": [[0.1, 0.3, math.pi / 10]]}, out, title="t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_goal_over_seeds_is_met_missed_or_undecided_by_the_interval_not_the_mean():
    from sapo_async.experiment.report import goal_over_seeds, goal_text

    # Issue 23's inject seeds (honest reward on / no attack): the mean is under 0.9, but
    # the spread puts 0.9 inside the interval (Student's t, 4 degrees of freedom: 2.776).
    inject = goal_over_seeds([0.83, 0.60, 0.92, 0.58, 0.94], 0.9)
    assert inject["mean"] == pytest.approx(0.774)
    lo, hi = inject["ci95"]
    half = 2.776 * 0.173147 / math.sqrt(5)  # sample sd of the five
    assert (lo, hi) == (
        pytest.approx(0.774 - half, abs=1e-4),
        pytest.approx(0.774 + half, abs=1e-4),
    )
    assert inject["verdict"] == "undecided"
    # At this spread, the smallest seed count whose interval clears 0.9 (t(9) = 2.262:
    # 2.262 * 0.1731 / sqrt(10) = 0.124 < 0.126; t(8) = 2.306 over sqrt(9): 0.133).
    assert inject["seeds_to_decide"] == 10
    assert "0.77 [0.56, 0.99] over 5 seeds: undecided, about 10 seeds" in goal_text(inject)
    assert goal_over_seeds([0.95, 0.97, 0.96], 0.9)["verdict"] == "met"
    assert goal_over_seeds([0.5, 0.52, 0.48], 0.9)["verdict"] == "missed"
    assert goal_over_seeds([0.95, 0.97, 0.96], 0.9)["seeds_to_decide"] is None
    one = goal_over_seeds([1.2], 0.9)
    assert (one["verdict"], one["ci95"]) == ("undecided", None)
    assert goal_text(one) == "1.20 (1 seed: undecided)"
