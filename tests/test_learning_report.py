"""The learning report: Wilson intervals in the tool-calling metrics, seeded samples, the table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from corrgrpo_envs.toolcall.metrics import toolcall_metrics, wilson_interval

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
try:
    import learning_toolcall
finally:
    sys.path.pop(0)


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


def test_evaluate_plays_exactly_the_given_task_ids_and_rejects_unknown_ones():
    from trainer.config import load_config
    from trainer.evaluate import evaluate

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
