"""``corrgrpo arena``: the statistics it reports, its plan, and a whole arena run through the
commands it prints for a scheduler, merged into one report, then resumed with nothing to do."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corrgrpo.trainer.arena import BASELINE, plan_arena, regime_configs
from corrgrpo.trainer.paired_stats import holm, paired_difference, tiers

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------ statistics
def test_holm_matches_its_definition_on_a_known_family():
    # sorted p: 0.01 (x3 = 0.03), 0.02 (x2 = 0.04), 0.04 (x1 = 0.04, and never below the previous)
    out = holm({"a": 0.04, "b": 0.01, "c": 0.02, "d": float("nan")})
    assert out == pytest.approx({"b": 0.03, "c": 0.04, "a": 0.04})


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(1e-6, 1.0), min_size=1, max_size=12))
def test_holm_is_monotone_and_at_least_the_raw_p(ps):
    out = holm({str(i): p for i, p in enumerate(ps)})
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adjusted = [out[str(i)] for i in order]
    assert all(a <= b + 1e-15 for a, b in zip(adjusted, adjusted[1:]))
    assert all(out[str(i)] >= ps[i] - 1e-15 and out[str(i)] <= 1.0 for i in range(len(ps)))


def test_paired_difference_equals_scipy_and_a_hand_interval():
    from scipy import stats

    xs, ys = [1.0, 2.0, 4.0, 3.5], [0.5, 1.0, 3.0, 3.5]
    diff, half, p = paired_difference(xs, ys)
    d = np.subtract(xs, ys)
    assert diff == pytest.approx(0.625)
    assert half == pytest.approx(stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2)
    assert p == pytest.approx(stats.ttest_rel(xs, ys).pvalue)
    assert paired_difference([1.0, 2.0], [1.0, 2.0])[2] == 1.0  # no difference at all
    assert np.isnan(paired_difference([2.0, 3.0], [1.0, 2.0])[2])  # equal non-zero differences


def test_tiers_group_overlapping_intervals_with_the_best():
    scores = {"a": (10.0, 1.0), "b": (9.5, 0.2), "c": (8.0, 0.5), "d": (7.9, None), "e": (1.0, None)}
    # a's interval [9, 11] overlaps b's [9.3, 9.7] only; c [7.5, 8.5] opens tier 2 with d (7.9)
    assert tiers(scores) == {"a": 1, "b": 1, "c": 2, "d": 2, "e": 3}
    assert tiers({"x": (1.0, None), "y": (1.0, None)}) == {"x": 1, "y": 1}


# ------------------------------------------------------------------------------ plan
def test_a_folder_is_every_config_in_it_and_a_name_clash_is_refused(tmp_path):
    found = regime_configs(["arena"])
    assert list(found) == ["mixed", "redundant", "scale", "sparse", "tradeoff"]
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "scale.yaml").write_text((ROOT / "env_configs/arena/scale.yaml").read_text())
    with pytest.raises(ValueError, match="two configs are named 'scale'"):
        regime_configs(["arena", str(tmp_path / "a")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="without"):
        regime_configs([str(tmp_path / "empty")])


def test_the_plan_always_holds_the_baseline_and_checks_each_estimator(tmp_path):
    plan = plan_arena(["arena/scale.yaml"], ["train.steps=2"], ["corrgrpo"], 2, tmp_path)
    assert plan.estimators == [BASELINE, "corrgrpo"] and plan.steps == {"scale": 2}
    labels = [r.label for r in plan.runs()]
    assert labels == ["scale/grpo/s0", "scale/corrgrpo/s0", "scale/grpo/s1", "scale/corrgrpo/s1"]
    with pytest.raises(Exception, match="no_such_estimator"):
        plan_arena(["arena/scale.yaml"], [], ["no_such_estimator"], 1, tmp_path)


def _corrgrpo(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "corrgrpo.trainer.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_printed_commands_run_the_arena_and_the_report_merges_them(tmp_path, monkeypatch):
    from corrgrpo.trainer.cli import main

    out = tmp_path / "arena"
    common = ["arena", "arena/redundant.yaml", "train.steps=2", "algorithm.prompts_per_step=2",
              "rollout.max_new_tokens=8", "--estimators", "grpo,gdpo", "--seeds", "2",
              "--out", str(out), "--eval-limit", "4"]
    printed = _corrgrpo(*common, "--commands", cwd=tmp_path)
    assert printed.returncode == 0, printed.stdout + printed.stderr
    lines = printed.stdout.strip().splitlines()
    assert len(lines) == 4 and all(" --only redundant/" in line for line in lines)
    assert "--report" in printed.stderr
    for line in lines:  # what a scheduler would run, one job per line (here in this process)
        argv = shlex.split(line)
        assert argv[:2] == ["corrgrpo", "arena"]
        with monkeypatch.context() as m:
            m.chdir(tmp_path)
            m.setenv("PYTHONPATH", str(ROOT))
            assert main(argv[1:]) == 0
    assert _corrgrpo(*common, "--commands", cwd=tmp_path).stdout.strip() == ""  # nothing left

    merged = _corrgrpo(*common, "--report", cwd=tmp_path)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    result = json.loads((out / "results.json").read_text())
    entry = result["regimes"]["redundant"]
    assert entry["rewards"] == ["has_a", "word_with_a", "has_b"]
    for estimator in ("grpo", "gdpo"):
        row = entry["estimators"][estimator]
        assert row["seeds"] == [0, 1] and row["tier"] >= 1
        # the report's numbers are the run folders' own: recompute one seed's held-out mean
        records = json.loads((out / "redundant" / estimator / "s1" / "eval.json").read_text())["records"]
        has_b = float(np.mean([r["reward_components"]["has_b"] for r in records]))
        assert row["held_out"]["has_b"]["values"][1] == pytest.approx(has_b)
        metrics = [json.loads(x) for x in
                   (out / "redundant" / estimator / "s0" / "metrics.jsonl").read_text().splitlines()]
        final = np.mean([m["reward/weighted/mean"] for m in metrics[-5:]])
        assert row["final"]["weighted"]["values"][0] == pytest.approx(final)
        assert not list((out / "redundant" / estimator / "s0").glob("checkpoint-*"))  # removed once evaluated
    versus = entry["estimators"]["gdpo"]["vs_baseline"]
    assert set(versus) == {"score", "final/has_a", "final/word_with_a", "final/has_b", "final/weighted"}
    assert result["num_tests"] == 5 and all("p_holm" in v or not np.isfinite(v["p"]) for v in versus.values())
    report = (out / "report.md").read_text()
    assert "## redundant" in report and "Paired difference to grpo" in report and "ms/call" in report
    assert (out / "pareto.png").stat().st_size > 1000

    again = _corrgrpo(*common, "--parallel", "2", cwd=tmp_path)  # resumes: every run is finished
    assert again.returncode == 0 and "4 already finished" in again.stdout
    rerun = json.loads((out / "results.json").read_text())
    assert _without_timing(rerun["regimes"]) == _without_timing(result["regimes"])


def _without_timing(regimes: dict) -> dict:
    """The results but the estimators' own time per call, which is measured anew by each report."""
    return {name: {**entry, "estimators": {e: {k: v for k, v in row.items() if k != "estimator_seconds"}
                                           for e, row in entry["estimators"].items()}}
            for name, entry in regimes.items()}


def test_bad_arguments_are_one_line(tmp_path):
    bad = _corrgrpo("arena", "arena/scale.yaml", "--seeds", "0", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stdout.strip().startswith("error:") and len(bad.stdout.splitlines()) == 1
    missing = _corrgrpo("arena", "no_such_regime.yaml", cwd=tmp_path)
    assert missing.returncode == 2 and "no_such_regime.yaml" in missing.stdout and "Traceback" not in missing.stderr
    unknown = _corrgrpo("arena", "arena/scale.yaml", "--estimators", "nope", cwd=tmp_path)
    assert unknown.returncode == 2 and "nope" in unknown.stdout and "Traceback" not in unknown.stderr


def test_advice_on_the_grpo_runs_is_checked_against_the_arena(tmp_path):
    """The quickstart's GRPO log (dominance, duplicates, falling letters) as each seed's run:
    each recommended estimator is a hit, miss or unresolved by its paired interval."""
    from corrgrpo.trainer.arena import ArenaPlan
    from corrgrpo.trainer.arena_report import check_advice
    from tests.test_advice_quickstart import _quickstart_records

    plan = ArenaPlan(tmp_path, {"toy": ROOT / "env_configs/arena/scale.yaml"}, ["grpo", "gdpo", "corrgrpo"],
                     2, [], {"toy": 30}, None)
    for seed in range(2):
        run = tmp_path / "toy" / "grpo" / f"s{seed}"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _quickstart_records()))
        (run / "config.json").write_text(json.dumps({"algorithm": {"estimator": "grpo"}}))
    result = {"regimes": {"toy": {"estimators": {
        "grpo": {"vs_baseline": {}},
        "gdpo": {"vs_baseline": {"score": {"diff": 4.0, "ci95": 1.5}}},
        "corrgrpo": {"vs_baseline": {"score": {"diff": -0.5, "ci95": 2.0}}},
    }}}}
    out = check_advice(plan, result)
    verdicts = {(c["advice"], c["estimator"]): c["verdict"] for c in out["checks"]}
    assert verdicts[("dominant", "gdpo")] == "hit" and verdicts[("duplicates", "corrgrpo")] == "unresolved"
    assert all(c["grpo_runs_with_finding"] == 2 and c["of_runs"] == 2 for c in out["checks"])
    assert out["hits"] == sum(v == "hit" for v in verdicts.values()) and out["misses"] == 0
    assert out["hit_rate"] == pytest.approx(out["hits"] / len(out["checks"]))


def test_a_noisy_lower_mean_never_ranks_above_a_precise_higher_one():
    # c's wide interval reaches a's, but b (higher, precise) does not: c cannot share a's tier
    assert tiers({"a": (10.0, 0.5), "b": (9.0, 0.2), "c": (8.0, 3.0)}) == {"a": 1, "b": 2, "c": 2}
