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
    # the starting model is evaluated per seed when sampling (its answers depend on the seed)
    assert labels == ["scale/start/s0", "scale/grpo/s0", "scale/corrgrpo/s0",
                      "scale/start/s1", "scale/grpo/s1", "scale/corrgrpo/s1"]
    start = plan.runs()[0]
    job = start.job(save_every=1, threads=1)
    assert start.steps == 0 and job["train"] is None and job["checkpoint"] is None  # evaluated as it is
    assert not any("algorithm.estimator" in o for o in start.overrides)
    greedy = plan_arena(["arena/scale.yaml"], ["train.steps=2"], ["corrgrpo"], 2, tmp_path, eval_sample=False)
    assert [r.label for r in greedy.runs() if "/start/" in r.label] == ["scale/start/s0"]  # once: seed-free
    without = plan_arena(["arena/scale.yaml"], ["train.steps=2"], ["corrgrpo"], 2, tmp_path, eval_start=False)
    assert len(without.runs()) == 4 and without.to_json()["eval_start"] is False
    with pytest.raises(Exception, match="no_such_estimator"):
        plan_arena(["arena/scale.yaml"], [], ["no_such_estimator"], 1, tmp_path)
    with pytest.raises(ValueError, match="starting model"):
        plan_arena(["arena/scale.yaml"], [], ["start"], 1, tmp_path)


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
    assert len(lines) == 6 and all(" --only redundant/" in line for line in lines)
    assert sum(line.endswith(("--only redundant/start/s0", "--only redundant/start/s1")) for line in lines) == 2
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
    # the score, each reward's final value, and each env metric of the eval split's evaluation
    assert set(versus) == {"score", "final/has_a", "final/word_with_a", "final/has_b", "final/weighted",
                           "env/eval/has_a", "env/eval/word_with_a", "env/eval/has_b", "env/eval/total"}
    assert result["num_tests"] == 9 and all("p_holm" in v or not np.isfinite(v["p"]) for v in versus.values())
    # the starting model, evaluated per seed (sampled), and each estimator's change from it
    start = entry["start"]
    assert start["seeds"] == [0, 1] and not list((out / "redundant/start/s0").glob("checkpoint-*"))
    evaluation = json.loads((out / "redundant/start/s1/eval.json").read_text())
    assert evaluation["checkpoint"] is None and evaluation["tasks"] == 4
    has_b = float(np.mean([r["reward_components"]["has_b"] for r in evaluation["records"]]))
    assert start["held_out"]["has_b"]["values"][1] == pytest.approx(has_b)
    change = entry["estimators"]["gdpo"]["vs_start"]["score"]
    scores = entry["estimators"]["gdpo"]["score"]["values"]
    assert change["n"] == 2 and change["diff"] == pytest.approx(np.mean(scores) - start["score"]["mean"])
    assert set(entry["estimators"]["grpo"]["vs_start"]) == {"score", "env/eval/has_a", "env/eval/word_with_a",
                                                           "env/eval/has_b", "env/eval/total"}
    assert result["num_start_tests"] == 10  # their own family: num_tests is unchanged
    assert all("p_holm" in v or not np.isfinite(v["p"]) for v in entry["estimators"]["gdpo"]["vs_start"].values())
    report = (out / "report.md").read_text()
    assert "## redundant" in report and "Paired difference to grpo" in report and "ms/call" in report
    assert "Before training, the starting model scores" in report and "| start (before training) |" in report
    assert "Change from the starting model on the eval split" in report
    assert (out / "pareto.png").stat().st_size > 1000

    again = _corrgrpo(*common, "--parallel", "2", cwd=tmp_path)  # resumes: every run is finished
    assert again.returncode == 0 and "6 runs (1 regimes x 2 estimators x 2 seeds, and 2 evaluations of the starting model)" in again.stdout
    assert "6 already finished" in again.stdout
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


def test_advice_on_the_grpo_runs_is_checked_against_the_arena(tmp_path, monkeypatch):
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

    # a run holding a finding twice (two duplicate pairs) is one run with the finding, not two
    from types import SimpleNamespace

    import corrgrpo.trainer.advice.findings as findings

    twice = [SimpleNamespace(run=str(tmp_path / "toy" / "grpo" / "s0"), advice_key="duplicates", condition="",
                             recommendation=SimpleNamespace(estimators=["corrgrpo"]))] * 2
    monkeypatch.setattr(findings, "advise", lambda runs: twice)
    (check,) = check_advice(plan, result)["checks"]
    assert (check["grpo_runs_with_finding"], check["of_runs"]) == (1, 2)


def test_a_noisy_lower_mean_never_ranks_above_a_precise_higher_one():
    # c's wide interval reaches a's, but b (higher, precise) does not: c cannot share a's tier
    assert tiers({"a": (10.0, 0.5), "b": (9.0, 0.2), "c": (8.0, 3.0)}) == {"a": 1, "b": 2, "c": 2}


# ------------------------------------------------------------------------------ extra held-out sets
def test_an_eval_set_is_its_name_split_limit_and_settings_and_reads_back_from_its_words():
    from corrgrpo.trainer.arena import EvalSet, eval_set_words, parse_eval_set

    words = ["bfcl", "limit=100", "env.dataset=/data/bfcl", "env.dataset_options={a: 1, b: [2, 3]}",
             "rollout.max_new_tokens=256"]
    got = parse_eval_set(words, default_limit=64)
    assert got == EvalSet("bfcl", ("env.dataset=/data/bfcl", "env.dataset_options={a: 1, b: [2, 3]}",
                                   "rollout.max_new_tokens=256"), "eval", 100)
    assert got.file == "eval-bfcl.json"
    assert parse_eval_set(eval_set_words(got)) == got  # what --commands prints reads back the same
    assert parse_eval_set(["train_part", "split=train"], default_limit=64) == EvalSet("train_part", (), "train", 64)
    assert parse_eval_set(["all", "split=all", "limit=0"], default_limit=64).limit is None
    for bad, message in [([], "needs a NAME"), (["eval"], "not a set name"), (["a/b"], "not a set name"),
                         (["x", "limit=many"], "not a number"), (["x", "env.dataset"], "not KEY=VALUE"),
                         (["x", "dataset=foo"], "dotted config settings"), (["x", "split="], "needs a split")]:
        with pytest.raises(ValueError, match=message):
            parse_eval_set(bad)


def test_the_plan_checks_each_eval_set_and_a_run_needs_all_its_evaluations(tmp_path):
    from corrgrpo.trainer.arena import EvalSet
    from corrgrpo.trainer.run_queue import ModelRemoved

    extra = EvalSet("extra", ("rollout.max_new_tokens=2",), "train", 3)
    plan = plan_arena(["arena/scale.yaml"], ["train.steps=2"], ["grpo"], 1, tmp_path, eval_limit=4,
                      eval_sets=[extra])
    assert plan.to_json()["eval_sets"] == [{"name": "extra", "split": "train", "limit": 3,
                                            "overrides": ["rollout.max_new_tokens=2"]}]
    with pytest.raises(ValueError, match="--eval-set bad.*no_such_split"):
        plan_arena(["arena/scale.yaml"], [], ["grpo"], 1, tmp_path, eval_sets=[EvalSet("bad", (), "no_such_split")])
    with pytest.raises(ValueError, match="two sets of one name"):
        plan_arena(["arena/scale.yaml"], [], ["grpo"], 1, tmp_path, eval_sets=[extra, extra])
    with pytest.raises(Exception, match="no_such_key"):
        plan_arena(["arena/scale.yaml"], [], ["grpo"], 1, tmp_path,
                   eval_sets=[EvalSet("bad", ("rollout.no_such_key=1",))])

    run = next(r for r in plan.runs() if r.steps)  # the first trained run (the start is not)
    job = run.job(save_every=1, threads=1)
    assert job["train"] is not None and [e["split"] for e in job["evals"]] == ["eval", "train"]
    assert [e["limit"] for e in job["evals"]] == [4, 3]
    assert job["evals"][1]["overrides"][-3:-2] == ["rollout.max_new_tokens=2"]  # after the run's own
    final = run.folder / "checkpoint-2"
    final.mkdir(parents=True)
    (final / "checkpoint.json").write_text("{}")
    (run.folder / "eval.json").write_text("{}")
    assert not run.finished  # eval-extra.json is missing: only that evaluation is left
    job = run.job(save_every=1, threads=1)
    assert job["train"] is None and [e["out"] for e in job["evals"]] == [str(run.folder / "eval-extra.json")]
    (run.folder / "eval-extra.json").write_text("{}")
    assert run.finished
    (run.folder / "eval-extra.json").unlink()
    import shutil

    shutil.rmtree(final)  # the model removed after its first evaluation: retraining is refused
    with pytest.raises(ModelRemoved, match="eval-extra.json missing"):
        run.job(save_every=1, threads=1)


def test_headline_metrics_are_the_overall_numbers_less_counts_and_per_evaluation_bounds():
    from corrgrpo.trainer.arena_report import headline_metrics

    metrics = {"num_examples": 10.0, "num_with_calls": 9.0, "all_exact_accuracy": 40.0, "all_exact_ci95_low": 20.0,
               "all_exact_ci95_high": 60.0, "format": 90.0, "BFCL_v4_multiple/all_exact_accuracy": 30.0,
               "note": "text", "flag": True}
    assert headline_metrics(metrics) == ["all_exact_accuracy", "format"]


@pytest.mark.slow
def test_an_extra_set_is_evaluated_resumed_printed_and_reported(tmp_path):
    out = tmp_path / "arena"
    common = ["arena", "arena/redundant.yaml", "train.steps=1", "algorithm.prompts_per_step=2",
              "rollout.max_new_tokens=8", "--estimators", "grpo,gdpo", "--seeds", "2", "--out", str(out),
              "--eval-limit", "4", "--no-eval-start",
              "--eval-set", "extra", "split=train", "limit=3", "rollout.max_new_tokens=2"]
    printed = _corrgrpo(*common, "--commands", cwd=tmp_path)
    lines = printed.stdout.strip().splitlines()
    assert printed.returncode == 0 and len(lines) == 4, printed.stdout + printed.stderr  # no start evaluated
    assert all(" --no-eval-start --eval-set extra split=train limit=3 rollout.max_new_tokens=2 --only " in line
               for line in lines)

    done = _corrgrpo(*common, "--parallel", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for estimator in ("grpo", "gdpo"):
        for seed in (0, 1):
            run = out / "redundant" / estimator / f"s{seed}"
            extra = json.loads((run / "eval-extra.json").read_text())
            default = json.loads((run / "eval.json").read_text())
            assert (extra["split"], extra["tasks"], extra["eval_set"]) == ("train", 3, "extra")
            assert (default["split"], default["tasks"]) == ("eval", 4)
            assert not list(run.glob("*.partial"))
    result = json.loads((out / "results.json").read_text())
    assert result["meta"]["plan"]["eval_sets"][0]["name"] == "extra"
    gdpo = result["regimes"]["redundant"]["estimators"]["gdpo"]
    assert set(gdpo["env_metrics"]) == {"eval", "extra"}
    # each value is the run's own file's: seed 1's extra-set total
    total = json.loads((out / "redundant/gdpo/s1/eval-extra.json").read_text())["metrics"]["total"]
    assert gdpo["env_metrics"]["extra"]["total"]["values"][1] == pytest.approx(total)
    env_tests = [k for k in gdpo["vs_baseline"] if k.startswith("env/")]
    assert "env/extra/total" in env_tests and "env/eval/has_b" in env_tests
    assert result["num_tests"] == 5 + len(env_tests)  # the score, 4 final values, and every env metric
    report = (out / "report.md").read_text()
    assert "Env metrics on extra set `extra`: split `train`, first 3 tasks" in report
    assert "Env metrics on the eval split" in report

    # a run that lost one set's file is unfinished: printed again, and refused (its model is gone)
    (out / "redundant/gdpo/s1/eval-extra.json").unlink()
    again = _corrgrpo(*common, "--commands", cwd=tmp_path).stdout.strip().splitlines()
    assert len(again) == 1 and again[0].endswith("--only redundant/gdpo/s1")
    refused = _corrgrpo(*common, "--only", "redundant/gdpo/s1", cwd=tmp_path)
    assert refused.returncode == 2 and "eval-extra.json missing" in refused.stdout
    merged = _corrgrpo(*common, "--report", cwd=tmp_path)  # the report: seed 1 lacks the set
    assert merged.returncode == 0, merged.stdout + merged.stderr
    gdpo = json.loads((out / "results.json").read_text())["regimes"]["redundant"]["estimators"]["gdpo"]
    assert gdpo["env_metrics"]["extra"]["total"]["values"] == [pytest.approx(
        json.loads((out / "redundant/gdpo/s0/eval-extra.json").read_text())["metrics"]["total"])]
    assert "env/extra/total" not in gdpo["vs_baseline"]  # one paired seed is no test


def test_one_greedy_start_is_the_reference_of_every_seed_and_keeps_its_interval_over_tasks(tmp_path):
    """Greedy answers do not depend on the seed: the start is evaluated once, each estimator's
    change from it is an interval over the estimator's seeds, and the start's row keeps the
    evaluation's own interval over tasks."""
    from scipy import stats

    from corrgrpo.trainer.arena_markdown import _start_lines
    from corrgrpo.trainer.arena_report import _task_intervals, _versus_start

    metrics = {"num_examples": 100.0, "all_exact_accuracy": 3.0, "all_exact_ci95_low": 1.0,
               "all_exact_ci95_high": 8.5, "format": 48.0}
    (tmp_path / "eval-bfcl.json").write_text(json.dumps({"metrics": metrics}))
    assert _task_intervals(tmp_path, ["eval", "bfcl"]) == {"bfcl": {"all_exact_accuracy": (1.0, 8.5)}}

    start = {0: {"score": 40.0, "env_metrics": {"bfcl": {"all_exact_accuracy": 3.0, "format": 48.0}}}}
    runs = {s: {"score": 40.0 + d, "env_metrics": {"bfcl": {"all_exact_accuracy": 3.0 + d}}}
            for s, d in zip(range(3), (1.0, 2.0, 3.0))}
    versus = _versus_start(runs, start)
    diffs = np.array([1.0, 2.0, 3.0])
    half = stats.t.ppf(0.975, 2) * diffs.std(ddof=1) / np.sqrt(3)
    for key in ("score", "env/bfcl/all_exact_accuracy"):
        assert versus[key]["n"] == 3 and versus[key]["diff"] == pytest.approx(2.0)
        assert versus[key]["ci95"] == pytest.approx(half)
        assert versus[key]["p"] == pytest.approx(stats.ttest_1samp(diffs, 0.0).pvalue)
    assert "env/bfcl/format" not in versus  # the runs lack it: nothing to compare

    entry = {"start": {"seeds": [0], "score": {"mean": 40.0, "ci95": None, "values": [40.0]}},
             "estimators": {"grpo": {"vs_start": versus}}}
    text = "\n".join(_start_lines(entry, ["grpo"], 2))
    assert "starting model scores 40.0 held-out (one evaluation: no interval over seeds)" in text
    assert "| grpo | +2.0 [±" in text


def test_task_by_task_each_seed_is_compared_with_the_start_on_the_envs_own_verdict(tmp_path):
    """Where the records carry the env's 0/1 verdict, each seed's final model is compared with the
    start on the same tasks: gained, lost, and the exact McNemar p (tasks that expect no call
    are left out, as the env's accuracy leaves them out)."""
    from corrgrpo.trainer.arena_markdown import _task_lines
    from corrgrpo.trainer.arena_report import _tasks_versus_start
    from corrgrpo_envs.metrics import mcnemar_exact

    def write(folder: Path, verdicts: list[bool], no_call: bool = False) -> None:
        records = [{"task_id": f"t{i}", "reward_components": {}, "info": {"exact": v}} for i, v in enumerate(verdicts)]
        records.append({"task_id": "none", "reward_components": {}, "info": {"exact": no_call, "expects_calls": False}})
        folder.mkdir(parents=True)
        (folder / "eval.json").write_text(json.dumps({"records": records}))

    write(tmp_path / "start" / "s0", [False] * 8 + [True] * 2)
    write(tmp_path / "grpo" / "s0", [True] * 7 + [False] + [True, False], no_call=True)  # +7, -1
    write(tmp_path / "grpo" / "s1", [False] * 8 + [True] * 2)  # unchanged
    got = _tasks_versus_start(tmp_path, "grpo", [0, 1], [0], ["eval", "bfcl"])
    assert got == {"tasks/eval/s0": {"gained": 7, "lost": 1, "n": 10, "p": mcnemar_exact(7, 1)},
                   "tasks/eval/s1": {"gained": 0, "lost": 0, "n": 10, "p": 1.0}}
    assert mcnemar_exact(7, 1) == pytest.approx(2 * 9 / 256)  # two-sided binomial tail of 1 of 8
    text = "\n".join(_task_lines({"estimators": {"grpo": {"vs_start": got}}}, ["grpo"], "eval"))
    assert "| grpo | +7 / -1 of 10, p=0.070 | +0 / -0 of 10, p=1.000 |" in text
