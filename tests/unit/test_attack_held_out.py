"""The attack summary's held-out section and the runs ``--defended-only`` selects."""

from __future__ import annotations

import pytest

from sapo_async.experiment.attack.held_out import held_out, held_out_lines
from sapo_async.experiment.attack.runner import jobs_of
from sapo_async.experiment.attack.spec import AttackSpec, RunMeasure
from sapo_async.experiment.attack.summary import markdown_table, summarise

SPEC = AttackSpec(
    attacks=("inject",),
    seeds=(0, 1, 2),
    nodes=4,
    attackers=2,
    local=1,
    external=1,
    eval_questions=32,
)


def _run(attack: str, on: bool, seed: int, evals: list[float]) -> RunMeasure:
    honest = [0, 1] if attack != "none" else [0, 1, 2, 3]
    return RunMeasure(attack, on, seed, "1/1", honest, rewards=[[0.1] * 3] * 4, eval_rewards=evals)


def test_held_out_ratio_is_the_attacked_nodes_mean_over_the_same_nodes_without_attack():
    runs = [
        _run("none", True, 0, [0.2, 0.4]),
        _run("inject", True, 0, [0.15, 0.15]),
        _run("none", True, 1, [0.1, 0.1]),
        _run("inject", True, 1, [0.1, 0.1]),
        _run("none", True, 2, [0.2, 0.2]),  # seed 2's attack run is missing: not counted
    ]
    section = held_out(SPEC, runs)
    row = section["attacks"]["inject"]
    assert set(row["seeds"]) == {"0", "1"}
    assert row["seeds"]["0"]["honest_eval_ratio_on_same"] == pytest.approx(0.5)
    assert row["seeds"]["1"]["honest_eval_ratio_on_same"] == pytest.approx(1.0)
    assert row["honest_eval_ratio_on_same"] == pytest.approx(0.75)
    assert row["honest_eval_ratio_on_same_goal"]["seeds"] == 2
    # --defended-only has no undefended no-attack run: that ratio is left out, not faked.
    assert "honest_eval_ratio_on" not in row
    assert "honest_eval_ratio_on_goal" not in row
    assert section["eval_questions"] == 32
    (line,) = [x for x in held_out_lines(section) if x]
    assert "`inject` 0.125 against 0.200" in line
    assert "over no attack (off)" not in line


def test_held_out_also_compares_with_the_undefended_no_attack_run_where_there_is_one():
    runs = [
        _run("none", True, 0, [0.2, 0.2]),
        _run("none", False, 0, [0.4, 0.4]),
        _run("inject", True, 0, [0.2, 0.2]),
    ]
    row = held_out(SPEC, runs)["attacks"]["inject"]
    assert row["honest_eval_ratio_on"] == pytest.approx(0.5)
    assert row["honest_eval_ratio_on_same"] == pytest.approx(1.0)
    assert "over no attack (off) 0.50" in held_out_lines(held_out(SPEC, runs))[1]


def test_runs_without_a_held_out_evaluation_give_an_empty_section_and_no_line():
    runs = [_run("none", True, 0, []), _run("inject", True, 0, [])]
    section = held_out(SPEC, runs)
    assert section["attacks"] == {}
    assert held_out_lines(section) == []


def test_a_summary_of_defended_only_runs_has_the_held_out_section_and_a_table():
    runs = [_run("none", True, s, [0.2, 0.2]) for s in (0, 1)] + [
        _run("inject", True, s, [0.1, 0.3]) for s in (0, 1)
    ]
    summary = summarise(SPEC, runs, seconds=0.0)
    assert summary["attacks"] == {}  # no defences-off runs: no payload row
    assert summary["held_out"]["attacks"]["inject"]["honest_eval_ratio_on_same"] == 1.0
    assert "Held-out reward after the last round" in markdown_table(summary)


def test_a_defended_only_summary_has_the_reward_ratio_it_was_run_for():
    # Before the defended section a --defended-only matrix had no training-reward ratio
    # and no count of attacker groups trained: the attacks rows need the off runs too.
    def run(
        attack: str,
        seed: int,
        honest_reward: float,
        trained: dict[str, int],
        payload: tuple[float, ...] = (0.0,) * 5,
    ) -> RunMeasure:
        honest = [0, 1] if attack != "none" else [0, 1, 2, 3]
        rewards = [[honest_reward] * 4] * 2 + [[0.5] * 4] * 2
        return RunMeasure(
            attack,
            True,
            seed,
            "1/1",
            honest,
            rewards=rewards,
            trained_external=trained,
            payload=list(payload),
        )

    runs = [
        run("none", 0, 0.2, {"honest": 30}),
        # The payload rate is read over the last fifth of the rounds: here the last one.
        run("inject", 0, 0.1, {"attacker": 27, "honest": 7}, (0.9, 0.0, 0.0, 0.0, 0.25)),
        run("none", 1, 0.1, {"honest": 30}),
        run("inject", 1, 0.1, {"attacker": 30, "honest": 4}, (0.0, 0.0, 0.0, 0.0, 0.75)),
        run("none", 2, 0.1, {"honest": 30}),  # seed 2's attack run is missing: not counted
    ]
    summary = summarise(SPEC, runs, seconds=0.0)
    row = summary["defended"]["inject"]
    assert set(row["seeds"]) == {"0", "1"}
    assert row["seeds"]["0"]["honest_reward_on"] == pytest.approx(0.8)
    assert row["seeds"]["0"]["honest_reward_no_attack_on"] == pytest.approx(1.6)
    assert row["honest_reward_ratio_on_same"] == pytest.approx(0.75)
    assert row["honest_reward_ratio_on_same_goal"]["seeds"] == 2
    assert (row["trained_from_attackers_on"], row["trained_from_honest_on"]) == (57, 11)
    assert "trained 57 attacker groups and 11 honest ones" in markdown_table(summary)
    # The payload with the defences on, which a defended-only matrix is also run for.
    assert row["seeds"]["0"]["asr_on"] == pytest.approx(0.25)
    assert row["asr_on"] == pytest.approx(0.5)
    assert "the attack's measure with the defences on 0.500" in markdown_table(summary)


def test_the_defended_section_counts_what_the_records_left_out_and_none_if_not_kept():
    def run(attack: str, seed: int, left_out: dict[str, dict[str, int]] | None) -> RunMeasure:
        honest = [0, 1] if attack != "none" else [0, 1, 2, 3]
        return RunMeasure(
            attack, True, seed, "1/1", honest, rewards=[[0.1] * 4] * 4, left_out=left_out
        )

    counted = [
        run("none", 0, {"honest": {"stock_lead": 2}}),
        run("inject", 0, {"attacker": {"stock_lead": 9, "after_answer": 3}}),
        run("none", 1, {}),
        run("inject", 1, {"attacker": {"after_answer": 4}, "honest": {"after_answer": 1}}),
    ]
    row = summarise(SPEC, counted, seconds=0.0)["defended"]["inject"]
    assert row["seeds"]["0"]["left_out_from_attackers_on"] == 12
    assert row["left_out_from_attackers_on"] == 16
    assert row["left_out_from_honest_on"] == 1
    assert row["left_out_from_honest_no_attack_on"] == 2
    text = markdown_table(summarise(SPEC, counted, seconds=0.0))
    assert "left out before judging 16 of the attackers' and 1 of honest peers'" in text
    # A run recorded before the count was kept reads None, not a count of 0.
    old = [*counted[:2], run("none", 1, None), counted[3]]
    row = summarise(SPEC, old, seconds=0.0)["defended"]["inject"]
    assert row["seeds"]["0"]["left_out_from_honest_no_attack_on"] == 2
    assert row["seeds"]["1"]["left_out_from_honest_no_attack_on"] is None
    assert row["left_out_from_honest_no_attack_on"] is None
    assert "left out before judging" not in markdown_table(summarise(SPEC, old, seconds=0.0))


def test_defended_only_runs_each_attack_defended_and_the_no_attack_runs_of_the_sharing_gain():
    # Issue 57: every matrix records sharing_gain_on and _off, so a defended-only one also
    # runs no attack with the defences off and B/0 (not each attack undefended).
    spec = AttackSpec(attacks=("inject", "tokens"), seeds=(0, 1))
    cells = [
        (attack, on, seed, config, nodes)
        for _, attack, on, seed, config, nodes in jobs_of(spec, defended_only=True)
    ]
    honest = spec.nodes - spec.attackers
    assert cells == [
        cell
        for seed in (0, 1)
        for cell in (
            ("none", True, seed, (2, 2), None),
            ("none", False, seed, (2, 2), None),
            ("none", False, seed, (4, 0), None),
            ("inject", True, seed, (2, 2), None),
            ("tokens", True, seed, (2, 2), None),
            # The honest nodes alone, defended: what the reward goal is read against.
            ("none", True, seed, (2, 2), honest),
        )
    ]
    # The full matrix: no attack on, off and B/0, each attack off and on, the honest-only
    # control off and on.
    assert len(jobs_of(spec)) == 2 * (3 + 2 * 2 + 2)


def test_the_reward_goal_is_read_over_the_honest_nodes_own_defended_swarm_where_it_ran():
    # Every attack refused before any group was trained left the honest nodes 0.48 of the
    # no-attack run (docs/results/attack-real-evidence): the two attackers' honest
    # counterparts were missing, not harm done. Over the honest nodes' own swarm it is 1.
    def run(attack: str, seed: int, config: str, reward: float) -> RunMeasure:
        nodes = 2 if config.endswith("@2") else 4
        honest = [0, 1] if attack != "none" else list(range(nodes))
        return RunMeasure(attack, True, seed, config, honest, rewards=[[reward] * 4] * nodes)

    runs = [
        cell
        for seed, alone in ((0, 0.1), (1, 0.11))
        for cell in (
            run("none", seed, "1/1", 0.2),
            run("inject", seed, "1/1", 0.1),
            run("none", seed, "1/1@2", alone),
        )
    ]
    summary = summarise(SPEC, runs, seconds=0.0)
    row = summary["defended"]["inject"]
    assert row["honest_reward_ratio_on_same"] == pytest.approx(0.5)
    assert row["seeds"]["0"]["honest_reward_ratio_on_honest_only_same"] == pytest.approx(1.0)
    assert row["honest_reward_ratio_on_honest_only_same"] == pytest.approx((1 + 1 / 1.1) / 2)
    tuning = summary["sets"]["tuning"]["attacks"]["inject"]
    assert tuning["honest_reward_goal_metric"] == "honest_reward_ratio_on_honest_only_same"
    assert tuning["honest_reward_goal_verdict"] == "undecided"  # 1.0 and 0.91: t wide
    assert tuning["honest_reward_ratio_on_same_verdict"] == "missed"
    assert "over the honest nodes' own swarm" in markdown_table(summary)
    # Without that swarm the goal falls back to the defended no-attack run, and says so.
    bare = summarise(SPEC, [r for r in runs if r.config == "1/1"], seconds=0.0)
    row = bare["sets"]["tuning"]["attacks"]["inject"]
    assert row["honest_reward_goal_metric"] == "honest_reward_ratio_on_same"
    assert row["honest_reward_goal_verdict"] == "missed"
    assert "honest_reward_ratio_on_honest_only_same" not in bare["defended"]["inject"]


def test_held_out_reward_is_also_compared_with_the_honest_nodes_own_defended_swarm():
    runs = [
        _run("none", True, 0, [0.4, 0.4, 0.4, 0.4]),
        _run("inject", True, 0, [0.2, 0.2]),
        RunMeasure("none", True, 0, "1/1@2", [0, 1], rewards=[[0.1]] * 2, eval_rewards=[0.25] * 2),
    ]
    row = held_out(SPEC, runs)["attacks"]["inject"]
    assert row["honest_eval_ratio_on_same"] == pytest.approx(0.5)
    assert row["honest_eval_ratio_on_honest_only_same"] == pytest.approx(0.8)
    assert "own swarm (on) 0.80" in held_out_lines(held_out(SPEC, runs))[1]
    # A control recorded when it evaluated node 0 only is left out, not an IndexError.
    runs[2].eval_rewards = [0.25]
    assert "honest_eval_ratio_on_honest_only_same" not in held_out(SPEC, runs)["attacks"]["inject"]


def test_a_defended_only_matrix_has_both_sharing_gains():
    def run(attack: str, on: bool, config: str, reward: float) -> RunMeasure:
        honest = [0, 1] if attack != "none" else [0, 1, 2, 3]
        return RunMeasure(attack, on, 0, config, honest, rewards=[[reward] * 3] * 4)

    spec = AttackSpec(attacks=("inject",), seeds=(0,), nodes=4, attackers=2, local=1, external=1)
    cells = {(a, on, c) for _, a, on, _, c, _ in jobs_of(spec, defended_only=True)}
    rewards = {("none", True, (1, 1)): 0.3, ("none", False, (1, 1)): 0.4}
    runs = [
        run(a, on, f"{c[0]}/{c[1]}", rewards.get((a, on, c), 0.2)) for a, on, c in sorted(cells)
    ]
    summary = summarise(spec, runs, seconds=0.0)
    assert summary["sharing_gain_on"] == pytest.approx(1.5)
    assert summary["sharing_gain_off"] == pytest.approx(2.0)


def test_quarters_split_the_rounds_evenly_and_the_last_takes_the_remainder():
    from sapo_async.experiment.attack.over_time import quarters

    assert quarters([1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]) == [1.0, 2.0, 3.0, 4.0]
    assert quarters([0, 0, 0, 0, 1, 2]) == [0.0, 0.0, 0.0, 1.0]
    assert quarters([1.0, 2.0]) == []


def test_honest_reward_by_quarter_shows_a_cost_that_grows_over_the_rounds():
    # Equal sums over the run, one cost at the start and one at the end: the goal's ratio
    # cannot tell them apart, the quarters can.
    from sapo_async.experiment.attack.over_time import by_quarter

    def run(attack, on, seed, honest_rewards):
        rewards = [honest_rewards, honest_rewards, [0.0] * 8, [0.0] * 8]
        return RunMeasure(attack, on, seed, "1/1", [0, 1], rewards=rewards)

    flat = [0.2] * 8
    runs = [
        run("none", False, 0, flat),
        run("none", True, 0, flat),
        run("inject", True, 0, [0.2] * 6 + [0.0, 0.0]),
        run("tokens", True, 0, [0.0, 0.0] + [0.2] * 6),
        run("none", True, 1, flat),  # seed 1 has no undefended no-attack run: left out
        run("inject", True, 1, [0.0] * 8),
    ]
    spec = AttackSpec(attacks=("inject", "tokens", "length"), seeds=(0, 1), local=1, external=1)
    table = by_quarter(spec, runs)
    assert table["inject"]["on"] == pytest.approx([0.2, 0.2, 0.2, 0.0])
    assert table["tokens"]["on"] == pytest.approx([0.0, 0.2, 0.2, 0.2])
    assert table["inject"]["no_attack_on"] == pytest.approx([0.2] * 4)
    assert table["inject"]["seeds"] == [0]
    assert table["inject"]["last_quarter_by_seed"] == {
        "on": pytest.approx([0.0]),
        "no_attack_on": pytest.approx([0.2]),
        "no_attack_off": pytest.approx([0.2]),
    }
    assert "off" not in table["inject"]  # no defences-off attack run was recorded
    assert "length" not in table


def test_runs_shorter_than_four_rounds_have_no_quarters_and_the_summary_still_writes():
    # The quick matrix runs 3 rounds; its summary raised IndexError on the empty quarters.
    from sapo_async.experiment.attack.over_time import by_quarter

    runs = [
        RunMeasure(
            attack,
            on,
            0,
            "1/1",
            [0, 1],
            rewards=[[0.1] * 3] * 4,
            round_s=[1.0] * 3,
            round_cpu_s=[1.0] * 3,
        )
        for attack, on in (("none", False), ("none", True), ("inject", False), ("inject", True))
    ]
    assert by_quarter(SPEC, runs) == {}
    assert summarise(SPEC, runs, seconds=0.0)["honest_reward_by_quarter"] == {}
