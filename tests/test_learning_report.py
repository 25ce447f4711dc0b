"""The learning report: Wilson intervals in the tool-calling metrics, seeded samples, the table."""

from __future__ import annotations

from pathlib import Path

import pytest

from corrgrpo_envs.toolcall.metrics import toolcall_metrics, wilson_interval
from studies import learning_toolcall

ROOT = Path(__file__).resolve().parents[1]


def test_wilson_interval_known_values():
    # reference values of the Wilson score interval at z = 1.96 (worked by hand for 68 / 136:
    # centre 0.5, half-width 1.96 * sqrt(0.25/136 + 1.96**2/(4*136**2)) / (1 + 1.96**2/136) = 0.082871)
    assert wilson_interval(5, 10) == pytest.approx((0.236593, 0.763407), abs=1e-6)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.277533), abs=1e-6)
    assert wilson_interval(10, 10) == pytest.approx((0.722467, 1.0), abs=1e-6)
    assert wilson_interval(68, 136) == pytest.approx((0.417129, 0.582871), abs=1e-6)


@pytest.mark.parametrize("k, n", [(-1, 10), (11, 10), (0, 0)])
def test_wilson_interval_rejects_impossible_counts(k, n):
    with pytest.raises(ValueError):
        wilson_interval(k, n)


def _record(exact: bool, calls: bool = True, dataset: str = "generated") -> dict:
    comps = {"function_name": 0.5, "parameter": 1.0, "values": 1.5 if exact else -1.5, "format": 1.0}
    return {"task_id": "t", "reward_components": comps, "info": {"dataset": dataset, "exact": exact, "expects_calls": calls}}


def test_toolcall_metrics_report_the_interval_of_call_tasks_only():
    records = [_record(True)] * 3 + [_record(False)] + [_record(False, calls=False)] * 2
    m = toolcall_metrics(records)
    assert m["all_exact_accuracy"] == 75.0
    low, high = wilson_interval(3, 4)
    assert (m["all_exact_ci95_low"], m["all_exact_ci95_high"]) == pytest.approx((100 * low, 100 * high))
    assert m["values"] == pytest.approx(75.0)


def test_sample_ids_is_seeded_order_keeping_and_total_when_n_is_large():
    ids = [f"t{i}" for i in range(50)]
    a = learning_toolcall.sample_ids(ids, 10, seed=0)
    assert a == learning_toolcall.sample_ids(ids, 10, seed=0)
    assert a != learning_toolcall.sample_ids(ids, 10, seed=1)
    assert len(set(a)) == 10 and a == sorted(a, key=ids.index)
    assert learning_toolcall.sample_ids(ids, 80, seed=0) == ids
    assert learning_toolcall.sample_ids(ids, None, seed=0) == ids


def test_markdown_table_has_a_row_per_stage_and_part():
    metrics = toolcall_metrics(
        [_record(True, dataset="bfcl_simple_python"), _record(False, dataset="bfcl_multiple")]
    )
    result = {"stage": "sft", "data": "bfcl", "metrics": metrics, "wall_seconds": 12.0,
              "diagnostics": {"unreadable_share": 0.0}}
    table = learning_toolcall.markdown_table([result]).splitlines()
    assert len(table) == 2 + 3  # header, rule, the whole set, its two parts
    assert table[2].startswith("| sft | bfcl | 2 / 2 | 50.0 [9.5, 90.5] | 100.0 | 100.0 | 50.0 | 100.0 | 0 % | 12 s |")
    assert table[3].startswith("| sft | bfcl_multiple | 1 / 1 | 0.0 [0.0, 79.3] |")
    assert table[4].startswith("| sft | bfcl_simple_python | 1 / 1 | 100.0 [20.7, 100.0] |")


def test_bfcl_folder_extracts_the_two_categories(tmp_path):
    import os

    wheel_dir = Path(os.environ.get("BFCL_WHEEL_DIR", ROOT / ".cache" / "bfcl"))
    wheels = sorted(wheel_dir.glob("bfcl_eval-*.whl"))
    if not wheels:
        pytest.skip("bfcl-eval wheel not downloaded (pip download --no-deps bfcl-eval -d .cache/bfcl)")
    from corrgrpo_envs.toolcall.datasets import DATASETS

    folder = learning_toolcall.bfcl_folder(tmp_path, wheel_dir)
    source = DATASETS.load(folder)
    names = {t["dataset"] for t in source}
    assert names == {"bfcl_simple_python", "bfcl_multiple"}
    assert len(source) == 600  # BFCL v4: 400 simple_python and 200 multiple questions


def test_bfcl_sets_extract_their_own_categories_into_their_own_folders(tmp_path):
    import os

    wheel_dir = Path(os.environ.get("BFCL_WHEEL_DIR", ROOT / ".cache" / "bfcl"))
    if not sorted(wheel_dir.glob("bfcl_eval-*.whl")):
        pytest.skip("bfcl-eval wheel not downloaded (pip download --no-deps bfcl-eval -d .cache/bfcl)")
    from corrgrpo_envs.toolcall.datasets import DATASETS

    for name, count in (("bfcl_parallel", 200), ("bfcl_live_simple", 258)):
        (selects,), split = learning_toolcall.dataset_overrides(name, tmp_path)
        assert split == "all" and selects == f"env.dataset={tmp_path / (name + '_data')}"
        source = DATASETS.load(tmp_path / f"{name}_data")
        assert {t["dataset"] for t in source} == {"bfcl_" + name[len("bfcl_"):]} and len(source) == count
    # BFCL scores its parallel category without order
    assert all(t["calls_in_any_order"] for t in DATASETS.load(tmp_path / "bfcl_parallel_data"))


def test_fixed_data_sets_select_their_dataset_and_split(tmp_path):
    assert learning_toolcall.dataset_overrides("api_bank_l1", tmp_path) == (["env.dataset=api_bank_l1"], "all")
    assert learning_toolcall.dataset_overrides("rlla_sft_eval", tmp_path) == (["env.dataset=rlla_sft"], "eval")
    with pytest.raises(ValueError, match="bfcl_live_simple"):
        learning_toolcall.dataset_overrides("bfcl_live", tmp_path)


def test_evaluate_plays_exactly_the_given_task_ids_and_rejects_unknown_ones():
    from corrgrpo.trainer.config import load_config
    from corrgrpo.trainer.evaluate import evaluate

    cfg = load_config(ROOT / "env_configs" / "toolcall_tiny.yaml", ["env.num_tasks=40"])
    import corrgrpo_envs

    ids = list(corrgrpo_envs.make("corrgrpo/ToolCall-v0", num_tasks=40, split="eval").unwrapped.task_ids)
    chosen = ids[1:4]
    result = evaluate(cfg, split="eval", policy_kind="reference", batch_size=2, progress=False, task_ids=chosen)
    assert [r["task_id"] for r in result["records"]] == chosen
    assert result["tasks"] == 3
    assert result["metrics"].get("all_exact_accuracy", 100.0) == 100.0
    with pytest.raises(ValueError, match="task_ids: not in the eval split"):
        evaluate(cfg, split="eval", policy_kind="reference", progress=False, task_ids=["generated/99999"])


def _answer(task_id: str, exact: bool | None, calls: bool = True, at_max: bool = False) -> dict:
    rewards = {"function_name": 0.5, "parameter": 1.0, "values": 1.5} if at_max else {
        "function_name": 0.0, "parameter": 0.0, "values": 0.0}
    a = {"task_id": task_id, "rewards": {**rewards, "format": 1.0}, "expects_calls": calls}
    if exact is not None:
        a["exact"] = exact
    return a


def test_answer_exact_prefers_the_envs_verdict_and_falls_back_to_the_maxima():
    assert learning_toolcall.answer_exact(_answer("a", True)) is True
    # the env's verdict wins over the rewards (an answer can reach the maxima without matching exactly)
    assert learning_toolcall.answer_exact(_answer("a", False, at_max=True)) is False
    assert learning_toolcall.answer_exact(_answer("a", None, at_max=True)) is True
    assert learning_toolcall.answer_exact(_answer("a", None)) is False
    record = {"task_id": "a", "reward_components": {"function_name": 0.5}, "info": {"exact": True}}
    assert learning_toolcall.answer_exact(record) is True


def test_paired_exact_counts_changed_call_tasks_and_mcnemars_p():
    before = {"stage": "sft", "data": "generated", "answers": [
        _answer("t1", False), _answer("t2", True), _answer("t3", False), _answer("t4", False),
        _answer("t5", False, calls=False), _answer("only_before", True)]}
    after = {"stage": "rl", "data": "generated", "answers": [
        _answer("t1", True), _answer("t2", False), _answer("t3", True), _answer("t4", True),
        _answer("t5", False, calls=False)]}
    row = learning_toolcall.paired_exact(after, before)
    # t1, t3, t4 gained, t2 lost; t5 expects no call, only_before has no partner
    assert (row["n"], row["gained"], row["lost"]) == (4, 3, 1)
    assert row["net_points"] == pytest.approx(50.0)
    assert row["p"] == pytest.approx(0.625)  # two-sided exact binomial: 2 * P(X <= 1 | 4, 1/2)
    rows = learning_toolcall.comparisons([before, after, {**after, "data": "bfcl"}], [("rl", "sft"), ("rl", "gone")])
    assert [(r["after"], r["before"], r["data"]) for r in rows] == [("rl", "sft", "generated")]
    table = learning_toolcall.comparison_table(rows).splitlines()
    assert table[2] == "| rl vs sft | generated | 4 | 3 | 1 | +50.0 | 0.62 |"


def test_changed_answers_show_both_sides_of_each_changed_verdict(tmp_path):
    def texts(result, prefix):
        for a in result["answers"]:
            a["text"] = f"{prefix} answer to {a['task_id']}"
        return result

    before = texts({"stage": "sft", "data": "bfcl", "metrics": {}, "answers": [
        _answer("t1", False), _answer("t2", True), _answer("t3", True), _answer("t5", False, calls=False)]}, "sft")
    after = texts({"stage": "rl", "data": "bfcl", "metrics": {}, "answers": [
        _answer("t3", True), _answer("t2", False), _answer("t1", True), _answer("t5", True, calls=False),
        _answer("new", True)]}, "rl")
    rows = learning_toolcall.changed_answers(after, before)
    # after's order; t3 unchanged, t5 expects no call, "new" has no partner
    assert [(r["task_id"], r["change"]) for r in rows] == [("t2", "lost"), ("t1", "gained")]
    assert rows[1]["before"] == "sft answer to t1" and rows[1]["after"] == "rl answer to t1"
    learning_toolcall.write_report(tmp_path, [before, after], [("rl", "sft")])
    text = (tmp_path / "changes.md").read_text(encoding="utf-8")
    assert text.startswith("## rl vs sft on bfcl: 1 gained, 1 lost\n")
    assert "### t2 (lost)\n\nsft:\n\n```text\nsft answer to t2\n```\n\nrl:\n\n```text\nrl answer to t2\n```" in text
    assert "t3" not in text and "t5" not in text


def test_stage_pair_names_a_malformed_compare_value():
    assert learning_toolcall.stage_pair("rl:sft") == ("rl", "sft")
    with pytest.raises(SystemExit, match="--compare 'rl'"):
        learning_toolcall.stage_pair("rl")


def test_mark_call_tasks_fills_in_which_saved_answers_expect_calls(tmp_path):
    cfg, split = learning_toolcall.data_config(learning_toolcall.DEFAULT_CONFIG, "generated", tmp_path)
    env = learning_toolcall.data_env(cfg, split)
    tasks = list(env.tasks)[:40]
    env.close()
    result = {"stage": "s", "data": "generated", "answers": [{"task_id": t.id} for t in tasks]}
    kept = {"task_id": tasks[0].id, "expects_calls": "as saved"}
    result["answers"].append(kept)
    learning_toolcall.mark_call_tasks(learning_toolcall.DEFAULT_CONFIG, [result], tmp_path)
    assert [a["expects_calls"] for a in result["answers"][:-1]] == [bool(t.data.get("expected_calls")) for t in tasks]
    assert {True, False} <= {a["expects_calls"] for a in result["answers"][:-1]}
    assert kept["expects_calls"] == "as saved"


def test_stage_order_reads_each_pair_before_then_after():
    order = learning_toolcall.stage_order([("sft", "base"), ("rl", "sft"), ("rl2", "rl")])
    assert order == {"base": 0, "sft": 1, "rl": 2, "rl2": 3}
    assert [s for s in sorted(order, key=order.get)] == ["base", "sft", "rl", "rl2"]
