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
