"""Our estimators and envs in verl (trainer/integrations/verl.py, docs/verl.md).

The reward function and the metrics run in the main suite. The parts that need verl run in
``.venv-verl`` (``bash scripts/verl_venv.sh`` builds it, with this project installed): the
driver test below runs this file there with pytest, and skips with that reason when the
venv is missing, except under ``CI=true`` (or 1, yes), where a missing venv fails. verl's trainer needs
GPUs and Ray; what runs here is verl's own ``compute_advantage`` on a ``DataProto``, its
metrics function and its reward loop worker.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from corrgrpo.trainer.estimators import available_estimators, compute_advantages, register_estimator
from corrgrpo.trainer.estimators.reward_metrics import estimator_metrics, reward_metrics
from corrgrpo.trainer.integrations.verl import (
    RESERVED_KEYS,
    compute_score,
    corrgrpo_metrics,
    dataset_rows,
    verl_name,
)
from corrgrpo_envs.toy.rewards import score_text

ROOT = Path(__file__).resolve().parents[1]
VERL_PYTHON = ROOT / ".venv-verl" / "bin" / "python"
TOY = "corrgrpo/ScaleDominance-v0"
NAMES = ["digits", "has_a", "word_with_a"]
HAS_VERL = importlib.util.find_spec("verl") is not None
#: set in the .venv-verl run, so that a verl that does not import fails instead of skipping
IN_VERL_VENV = "CORRGRPO_TEST_IN_VERL_VENV"
needs_verl = pytest.mark.skipif(
    not HAS_VERL and not os.environ.get(IN_VERL_VENV),
    reason="verl is not installed here; test_verl_parts_run_in_the_verl_venv runs these in .venv-verl",
)
TEXTS = ["cat 123", "a 9", "zz", "banana 12345", "", "aaaa 1", "hello", "a a a 77"]


# ------------------------------------------------------------------ main suite, no verl
def test_importing_the_integration_without_verl_installed():
    if HAS_VERL:
        pytest.skip("verl is installed here")
    code = (
        "import sys, trainer, corrgrpo.trainer.integrations.verl as v;"
        "assert 'verl' not in sys.modules, 'verl imported';"
        "print(v.compute_score('corrgrpo/ScaleDominance-v0', 'ab 12', None, {'task_id': 'prompt-0000'}))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().replace("'", '"')) == {
        "digits": 2.0,
        "has_a": 1.0,
        "word_with_a": 1.0,
        "score": 4.0,
    }


def test_compute_score_returns_the_components_and_the_weighted_score():
    row = {
        "task_id": "prompt-0003",
        "num_turns": None,
        "rollout_reward_scores": {},
    }  # as verl passes it
    for text in TEXTS:
        out = compute_score(TOY, text, "", row)
        assert list(out) == [*NAMES, "score"]
        np.testing.assert_array_equal([out[n] for n in NAMES], score_text(text))
        assert out["score"] == pytest.approx(float(np.sum(score_text(text))))
    weighted = compute_score(TOY, "banana 12345", None, row, reward_weights=[0.1, 1.0, 2.0])
    assert weighted["score"] == pytest.approx(0.1 * 5 + 1 + 2)
    # the env's own weights (env_kwargs) are the default weights of score
    own = compute_score(TOY, "banana 12345", None, row, env_kwargs={"reward_weights": [0.5, 0, 0]})
    assert own["score"] == pytest.approx(2.5) and own["digits"] == 5.0


def test_compute_score_keeps_each_reset_and_step_together_under_threads():
    """verl's reward managers call compute_score from a thread pool: one env, many threads."""
    rows = [{"task_id": f"prompt-{k:04d}"} for k in range(8)]
    results: dict[int, dict[str, float]] = {}

    def work(i: int) -> None:
        for _ in range(20):
            results[i] = compute_score(TOY, TEXTS[i], None, rows[i])
            assert [results[i][n] for n in NAMES] == list(score_text(TEXTS[i]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 8


def test_compute_score_refuses_what_a_data_file_must_not_choose():
    row = {"task_id": "prompt-0000"}
    # a data_source is a registered id, never an entry point that imports a module
    with pytest.raises(ValueError, match="'os:system' is not a registered corrgrpo env id"):
        compute_score("os:system", "x", None, row)
    with pytest.raises(ValueError, match="needs extra_info.task_id"):
        compute_score(TOY, "x", None, {})
    with pytest.raises(ValueError, match="at most 10000 characters"):
        compute_score(TOY, "x", None, {**row, "env_kwargs": "{" + " " * 20_000 + "}"})
    with pytest.raises(ValueError, match="must be a JSON object"):
        compute_score(TOY, "x", None, {**row, "env_kwargs": "[1, 2]"})
    with pytest.raises(ValueError, match="2 entries for the components"):
        compute_score(TOY, "x", None, row, reward_weights=[1, 1])
    # the config (reward_kwargs.env_id), not the data file, may name any env make() takes
    out = compute_score("anything", "ab 1", None, row, env_id=TOY)
    assert out["score"] == 3.0
    assert {"score", "uid", "data_source"} <= RESERVED_KEYS


def test_dataset_rows_are_scored_with_the_env_they_were_made_with():
    rows = dataset_rows(TOY, split="all", num_tasks=5)
    assert [r["extra_info"]["task_id"] for r in rows] == [f"prompt-{k:04d}" for k in range(5)]
    assert rows[3]["prompt"] == [{"role": "user", "content": "write a short string: 3"}]
    assert rows[0]["data_source"] == TOY and rows[0]["reward_model"]["ground_truth"] == ""
    assert json.loads(rows[0]["extra_info"]["env_kwargs"]) == {"num_tasks": 5, "split": "all"}
    out = compute_score(rows[4]["data_source"], "a cat 12", None, rows[4]["extra_info"])
    assert out == {"digits": 2.0, "has_a": 1.0, "word_with_a": 1.0, "score": 4.0}


def test_metrics_carry_our_names_under_corrgrpo():
    rng = np.random.default_rng(1)
    rewards = rng.normal(size=(16, 3)) * [5.0, 1.0, 0.2]
    rewards[:4] = [1.0, 2.0, 3.0]  # a zero-variance group
    weights = np.array([1.0, 0.5, 2.0])
    result = compute_advantages(rewards, np.arange(16) // 4, "corrgrpo", weights)
    stats = result.stats.to_dict()
    metrics = corrgrpo_metrics(rewards, weights, NAMES, stats)
    ours = reward_metrics(rewards, weights, NAMES, stats)
    for key in (
        "c_q/median",
        "k_eff/mean",
        "cov_share/digits",
        "zero_variance_fraction",
        "reward/has_a/mean",
    ):
        assert metrics[f"corrgrpo/{key}"] == pytest.approx(ours[key], rel=1e-12)
    assert metrics["corrgrpo/zero_variance_fraction"] == 0.25
    corr = ours["reward_correlation"]
    assert metrics["corrgrpo/reward_correlation/digits/word_with_a"] == pytest.approx(corr[0][2])
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
    assert (
        verl_name("grpo", frozenset({"grpo"})) == "corrgrpo_grpo"
        and verl_name("mo_grpo") == "mo_grpo"
    )


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_verl_parts_run_in_the_verl_venv():
    if HAS_VERL:
        pytest.skip("verl imports in this interpreter: the verl tests of this file ran here")
    if not VERL_PYTHON.exists():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(
                ".venv-verl is missing under CI=true: bash scripts/verl_venv.sh did not build it"
            )
        pytest.skip(".venv-verl is missing (bash scripts/verl_venv.sh builds it)")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),  # this checkout, whatever the venv's install points at
        IN_VERL_VENV: "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONWARNINGS": "ignore",
    }
    here = Path(__file__).relative_to(ROOT)
    tests = [
        f"{here}::{name}"
        for name in globals()
        if name.startswith("test_verl_") and name != "test_verl_parts_run_in_the_verl_venv"
    ]
    proc = subprocess.run(
        [str(VERL_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", *tests],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, tail
    assert "skipped" not in proc.stdout.splitlines()[-1], tail


# ------------------------------------------------------------------ in .venv-verl
def _batch(rewards: np.ndarray, group_ids: list[int], response_length: int = 6, seed: int = 0):
    """A DataProto as verl's legacy trainer has it at the advantage step: the components are
    ``non_tensor_batch`` columns (compute_score's keys), ``uid`` the group of each response."""
    import torch
    from verl import DataProto

    n = rewards.shape[0]
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, response_length + 1, size=n)
    mask = (torch.arange(response_length)[None, :] < torch.as_tensor(lengths)[:, None]).float()
    # the weighted score on the last response token, as verl's reward managers put it
    scalar = torch.zeros(n, response_length)
    scalar[torch.arange(n), torch.as_tensor(lengths) - 1] = torch.as_tensor(
        np.nansum(rewards * np.array(WEIGHTS), axis=1), dtype=torch.float32
    )
    columns = {}
    for k, name in enumerate(NAMES):
        col = rewards[:, k]
        # None where a component does not apply, as compute_score's dicts give object arrays
        columns[name] = np.array([None if math.isnan(v) else float(v) for v in col], dtype=object)
    uids = np.array([f"uid-{g}" for g in group_ids], dtype=object)
    return DataProto.from_dict(
        tensors={"token_level_rewards": scalar, "response_mask": mask},
        non_tensors={"uid": uids, **columns},
    )


#: the weights of _algo_config and of the token-level scores of _batch
WEIGHTS = [1.0, 0.5, 2.0]


def _rewards(n: int = 24, seed: int = 0) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(n, 3)) * [10.0, 1.0, 0.01] + [0.0, 5.0, 1e3]
    rewards[rng.random((n, 3)) < 0.1] = np.nan
    rewards[:4, 1] = 2.0  # a component that does not vary in a group
    group_ids = list(rng.permutation(np.arange(n) % 5))  # uneven groups, in any order
    return rewards, group_ids


def _algo_config(estimator: str, **extra):
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "adv_estimator": estimator,
            "gdpo_reward_keys": NAMES,
            "gdpo_reward_weights": [1.0, 0.5, 2.0],
            **extra,
        }
    )


#: the estimators of the issue's arena, beside today's eight
NEW_ESTIMATORS = ["saw", "gd2po", "dara", "dvao", "rvpo", "rdpo"]
#: those whose batch means weigh a response by its trained tokens
TOKEN_WEIGHTED = {"saw", "gd2po", "dara", "rvpo"}


@needs_verl
@pytest.mark.parametrize(
    ("estimator", "options"),
    [
        (name, {})
        for name in [
            "corrgrpo", "mo_grpo", "dr_grpo", "gdpo_corr", "reinforce_pp", "grpo", "gdpo", "rloo",
            *NEW_ESTIMATORS,
        ]
    ]
    + [("gd2po", {"keep_weight": "loss"})],
    ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={x}" for k, x in v.items()),
)
def test_verl_compute_advantage_equals_ours(estimator, options):
    import torch
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import core_algos, ray_trainer

    from corrgrpo.trainer.integrations.verl import register

    name = register()[estimator]
    assert name == (f"corrgrpo_{estimator}" if estimator in ("grpo", "gdpo", "rloo") else estimator)
    rewards, group_ids = _rewards()
    tokens = _batch(rewards, group_ids).batch["response_mask"].sum(dim=1)
    result = compute_advantages(
        rewards, group_ids, estimator, [1.0, 0.5, 2.0], token_counts=tokens, **options
    )
    ours = result.loss_weighted_advantages.double()
    configs = [_algo_config(name, corrgrpo_options=options)]  # hydra's DictConfig, as the trainer has it
    if not options:
        configs.append(
            AlgoConfig(adv_estimator=name, gdpo_reward_keys=NAMES, gdpo_reward_weights=[1.0, 0.5, 2.0])
        )
    for config in configs:
        data = ray_trainer.compute_advantage(
            _batch(rewards, group_ids), adv_estimator=name, config=config
        )
        adv, mask = data.batch["advantages"].double(), data.batch["response_mask"]
        assert data.batch["returns"].equal(data.batch["advantages"])
        expected = ours[:, None] * mask
        torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)
        assert float(ours.abs().max()) > 0.5  # the test compares real values
    if estimator in TOKEN_WEIGHTED:  # the response lengths changed the advantages
        plain = compute_advantages(rewards, group_ids, estimator, [1.0, 0.5, 2.0], **options)
        assert not torch.allclose(plain.advantages, result.advantages, rtol=1e-3)
    if options:  # the keep weight on the loss: some prompts lost responses
        assert (result.loss_weight < 1).any()
        assert not torch.equal(result.advantages, result.loss_weighted_advantages)
    # verl's own estimators are untouched
    assert not hasattr(core_algos.get_adv_estimator_fn("grpo"), "corrgrpo_estimator")


@needs_verl
@pytest.mark.parametrize(
    "loss_mode",
    ["vanilla", "gspo", "gpg", "cispo", "sapo", "geo_mean", "dppo_tv", "dppo_kl", "bypass_mode"],
)
def test_verl_policy_loss_of_weighted_advantages_weighs_each_response(loss_mode):
    """An estimator's loss weight reaches verl's actor as the advantage times the weight: the
    policy loss of ``w * A`` is ``sum_j w_j`` times response j's policy term (its loss alone),
    with ratios away from 1 so that clipping acts."""
    import torch
    from verl.trainer.ppo import core_algos
    from verl.workers.config import ActorConfig

    config = ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=1)
    generator = torch.Generator().manual_seed(0)
    n, length = 6, 5
    mask = (torch.arange(length)[None] < torch.tensor([5, 2, 4, 1, 3, 5])[:, None]).float()
    log_prob = -3 * torch.rand(n, length, generator=generator)
    old_log_prob = log_prob + 0.6 * torch.randn(n, length, generator=generator)
    advantages = torch.randn(n, generator=generator)
    weights = torch.tensor([0.0, 0.5, 1.0, 2.0, 0.25, 1.5])
    loss_fn = core_algos.get_policy_loss_fn(loss_mode)

    def loss(a: torch.Tensor) -> float:
        return float(
            loss_fn(
                old_log_prob=old_log_prob, log_prob=log_prob, advantages=a[:, None] * mask,
                response_mask=mask, loss_agg_mode="token-mean", config=config,
            )[0]
        )

    alone = [loss(advantages * (torch.arange(n) == j)) for j in range(n)]
    weighted = loss(advantages * weights)
    assert weighted == pytest.approx(sum(w * v for w, v in zip(weights.tolist(), alone)), rel=1e-5)
    assert abs(weighted - loss(advantages)) > 1e-3  # the weights changed the loss


@needs_verl
def test_verl_metrics_of_the_step_carry_our_diagnostics():
    import torch
    from verl.trainer.ppo import ray_trainer

    from corrgrpo.trainer.integrations.verl import register

    register()
    rewards, group_ids = _rewards(seed=3)
    data = ray_trainer.compute_advantage(
        _batch(rewards, group_ids), adv_estimator="corrgrpo", config=_algo_config("corrgrpo")
    )
    n, length = rewards.shape[0], data.batch["response_mask"].shape[1]
    data.batch["token_level_scores"] = data.batch["token_level_rewards"]
    data.batch["prompts"] = torch.ones(n, 3, dtype=torch.long)
    data.batch["responses"] = torch.ones(n, length, dtype=torch.long)
    data.batch["attention_mask"] = torch.cat([torch.ones(n, 3), data.batch["response_mask"]], dim=1)
    metrics = ray_trainer.compute_data_metrics(batch=data, use_critic=False)
    result = compute_advantages(rewards, group_ids, "corrgrpo", [1.0, 0.5, 2.0])
    expected = corrgrpo_metrics(rewards, np.array([1.0, 0.5, 2.0]), NAMES, result.stats.to_dict())
    for key in (
        "corrgrpo/c_q/median",
        "corrgrpo/k_eff/mean",
        "corrgrpo/cov_share/digits",
        "corrgrpo/zero_variance_fraction",
    ):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-9)
    assert "critic/advantages/mean" in metrics  # verl's own metrics are still there
    assert not any(key.startswith("corrgrpo/estimator/") for key in metrics)  # CorrGRPO reports none

    # an estimator's own diagnostics (GD²PO's ratios, per reward: DARA's densities) by name
    for estimator in ("gd2po", "dara"):
        batch = _batch(rewards, group_ids)
        tokens = batch.batch["response_mask"].sum(dim=1)
        data = ray_trainer.compute_advantage(
            batch, adv_estimator=estimator, config=_algo_config(estimator)
        )
        data.batch["token_level_scores"] = data.batch["token_level_rewards"]
        data.batch["prompts"] = torch.ones(n, 3, dtype=torch.long)
        data.batch["responses"] = torch.ones(n, length, dtype=torch.long)
        data.batch["attention_mask"] = torch.cat(
            [torch.ones(n, 3), data.batch["response_mask"]], dim=1
        )
        metrics = ray_trainer.compute_data_metrics(batch=data, use_critic=False)
        result = compute_advantages(
            rewards, group_ids, estimator, [1.0, 0.5, 2.0], token_counts=tokens
        )
        ours = estimator_metrics(result.metrics, NAMES)
        assert ours and {f"corrgrpo/{key}": value for key, value in ours.items()} == {
            key: value for key, value in metrics.items() if key.startswith("corrgrpo/estimator/")
        }
    assert "corrgrpo/estimator/density/word_with_a" in metrics


@needs_verl
def test_verl_trainer_entry_point_imports():
    """``python -m verl.trainer.main_ppo`` starts: hydra-core and what the module imports are in
    the venv (scripts/verl_venv.sh)."""
    import importlib

    module = importlib.import_module("verl.trainer.main_ppo")
    assert callable(module.main) and module.hydra.__version__ == "1.3.8"


@needs_verl
def test_verl_reward_terms_beyond_the_components_and_disagreeing_weights_stop_the_step():
    from verl.trainer.ppo import ray_trainer

    from corrgrpo.trainer.integrations.verl import register

    register()
    rewards, group_ids = _rewards(seed=5)
    data = ray_trainer.compute_advantage(
        _batch(rewards, group_ids), adv_estimator="corrgrpo", config=_algo_config("corrgrpo")
    )
    assert data.meta_info["corrgrpo_metrics"]["corrgrpo/estimator_used/corrgrpo"] == 1.0
    with pytest.raises(ValueError, match=re.escape("algorithm.use_kl_in_reward=True would not reach")):
        ray_trainer.compute_advantage(
            _batch(rewards, group_ids),
            adv_estimator="corrgrpo",
            config=_algo_config("corrgrpo", use_kl_in_reward=True),
        )
    penalised = _batch(rewards, group_ids)  # a per-token penalty, as verl's apply_kl_penalty leaves
    penalised.batch["token_level_rewards"] -= 0.01 * penalised.batch["response_mask"]
    with pytest.raises(ValueError, match=r"token_level_rewards sum to .* on row 0 where the weighted "
                       r"components of algorithm.gdpo_reward_keys give"):
        ray_trainer.compute_advantage(penalised, adv_estimator="corrgrpo", config=_algo_config("corrgrpo"))
    scored = _batch(rewards, group_ids)  # compute_score's 'score' with reward_kwargs' other weights
    scored.non_tensor_batch["score"] = np.array(
        [float(v) for v in np.nansum(rewards * [0.1, 1.0, 1.0], axis=1)], dtype=object
    )
    with pytest.raises(ValueError, match=re.escape(
        "algorithm.gdpo_reward_weights [1.0, 0.5, 2.0] do not give the 'score' compute_score returned"
    )):
        ray_trainer.compute_advantage(scored, adv_estimator="corrgrpo", config=_algo_config("corrgrpo"))
    agreed = _batch(rewards, group_ids)
    agreed.non_tensor_batch["score"] = np.array(
        [float(v) for v in np.nansum(rewards * WEIGHTS, axis=1)], dtype=object
    )
    out = ray_trainer.compute_advantage(agreed, adv_estimator="corrgrpo", config=_algo_config("corrgrpo"))
    assert float(out.batch["advantages"].abs().max()) > 0.5


@needs_verl
def test_verl_plugin_options_and_refusals():
    from verl.trainer.ppo import core_algos, ray_trainer

    from corrgrpo.trainer.integrations.verl import VerlEstimator, register

    # importing verl alone registers ours (this project's verl.plugins entry point)
    code = (
        "import verl; from verl.trainer.ppo import core_algos as c;"
        "print(sorted(k for k, f in c.ADV_ESTIMATOR_REGISTRY.items() if hasattr(f, 'corrgrpo_estimator')))"
    )
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        cwd="/",
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # this checkout's entry point and estimators
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    registered = json.loads(out.stdout.strip().splitlines()[-1].replace("'", '"'))
    assert {"corrgrpo", "mo_grpo", "corrgrpo_gdpo", "corrgrpo_grpo"} <= set(registered)
    assert set(registered) == {
        verl_name(n, {"grpo", "gdpo", "rloo"}) for n in available_estimators()
    }

    # a plug-in of our registry, registered after the import, and an option from the config
    @register_estimator("verl_test_scaled_corrgrpo", override=True)
    def scaled(groups, *, factor: float = 1.0):
        from corrgrpo.trainer.estimators import corrgrpo_advantages

        return factor * corrgrpo_advantages(groups)

    assert register(["verl_test_scaled_corrgrpo"]) == {
        "verl_test_scaled_corrgrpo": "verl_test_scaled_corrgrpo"
    }
    rewards, group_ids = _rewards(seed=5)
    config = _algo_config("verl_test_scaled_corrgrpo", corrgrpo_options={"factor": 3.0})
    data = ray_trainer.compute_advantage(
        _batch(rewards, group_ids), adv_estimator="verl_test_scaled_corrgrpo", config=config
    )
    ours = compute_advantages(rewards, group_ids, "corrgrpo", [1.0, 0.5, 2.0]).advantages
    np.testing.assert_allclose(
        data.batch["advantages"].max(dim=1).values.numpy()[ours > 0],
        3.0 * ours.numpy()[ours > 0],
        atol=1e-5,
    )

    batch = _batch(rewards, group_ids)
    with pytest.raises(ValueError, match="needs algorithm.gdpo_reward_keys"):
        ray_trainer.compute_advantage(
            batch, adv_estimator="corrgrpo", config=_algo_config("corrgrpo", gdpo_reward_keys=None)
        )
    with pytest.raises(
        KeyError, match="reward key 'format' .* compute_score must return a dict with 'format'"
    ):
        ray_trainer.compute_advantage(
            batch,
            adv_estimator="corrgrpo",
            config=_algo_config("corrgrpo", gdpo_reward_keys=["digits", "format", "x"]),
        )
    with pytest.raises(ValueError, match="has 2 entries for the 3 keys"):
        ray_trainer.compute_advantage(
            batch,
            adv_estimator="corrgrpo",
            config=_algo_config("corrgrpo", gdpo_reward_weights=[1, 1]),
        )
    with pytest.raises(ValueError, match="unknown option"):
        ray_trainer.compute_advantage(
            batch,
            adv_estimator="corrgrpo",
            config=_algo_config("corrgrpo", corrgrpo_options={"factr": 1}),
        )
    batch.non_tensor_batch["has_a"] = np.array(["1"] * len(batch), dtype=object)
    with pytest.raises(ValueError, match="reward key 'has_a', row 0: str is not a number"):
        ray_trainer.compute_advantage(
            batch, adv_estimator="corrgrpo", config=_algo_config("corrgrpo")
        )
    # called the way verl's compute_advantage calls every estimator but 'gdpo' (no batch)
    fn = core_algos.get_adv_estimator_fn("corrgrpo")
    assert isinstance(fn, VerlEstimator) or type(fn).__name__ == "VerlEstimator"
    with pytest.raises(RuntimeError, match="verl passes them to 'gdpo' only"):
        fn(
            token_level_rewards=batch.batch["token_level_rewards"],
            response_mask=batch.batch["response_mask"],
            index=batch.non_tensor_batch["uid"],
            config=_algo_config("corrgrpo"),
        )
    # verl's GDPO still gets its batch through the wrapped compute_advantage
    gdpo = _batch(np.nan_to_num(rewards), group_ids)
    n = len(gdpo)
    import torch

    gdpo.batch["prompts"] = torch.ones(n, 2, dtype=torch.long)
    gdpo.batch["attention_mask"] = torch.cat(
        [torch.ones(n, 2), gdpo.batch["response_mask"]], dim=1
    ).long()
    out = ray_trainer.compute_advantage(gdpo, adv_estimator="gdpo", config=_algo_config("gdpo"))
    assert (
        "corrgrpo_metrics" not in out.meta_info and float(out.batch["advantages"].abs().sum()) > 0
    )


def _tiny_tokenizer(path: Path) -> None:
    """A byte-level BPE trained on the fly (a few hundred tokens), saved as a Hugging Face tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(
        TEXTS * 10 + ["write a short string"],
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<|pad|>", "<|end|>"],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    PreTrainedTokenizerFast(
        tokenizer_object=raw, pad_token="<|pad|>", eos_token="<|end|>"
    ).save_pretrained(path)


@needs_verl
def test_verl_reward_loop_worker_scores_with_compute_score(tmp_path):
    """verl's reward loop worker (what its Ray reward workers run), with compute_score loaded the
    way verl loads a custom reward function (``pkg://`` path), returns our components."""
    import torch
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl import DataProto
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    _tiny_tokenizer(tmp_path / "tok")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tok")
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {"model": {"path": str(tmp_path / "tok"), "tokenizer_path": None}},
            "reward": {
                "reward_model": {"enable": False},
                "reward_manager": {"source": "register", "name": "naive"},
                "custom_reward_function": {
                    "path": "pkg://trainer.integrations.verl",
                    "name": "compute_score",
                    "reward_kwargs": {"reward_weights": [0.1, 1.0, 2.0]},
                },
            },
        }
    )
    worker = RewardLoopWorker(config)
    rows = dataset_rows(TOY, split="all", num_tasks=len(TEXTS))
    pad = tokenizer.pad_token_id
    encoded = [tokenizer(t)["input_ids"] for t in TEXTS]
    length = max(len(e) for e in encoded) + 1
    responses = torch.full((len(TEXTS), length), pad, dtype=torch.long)
    for i, ids in enumerate(encoded):
        responses[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    response_mask = torch.tensor(
        [[j < len(e) for j in range(length)] for e in encoded], dtype=torch.long
    )
    prompts = torch.ones(len(TEXTS), 2, dtype=torch.long)
    data = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "attention_mask": torch.cat([torch.ones_like(prompts), response_mask], dim=1),
        },
        non_tensors={
            key: np.array([r[key] for r in rows], dtype=object)
            for key in ("data_source", "reward_model", "extra_info")
        },
    )
    outputs = worker.loop.run_until_complete(
        worker.compute_score_batch(data)
    )  # the worker's own loop
    for text, out in zip(TEXTS, outputs):
        info = out["reward_extra_info"]
        assert [info[n] for n in NAMES] == list(score_text(text)), text
        expected = float(np.dot([0.1, 1.0, 2.0], score_text(text)))
        assert info["score"] == pytest.approx(expected) and out["reward_score"] == pytest.approx(
            expected
        )


@needs_verl
def test_verl_docs_blocks_run_as_written(tmp_path, monkeypatch, capsys):
    """docs/verl.md's python blocks: the parquet files, then the CPU block."""
    import pandas as pd

    blocks = re.findall(
        r"```python\n(.*?)```", (ROOT / "docs" / "verl.md").read_text(), flags=re.DOTALL
    )
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, str(ROOT / "docs" / "verl.md"), "exec"), {"__name__": "docs_verl"})
    k_eff = float(capsys.readouterr().out.strip().splitlines()[-1])
    assert 1.0 <= k_eff <= 3.0
    # a row as verl reads it back from the parquet file is scored on its task
    row = pd.read_parquet(tmp_path / "eval.parquet").iloc[3]
    out = compute_score(row["data_source"], "a cat 12", None, dict(row["extra_info"]))
    assert (
        row["extra_info"]["task_id"] == dataset_rows(TOY, split="eval")[3]["extra_info"]["task_id"]
    )
    assert [out[n] for n in NAMES] == list(score_text("a cat 12"))
