"""The honest false-positive rate of every check after admission, per reason: summed from
the collectors' counts, every reason listed (zeros too), in the swarm's closing table and
the attack matrix's no-attack runs."""

from __future__ import annotations

from sapo_async.experiment.attack.spec import AttackSpec, RunMeasure
from sapo_async.experiment.attack.summary import markdown_table, summarise
from sapo_async.node.report import drop_rates
from sapo_async.wire.reasons import AFTER_ADMISSION


def test_drop_rates_sum_the_collectors_and_list_every_check_after_admission() -> None:
    rates = drop_rates([(300, {"too_long": 2}), (100, {"too_long": 1, "implausible": 1})])
    assert rates.admitted == 400
    assert list(rates.dropped) == [str(r) for r in AFTER_ADMISSION]
    assert rates.dropped["too_long"] == 3
    assert rates.dropped["token_mismatch"] == 0
    assert rates.rate("too_long") == 3 / 400
    assert rates.rate("token_mismatch") == 0.0
    assert drop_rates([]).rate("too_long") == 0.0  # nothing admitted: no rate, no error


def _run(defences: bool, config: str, dropped: dict[str, int], admitted: int) -> RunMeasure:
    return RunMeasure(
        "none",
        defences,
        0,
        config,
        honest=[0, 1],
        rewards=[[0.5], [0.5]],
        round_s=[1.0],
        dropped=dropped,
        admitted=admitted,
        honest_groups_judged=admitted,
        honest_groups_dropped=sum(dropped.values()),
    )


def test_attack_summary_reports_each_checks_false_positives_in_the_no_attack_runs() -> None:
    spec = AttackSpec(attacks=(), seeds=(0,), local=2, external=2)
    runs = [
        _run(False, "2/2", {}, 50),
        # duplicate is an admission label, not a check after admission: not counted here.
        _run(True, "2/2", {"too_long": 2, "duplicate": 5}, 80),
        _run(False, "4/0", {}, 0),
    ]
    summary = summarise(spec, runs, seconds=1.0)
    after = summary["false_positives_after_admission"]
    assert after["admitted"] == 80
    assert after["dropped"]["too_long"] == 2
    assert after["dropped"]["token_mismatch"] == 0
    assert "duplicate" not in after["dropped"]
    assert after["rate"]["too_long"] == 2 / 80
    table = markdown_table(summary)
    assert "| `token_mismatch` | 0 | 0.0000 |" in table
    assert "| `too_long` | 2 | 0.0250 |" in table
