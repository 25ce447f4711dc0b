"""The tool-call estimator study's setting builds and trains (studies/study_toolcall.py, studies/configs/study_toolcall.yaml)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from corrgrpo_envs.toolcall.generator import generate_task
from studies import study_toolcall

ROOT = Path(__file__).resolve().parents[1]


def test_generator_options_keep_the_default_tasks_and_shorten_the_prompt():
    # the defaults are the original data set; the options only cut distractors and the prompt
    assert generate_task(0, 11) == generate_task(0, 11, max_extra_tools=3, prompt="rlla")
    short = generate_task(0, 11, max_extra_tools=0, prompt="short")
    full = generate_task(0, 11)
    assert short["expected_calls"] == full["expected_calls"] and short["kind"] == full["kind"]
    assert len(short["tools"]) == (2 if short["kind"] == "multi" else 1)
    assert short["messages"][0]["content"].startswith("Tools:\n")
    assert len(short["messages"][0]["content"]) < len(full["messages"][0]["content"]) / 5
    with pytest.raises(ValueError, match="prompt"):
        generate_task(0, 0, prompt="long")


def test_study_setting_trains_one_step_and_evaluates(tmp_path):
    from corrgrpo.trainer.config import load_config
    from corrgrpo.trainer.trainer import Trainer

    torch.set_num_threads(1)
    cfg = study_toolcall._rl_config()
    assert cfg.env.dataset_options == {"max_extra_tools": 1, "prompt": "short"}
    init = study_toolcall.build_init_model(tmp_path / "init", env=cfg.env, num_tasks=24)
    _, tokenizer = __import__("corrgrpo.agents.models", fromlist=["load_model"]).load_model(str(init))
    assert tokenizer.chat_template == study_toolcall.CHAT_TEMPLATE
    run = tmp_path / "run"
    cfg = load_config(
        study_toolcall.RL_CONFIG,
        [f"model.name_or_path={init}", "env.num_tasks=24", "train.steps=1", "algorithm.prompts_per_step=2",
         "algorithm.group_size=2", "rollout.max_new_tokens=8", f"train.output_dir={run}",
         "algorithm.estimator=corrgrpo"],
    )
    Trainer(cfg).train()
    rec = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    for name in ("function_name", "parameter", "values", "format"):
        assert f"reward/{name}/mean" in rec
    # a random-init model writes no parseable answer: every group is constant, so no advantage
    assert 0.0 <= rec["zero_variance_fraction"] <= 1.0
    model = study_toolcall.final_model(run)
    assert (model / "config.json").exists()


def test_analyze_eval_pairs_by_seed(tmp_path):
    metrics = {"grpo": [10.0, 20.0, 30.0], "corrgrpo": [12.0, 21.0, 33.0]}
    for est, values in metrics.items():
        for seed, v in enumerate(values):
            d = tmp_path / "toolcall" / f"{est}-s{seed}"
            d.mkdir(parents=True)
            m = {c: v for c in study_toolcall.EVAL_METRICS}
            (d / "eval.json").write_text(json.dumps({"metrics": m}))
    res = study_toolcall.analyze_eval(tmp_path, ["grpo", "corrgrpo"], [0, 1, 2])
    acc = res["estimators"]["corrgrpo"]["vs_grpo"]["all_exact_accuracy"]
    assert acc["diff"] == pytest.approx(2.0) and acc["n"] == 3
    assert 0 < acc["p"] < 1 and acc["p_holm"] == pytest.approx(min(1.0, 5 * acc["p"]))
    assert res["estimators"]["grpo"]["after"]["format"]["mean"] == pytest.approx(20.0)
    assert res["before"] is None
