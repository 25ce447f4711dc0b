"""The code learning report: exact McNemar p-values, pass@1 intervals, paired counts, RL curves."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corrgrpo_envs.metrics import mcnemar_exact, wilson_interval
from studies import learning_code


def test_mcnemar_exact_known_values():
    # 8 gained, 2 lost: 2 * P(X <= 2), X ~ Bin(10, 1/2) = 2 * 56 / 1024
    assert mcnemar_exact(8, 2) == pytest.approx(0.109375)
    assert mcnemar_exact(5, 2) == pytest.approx(0.453125)
    assert mcnemar_exact(0, 3) == pytest.approx(0.25)
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(3, 3) == 1.0
    with pytest.raises(ValueError, match="counts must be >= 0"):
        mcnemar_exact(-1, 2)


@given(st.integers(0, 60), st.integers(0, 60))
def test_mcnemar_exact_is_symmetric_and_a_probability(gained, lost):
    p = mcnemar_exact(gained, lost)
    assert p == mcnemar_exact(lost, gained)
    assert 0.0 < p <= 1.0
    n = gained + lost
    if n and gained != lost:
        # the tail sum is at least the probability of the observed split
        assert p >= 2 * math.comb(n, min(gained, lost)) / 2**n - 1e-12


def _answers(correct: list[int], compile_ok: list[int]) -> list[dict]:
    return [
        {"task_id": f"t{i}", "text": "x" * (i + 1), "error": None if f else "no fenced python code block",
         "rewards": {"format": float(f), "syntax": float(f), "compile": float(f), "runtime": float(c),
                     "correct": float(c), "ast_similarity": 0.5, "efficiency": 0.0}}
        for i, (c, f) in enumerate(zip(correct, compile_ok))
    ]


def test_summary_and_paired_counts_from_answers():
    before = {"stage": "base", "data": "humaneval", "wall_seconds": 3.0, "answers": _answers([0, 0, 1, 0], [1, 0, 1, 0])}
    after = {"stage": "sft", "data": "humaneval", "wall_seconds": 2.0, "answers": _answers([1, 1, 0, 0], [1, 1, 1, 0])}
    s = learning_code.summarise(after)
    assert s["n"] == 4 and s["passed"] == 2 and s["pass@1"] == 50.0
    assert s["ci95"] == pytest.approx(tuple(100 * v for v in wilson_interval(2, 4)))
    assert s["compile"] == 75.0 and s["ast_similarity"] == 50.0 and s["no_block_share"] == 25.0
    t = learning_code.paired(after, before, "correct")
    assert (t["n"], t["gained"], t["lost"]) == (4, 2, 1)
    assert t["p"] == pytest.approx(mcnemar_exact(2, 1))
    text, numbers = learning_code.report([before, after], {})
    assert "| sft | humaneval | 4 | 50.0 [" in text
    assert "| sft vs base | humaneval | correct | 2 | 1 | +1 |" in text
    assert len(numbers["paired"]) == len(learning_code.BINARY)


def test_run_curves_and_table_from_metrics_jsonl(tmp_path):
    names = ["format", "correct"]
    rows = [
        {"step": s, "reward_names": names, "reward/weighted/mean": 0.1 * s, "reward/format/mean": 0.5,
         "reward/correct/mean": 0.0, "c_q/median": 0.4, "k_eff/mean": 1.0, "zero_variance_fraction": 0.5,
         "advantage/abs_mean": 0.3, "completion_length/mean": 100.0, "time/step": 9.0,
         "cov_share/format": 1.0, "cov_share/correct": 0.0,
         # correct never varies from step 7 on: its correlations are undefined (None), not 0
         "reward_correlation": [[1.0, 0.0], [0.0, 0.0]] if s < 7 else [[1.0, None], [None, None]]}
        for s in range(1, 13)
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    c = learning_code.run_curves(tmp_path)
    assert c["steps"] == list(range(1, 13)) and c["means"]["format"] == [0.5] * 12
    assert c["mean_correlation"] == [[1.0, 0.0], [0.0, 0.0]]  # over steps 1-6, where it is defined
    table = learning_code.run_table("rl", c)
    assert "| format | 1.00 | 0.00 |" in table
    # windows: steps 1-10 (weighted mean 0.55) and 3-12 (0.75)
    assert "| steps 1-10 | steps 3-12 |" in table and "| weighted | 0.550 | 0.750 |" in table


def test_from_eval_json_turns_records_into_answers(tmp_path):
    path = tmp_path / "base-humaneval.json"
    path.write_text(json.dumps({"seconds": 5.0, "metrics": {}, "records": [
        {"task_id": "HumanEval/0", "text": "t", "reward_components": {"correct": 1.0}, "info": {"error": None}}]}))
    r = learning_code.from_eval_json(path, "base", "humaneval")
    assert r["stage"] == "base" and r["wall_seconds"] == 5.0
    assert r["answers"] == [{"task_id": "HumanEval/0", "text": "t", "rewards": {"correct": 1.0}, "error": None}]


def test_group_analysis_recomputes_the_multiplier_and_the_cost_of_a_duplicate(tmp_path):
    # one step, two groups of 4; group 0: syntax and compile flip together (a duplicate pair),
    # group 1: only ast_similarity varies; a stale partial copy of step 1 precedes the real one
    def row(task, syntax, ast):
        return {"step": 1, "task_id": task, "reward": [1.0, syntax, syntax, 0.0, 0.0, ast, 0.0]}

    stale = [row("a", 1.0, 0.5)] * 2
    rows = [row("a", s, 0.5) for s in (1.0, 0.0, 1.0, 0.0)] + [row("b", 1.0, a) for a in (0.2, 0.4, 0.6, 0.8)]
    (tmp_path / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in stale + rows) + "\n", encoding="utf-8")
    g = learning_code.group_analysis(tmp_path, [0.05, 0.05, 0.05, 0.25, 0.60, 0.30, 0.20], rollouts_per_step=8)
    assert g["rollouts_per_step"] == 8 and g["groups_with_variance"] == 2
    by_task = {o["task_id"]: o for o in g["per_group"]}
    # two identical rewards: S_corr = 4, K_eff = 1; as one reward S_corr = 1, so c_q doubles
    assert by_task["a"]["s_corr"] == pytest.approx(4.0) and by_task["a"]["k_eff"] == pytest.approx(1.0)
    assert by_task["a"]["c_q_merged"] / by_task["a"]["c_q"] == pytest.approx(2.0, rel=1e-4)
    # one active reward: c_q is the std of the weighted reward (S_corr = 1), merging changes nothing
    assert by_task["b"]["s_corr"] == pytest.approx(1.0)
    assert by_task["b"]["c_q"] == pytest.approx(by_task["b"]["weighted_std"], rel=1e-4)
    assert by_task["b"]["c_q_merged"] == pytest.approx(by_task["b"]["c_q"], rel=1e-6)
    assert g["groups_with_syntax_and_compile_active"] == 1 and g["merge_ratio_median_there"] == pytest.approx(2.0, rel=1e-4)
    # GRPO: unit-std advantages, sum |A| = 4 * 0.5 / std(1,0,1,0) = 3.4641 in group a and
    # 2 * (0.3 + 0.1) / std(0.2, 0.4, 0.6, 0.8) = 3.0984 in group b; CorrGRPO scales each group by its c_q
    shares = g["duplicate_groups_share_of_abs_advantage"]
    assert shares["grpo"] == pytest.approx(3.4641 / (3.4641 + 3.0984), rel=1e-4)
    ca, cb = by_task["a"]["c_q"], by_task["b"]["c_q"]
    assert shares["corrgrpo"] == pytest.approx(3.4641 * ca / (3.4641 * ca + 3.0984 * cb), rel=1e-4)


def test_paired_run_ratios_cover_the_steps_both_runs_updated(tmp_path):
    # run b's advantages are half of a's, its gradient 0.6 of it, its update 0.9 of it (1.2 at step 3);
    # step 2 of run a had no gradient, so step 2 is left out of every ratio
    def write(folder, rows):
        folder.mkdir()
        (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")

    write(tmp_path / "a", [
        {"step": 1, "advantage/abs_mean": 0.8, "grad_norm": 1.0, "update_norm": 0.1},
        {"step": 2, "advantage/abs_mean": 0.0, "grad_norm": 0.0, "update_norm": 0.02, "skipped_update": True},
        {"step": 3, "advantage/abs_mean": 0.8, "grad_norm": 2.0, "update_norm": 0.1},
    ])
    write(tmp_path / "b", [
        {"step": 1, "advantage/abs_mean": 0.4, "grad_norm": 0.6, "update_norm": 0.09},
        {"step": 2, "advantage/abs_mean": 0.4, "grad_norm": 0.6, "update_norm": 0.09},
        {"step": 3, "advantage/abs_mean": 0.4, "grad_norm": 1.2, "update_norm": 0.12},
    ])
    ratios = learning_code.paired_run_ratios({"a": str(tmp_path / "a"), "b": str(tmp_path / "b")})
    r = ratios["b/a"]
    assert r["advantage/abs_mean"] == pytest.approx({"median": 0.5, "min": 0.5, "max": 0.5, "steps": 2})
    assert r["grad_norm"] == pytest.approx({"median": 0.6, "min": 0.6, "max": 0.6, "steps": 2})
    assert r["update_norm"] == pytest.approx({"median": 1.05, "min": 0.9, "max": 1.2, "steps": 2})
    text = learning_code.ratios_text(ratios)
    assert "| b/a | update_norm | 1.05 | 0.90 | 1.20 | 2 |" in text
