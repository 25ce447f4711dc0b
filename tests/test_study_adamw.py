"""The AdamW estimator study's analysis (studies/adamw_toolcall.py) on synthetic runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from studies import adamw_toolcall as study

TASKS = [f"t{i}" for i in range(10)]


def _write_eval(out: Path, name: str, exact: set[str], components: dict[str, float]) -> None:
    answers = [{"task_id": t, "exact": t in exact, "expects_calls": True, "rewards": {}} for t in TASKS]
    answers.append({"task_id": "no_call", "exact": False, "expects_calls": False, "rewards": {}})
    metrics = {"all_exact_accuracy": 100.0 * len(exact) / len(TASKS), **components}
    (out / "eval").mkdir(parents=True, exist_ok=True)
    (out / "eval" / f"{name}-generated.json").write_text(
        json.dumps({"stage": name, "data": "generated", "metrics": metrics, "answers": answers}))


def _write_run(out: Path, estimator: str, seed: int, scale: float, skipped: set[int]) -> None:
    d = study.run_dir(out, estimator, seed)
    d.mkdir(parents=True)
    rows = []
    for step in range(1, study.STEPS + 1):
        row = {"step": step, "grad_norm": 0.0 if step in skipped else 0.5 * scale,
               "update_norm": 0.01 if step in skipped else 0.1, "advantage/abs_mean": 0.0 if step in skipped else scale,
               "zero_variance_fraction": 0.5, "group_weight/median": 2.0 * scale,
               **{f"advantage_share_abs/{c}": 0.25 for c in study.COMPONENTS}}
        if step in skipped:
            row["skipped_update"] = 1.0
        rows.append(row)
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


@pytest.fixture
def finished(tmp_path):
    comps = {c: 50.0 for c in study.COMPONENTS}
    _write_eval(tmp_path, study.START, {"t0", "t1"}, comps)
    exact = {  # (estimator, seed) -> exact tasks
        ("grpo", 0): {"t0", "t1", "t2", "t3"}, ("grpo", 1): {"t0", "t1", "t2"}, ("grpo", 2): {"t0", "t1", "t2", "t3", "t4"},
        ("corrgrpo", 0): {"t0", "t1", "t2"}, ("corrgrpo", 1): {"t0", "t2", "t5"}, ("corrgrpo", 2): {"t0", "t1", "t2", "t3"},
    }
    for (e, s), ex in exact.items():
        _write_eval(tmp_path, study.stage(e, s), ex, comps)
        _write_run(tmp_path, e, s, scale=1.0 if e == "grpo" else 0.5, skipped={4, 5} if s == 0 else {7})
    return tmp_path


def test_paired_differences_by_seed_and_summed_task_changes(finished):
    res = study.analyze(finished, ["grpo", "corrgrpo"], [0, 1, 2])
    grpo, corr = res["estimators"]["grpo"], res["estimators"]["corrgrpo"]
    assert grpo["all_exact_accuracy"][0] == pytest.approx(40.0)
    assert corr["all_exact_accuracy"][0] == pytest.approx(100 / 3)
    paired = res["paired"]["corrgrpo"]
    # per seed: -10, 0, -10 points -> mean -6.67, half-width t(0.975, 2) * sd / sqrt(3)
    diff, half, p = paired["all_exact_accuracy"]
    assert diff == pytest.approx(-20 / 3)
    assert half == pytest.approx(4.302653 * math.sqrt(100 / 3) / math.sqrt(3), rel=1e-5)
    assert 0 < p < 1
    # seed 0 loses t3; seed 1 loses t1, gains t5; seed 2 loses t4 (the no-call task never counts)
    assert paired["tasks"] == {"gained": 1, "lost": 3}
    # against the warm start (t0, t1 exact): grpo seed 0 gained t2, t3
    assert res["runs"]["grpo"][0]["vs_start"]["gained"] == 2
    assert res["runs"]["grpo"][0]["vs_start"]["lost"] == 0


def test_optimizer_step_is_summarised_over_updating_steps(finished):
    res = study.analyze(finished, ["grpo", "corrgrpo"], [0, 1, 2])
    run = res["runs"]["corrgrpo"][0]
    assert run["steps_updated"] == study.STEPS - 2
    assert run["update_norm"] == pytest.approx(0.1)          # the skipped steps' 0.01 left out
    assert run["update_norm_skipped"] == pytest.approx(0.01)
    assert run["grad_norm"] == pytest.approx(0.25)
    paired = res["paired"]["corrgrpo"]
    # half the advantages and half the gradient, the same update: what AdamW's scale invariance predicts
    assert paired["step_ratio/advantage/abs_mean"] == pytest.approx([0.5, 0.5, 0.5])
    assert paired["step_ratio/grad_norm"] == pytest.approx([0.5, 0.5, 0.5])
    assert paired["step_ratio/update_norm"] == pytest.approx([1.0, 1.0, 1.0])
    assert res["estimators"]["corrgrpo"]["group_weight_median"][0] == pytest.approx(1.0)
    assert res["estimators"]["grpo"]["share/values"][0] == pytest.approx(0.25)


def test_unfinished_runs_are_left_out_and_tables_render(finished):
    (study.run_dir(finished, "grpo", 2) / "metrics.jsonl").write_text('{"step": 1}\n')
    res = study.analyze(finished, ["grpo", "corrgrpo"], [0, 1, 2])
    assert sorted(res["runs"]["grpo"]) == [0, 1]
    assert res["paired"]["corrgrpo"]["seeds"] == [0, 1]
    md = study.tables_markdown(res)
    assert "| corrgrpo | 3 |" in md and "| grpo | 2 |" in md
    assert "paired on the seed" in md


def test_mean_runs_average_the_plotted_curves(finished):
    dirs = study.write_mean_runs(finished, ["grpo", "corrgrpo"], [0, 1, 2])
    assert [d.name for d in dirs] == ["mean-grpo", "mean-corrgrpo"]
    rows = [json.loads(ln) for ln in (dirs[1] / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == study.STEPS
    # step 5: skipped in seed 0 only -> mean of 0.01, 0.1, 0.1
    assert rows[4]["update_norm"] == pytest.approx(0.07)
    assert "zero_variance_fraction" not in rows[4]


def test_per_step_means_over_seeds(finished):
    res = study.analyze(finished, ["grpo", "corrgrpo"], [0, 1, 2])
    per = res["per_step"]["corrgrpo"]
    assert len(per["update_norm"]) == study.STEPS
    assert per["update_norm"][4] == pytest.approx(0.07)      # step 5: skipped in seed 0 only
    assert per["skipped_update"][4] == pytest.approx(1 / 3)
    assert per["grad_norm"][0] == pytest.approx(0.25)
    md = study.per_step_markdown(res)
    assert md.count("| step |") == 3 and "| corrgrpo | 0.100 |" in md


def test_step_ratios_range_over_seeds(finished):
    res = study.analyze(finished, ["grpo", "corrgrpo"], [0, 1, 2])
    assert res["paired"]["corrgrpo"]["step_ratio_range/grad_norm"] == pytest.approx([0.5, 0.5])
    assert "(steps: 1.00-1.00)" in study.tables_markdown(res)
