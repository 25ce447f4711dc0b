"""corrgrpo's estimators, diagnostics, schedules and gates inside TRL's GRPOTrainer.

The hooks' logic runs here on a stand-in for ``GRPOTrainer`` (the attributes and methods the
hooks use). Training through TRL runs in the TRL venv (``bash scripts/trl_venv.sh``) in one
subprocess: docs/trl.md's example (CorrGRPO with a weight schedule and a gate), ``mo_grpo``, a
plug-in estimator by entry point and TRL's own aggregation, each two steps of a tiny random-init
model on the toy domain; the subprocess records each batch's gathered reward matrix, the
advantages TRL's batch carries and those its loss receives, and the checks run here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import defaultdict, deque
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from corrgrpo.trainer.estimators import compute_advantages
from corrgrpo.trainer.estimators.reward_metrics import estimator_metrics, reward_metrics
from corrgrpo.trainer.integrations.trl import (
    METRIC_PREFIX,
    CorrGRPOMixin,
    bounds_of,
    diagnostic_metrics,
    group_ids_of,
    trained_tokens,
)
from tests.launched import run_bounded
from tests.ports import free_port
from tests.trl_venv import ROOT, require_trl_venv, run_in_trl_venv, trl_venv_env

DOCS = ROOT / "docs" / "trl.md"
README = ROOT / "README.md"
NAMES = ["digits", "has_a", "word_with_a"]
PLUGIN = "tests.test_trl_estimators:scaled_dr_grpo"
#: the estimators of the issue's arena, beside today's eight
NEW_ESTIMATORS = ["saw", "gd2po", "dara", "dvao", "rvpo", "rdpo"]
#: those whose batch means weigh a response by its trained tokens
TOKEN_WEIGHTED = {"saw", "gd2po", "dara", "rvpo"}


def scaled_dr_grpo(groups, *, factor: float = 2.0) -> torch.Tensor:
    """A plug-in estimator by entry point: ``factor`` times Dr. GRPO's centred weighted sum."""
    return factor * groups.weighted.sum(dim=1)


# --------------------------------------------------------------------------- #
# Without TRL: the hooks on a stand-in for GRPOTrainer
# --------------------------------------------------------------------------- #
class _FakeGRPOTrainer:
    """What the hooks read of TRL's GRPOTrainer; ``_calculate_rewards`` returns a fixed gathered matrix
    and the batch's completions have the trained tokens ``lengths`` (default 4 each)."""

    def __init__(self, *, rewards, num_generations, rank=0, world=1, weights=None, lengths=None,
                 aggregation="sum_then_normalize", scale_rewards="group", **_):
        self.gathered = torch.as_tensor(rewards, dtype=torch.float32)
        self.lengths = torch.full((len(rewards),), 4.0) if lengths is None else torch.as_tensor(lengths).float()
        self.reward_func_names = list(NAMES)
        self.reward_weights = torch.tensor(weights or [1.0, 1.0, 1.0])
        self.num_generations = self.num_generations_eval = num_generations
        self.accelerator = SimpleNamespace(process_index=rank, num_processes=world, gather=self._gather)
        self.model = SimpleNamespace(training=True)
        self.state = SimpleNamespace(global_step=0)
        self.multi_objective_aggregation, self.scale_rewards = aggregation, scale_rewards
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._logs = {"advantages": deque(maxlen=64)}

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        return self.gathered.clone()

    def _rows(self, local: int) -> slice:
        rank = self.accelerator.process_index
        return slice(rank * local, (rank + 1) * local)

    def _gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """accelerate's gather: every process's tensor, concatenated in rank order."""
        torch.testing.assert_close(tensor, self.lengths[self._rows(len(tensor))])  # this process's part
        return self.lengths.clone()

    def _generate_and_score_completions(self, inputs):
        self._calculate_rewards(inputs, None, None, None)
        local = len(inputs)
        self._logs["advantages"].extend([7.0] * len(self.gathered))  # TRL's own, to be replaced
        lengths = self.lengths[self._rows(local)]
        width = int(self.lengths.max()) + 2  # padded, as TRL pads the completions
        mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
        return {"advantages": torch.full((local,), 7.0), "completion_mask": mask}


class _Hooked(CorrGRPOMixin, _FakeGRPOTrainer):
    pass


def _rewards(seed: int = 0, groups: int = 4, size: int = 4) -> np.ndarray:
    rng = np.random.default_rng(seed)
    digits = rng.integers(0, 10, groups * size).astype(float)
    has_a = rng.integers(0, 2, groups * size).astype(float)
    return np.stack([digits, has_a, has_a * rng.integers(0, 2, groups * size)], axis=1)


def test_importing_the_integration_imports_no_trl():
    code = ("import sys, corrgrpo.trainer.integrations.trl, corrgrpo.trainer.advice, corrgrpo.trainer.cli;"
            "assert 'trl' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_each_process_takes_its_slice_of_the_advantages_of_the_gathered_batch():
    rewards = _rewards()
    whole = compute_advantages(rewards, np.arange(16) // 4, "corrgrpo", [1.0, 1.0, 1.0]).advantages
    assert whole.abs().max() > 0
    for rank in (0, 1):
        trainer = _Hooked(rewards=rewards, num_generations=4, rank=rank, world=2)
        out = trainer._generate_and_score_completions([{}] * 8)
        torch.testing.assert_close(out["advantages"], whole[rank * 8:(rank + 1) * 8], rtol=0, atol=0)
        assert list(trainer._logs["advantages"]) == pytest.approx(whole.tolist())  # whole batch, as TRL logs
    trainer = _Hooked(rewards=rewards, num_generations=4, rank=0, world=2)
    with pytest.raises(ValueError, match="16 gathered rewards for 2 processes of 6 completions"):
        trainer._generate_and_score_completions([{}] * 6)


@pytest.mark.parametrize(("estimator", "options"), [(name, {}) for name in NEW_ESTIMATORS]
                         + [("gd2po", {"keep_weight": "loss"})], ids=lambda v: v if isinstance(v, str) else "")
def test_every_new_estimator_gets_the_gathered_token_counts_and_its_loss_weight(estimator, options):
    rewards = _rewards(4)
    lengths = np.random.default_rng(4).integers(1, 12, 16).astype(float)
    whole = compute_advantages(rewards, np.arange(16) // 4, estimator, [1.0, 1.0, 1.0], token_counts=lengths,
                               **options)
    applied = whole.advantages if whole.loss_weight is None else whole.advantages * whole.loss_weight
    for rank in (0, 1):
        trainer = _Hooked(rewards=rewards, num_generations=4, rank=rank, world=2, lengths=lengths,
                          estimator=estimator, estimator_options=options)
        out = trainer._generate_and_score_completions([{}] * 8)
        torch.testing.assert_close(out["advantages"], applied[rank * 8:(rank + 1) * 8], rtol=0, atol=0)
        logged = {k: v[0] for k, v in trainer._metrics["train"].items()}
        ours = estimator_metrics(whole.metrics, NAMES)
        assert ours and all(logged[METRIC_PREFIX + key] == value for key, value in ours.items())
    if estimator in TOKEN_WEIGHTED:  # the token counts changed the advantages
        plain = compute_advantages(rewards, np.arange(16) // 4, estimator, [1.0, 1.0, 1.0], **options)
        assert not torch.allclose(plain.advantages, whole.advantages, rtol=1e-3)
    if options:  # GD²PO's keep weight on the loss: some prompts lost responses, their advantages shrink
        assert (whole.loss_weight < 1).any() and not torch.equal(applied, whole.advantages)


def test_tool_output_tokens_are_not_counted():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    tools = torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]])
    assert trained_tokens({"completion_mask": mask}).tolist() == [3.0, 4.0]
    assert trained_tokens({"completion_mask": mask, "tool_mask": tools}).tolist() == [2.0, 4.0]


def test_the_logged_diagnostics_are_those_of_our_trainer():
    rewards = _rewards(1)
    trainer = _Hooked(rewards=rewards, num_generations=4, estimator="mo_grpo", weights=[0.5, 1.0, 1.0])
    trainer._generate_and_score_completions([{}] * 16)
    logged = {k[len(METRIC_PREFIX):]: v[0] for k, v in trainer._metrics["train"].items()}
    result = compute_advantages(rewards, np.arange(16) // 4, "mo_grpo", [0.5, 1.0, 1.0])
    ours = reward_metrics(rewards, np.array([0.5, 1.0, 1.0]), NAMES, result.stats.to_dict())
    for key in ("c_q/median", "k_eff/mean", "cov_share/digits", "active_fraction/has_a", "zero_variance_fraction"):
        assert logged[key] == pytest.approx(ours[key], nan_ok=True)
    assert logged["reward_correlation/has_a/word_with_a"] == pytest.approx(ours["reward_correlation"][1][2])
    shares = [logged[f"advantage_share/{n}"] for n in NAMES]
    assert sum(shares) == pytest.approx(1.0) and logged["attribution/exact"] == 1.0
    assert logged["reward_weight/digits"] == 0.5 and 0 < logged["time/overhead"] < 5


def test_the_logged_stds_divide_by_n_minus_1_as_trls_and_the_estimator_is_named():
    rewards = _rewards(4)
    rewards[5, 1] = np.nan  # not applicable: left out of the std, as TRL's nanstd does
    trainer = _Hooked(rewards=rewards, num_generations=4, estimator="gdpo", weights=[0.5, 1.0, 1.0])
    trainer._generate_and_score_completions([{}] * 16)
    logged = {k[len(METRIC_PREFIX):]: v[0] for k, v in trainer._metrics["train"].items()}
    assert logged["reward/digits/std"] == pytest.approx(float(np.std(rewards[:, 0], ddof=1)))
    assert logged["reward/has_a/std"] == pytest.approx(float(np.std(np.delete(rewards[:, 1], 5), ddof=1)))
    weighted = np.nansum(rewards * [0.5, 1.0, 1.0], axis=1)
    assert logged["reward/weighted/std"] == pytest.approx(float(np.std(weighted, ddof=1)))
    assert logged["estimator_used/gdpo"] == 1.0
    for scale, name in (("group", "grpo"), ("batch", "trl_sum_then_normalize_batch")):
        own = _Hooked(rewards=rewards, num_generations=4, estimator=None, scale_rewards=scale)
        own._generate_and_score_completions([{}] * 16)
        assert [k for k in own._metrics["train"] if "estimator_used" in k] == [f"corrgrpo/estimator_used/{name}"]


def test_an_estimator_warns_once_that_it_replaces_trls_aggregation_options(recwarn):
    _Hooked(rewards=_rewards(), num_generations=4, estimator="corrgrpo")  # TRL's defaults: nothing to say
    assert not [w for w in recwarn if "ignored" in str(w.message)]
    with pytest.warns(UserWarning) as caught:
        trainer = _Hooked(rewards=_rewards(), num_generations=4, estimator="corrgrpo",
                          aggregation="normalize_then_sum", scale_rewards="batch")
        trainer._generate_and_score_completions([{}] * 16)
        trainer._generate_and_score_completions([{}] * 16)
    messages = [str(w.message) for w in caught if "ignored" in str(w.message)]
    assert messages == ["CorrGRPOTrainer: estimator='corrgrpo' computes the advantages, so GRPOConfig's "
                        "multi_objective_aggregation='normalize_then_sum', scale_rewards='batch' is ignored "
                        "(estimator=None keeps TRL's aggregation)"]
    _Hooked(rewards=_rewards(), num_generations=4, estimator=None, scale_rewards="batch")  # TRL's own: no warning
    assert not [w for w in recwarn if "ignored" in str(w.message)]


def test_trls_own_aggregation_keeps_its_advantages_and_gets_the_diagnostics():
    trainer = _Hooked(rewards=_rewards(2), num_generations=4, estimator=None)
    out = trainer._generate_and_score_completions([{}] * 16)
    assert out["advantages"].tolist() == [7.0] * 16 and list(trainer._logs["advantages"]) == [7.0] * 16
    logged = trainer._metrics["train"]
    assert "corrgrpo/c_q/median" in logged and "corrgrpo/advantage_share/digits" in logged  # as grpo, eps 1e-4
    trainer.scale_rewards = "batch"  # no estimator of ours equals it: no advantage shares
    trainer._metrics["train"].clear()
    trainer._generate_and_score_completions([{}] * 16)
    assert "corrgrpo/c_q/median" in logged and "corrgrpo/advantage_share/digits" not in logged


def test_weight_schedule_and_gates_reach_trls_reward_matrix_and_weights():
    rewards = np.array([[3, 1, 1], [2, 0, 1], [5, 1, 0], [1, 0, 1]], dtype=float)
    trainer = _Hooked(rewards=rewards, num_generations=4, reward_weights={"has_a": {"values": [[0, 1.0], [10, 2.0]]}},
                      reward_gates={"word_with_a": ["has_a"]}, reward_bounds=([0, 0, 0], [32, 1, 1]))
    trainer.state.global_step = 5
    gated = trainer._calculate_rewards(None, None, None, None)
    assert gated[:, 2].tolist() == [1.0, 0.0, 0.0, 0.0]  # word_with_a counts only where has_a is met
    assert trainer.reward_weights.tolist() == [1.0, 1.5, 1.0]  # TRL's aggregation reads these
    metrics = trainer._metrics["train"]
    assert metrics["corrgrpo/gate/word_with_a/open_fraction"] == [0.5]
    assert metrics["corrgrpo/reward_raw/word_with_a/mean"] == [0.75]
    constant = _Hooked(rewards=rewards, num_generations=4, reward_weights=[2, 1, 1])
    assert constant.reward_weights.tolist() == [2.0, 1.0, 1.0]  # a constant list replaces GRPOConfig's


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"estimator": "nope"}, "unknown estimator 'nope'"),
    ({"estimator": "corrgrpo", "estimator_options": {"scale": "group"}}, "unknown option"),
    ({"estimator": None, "estimator_options": {"eps": 1.0}}, "estimator_options need an estimator"),
    ({"reward_weights": [1, 1]}, "reward_weights has 2 entries for 3 rewards"),
    ({"reward_weights": {"nope": 1}}, "reward_weights.nope: no reward component"),
    ({"reward_gates": {"word_with_a": ["has_b"]}, "reward_bounds": ([0] * 3, [1] * 3)},
     "reward_gates.word_with_a: 'has_b' is not a reward function"),
    ({"reward_gates": {"word_with_a": ["has_a"]}}, "reward_gates need reward_bounds"),
    ({"reward_gates": {"word_with_a": ["has_a"]}, "reward_bounds": ([0], [1])}, "reward_bounds have 1 entries"),
    ({"reward_gates": {"word_with_a": "has_a"}, "reward_bounds": 3}, "reward_bounds: expected an env"),
])
def test_bad_arguments_fail_with_one_line_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _Hooked(rewards=_rewards(), num_generations=4, **kwargs)


def test_a_reward_function_returning_inf_stops_the_step_with_the_estimators_message():
    rewards = _rewards()
    rewards[3, 0] = np.inf  # a reward function may return anything
    trainer = _Hooked(rewards=rewards, num_generations=4)
    with pytest.raises(ValueError, match="inf"):
        trainer._generate_and_score_completions([{}] * 16)


def test_helpers():
    assert group_ids_of(8, 4).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    with pytest.raises(ValueError, match="10 completions do not split into groups of num_generations=4"):
        group_ids_of(10, 4)
    import corrgrpo_envs

    env = corrgrpo_envs.make("corrgrpo/ScaleDominance-v0", num_tasks=4)
    low, high = bounds_of(env)
    assert low.tolist() == [0, 0, 0] and high.tolist() == [32, 1, 1]
    assert bounds_of(env.unwrapped.reward_space)[1].tolist() == [32, 1, 1]
    rewards = _rewards(3)
    result = compute_advantages(rewards, np.arange(16) // 4, "grpo")
    out = diagnostic_metrics(rewards, np.ones(3), NAMES, result, None)
    assert all(isinstance(v, float) for v in out.values()) and not any(k.startswith("advantage_share") for k in out)


# --------------------------------------------------------------------------- #
# In the TRL venv: two steps of GRPOTrainer per configuration
# --------------------------------------------------------------------------- #
def _docs_example() -> str:
    """docs/trl.md's CorrGRPOTrainer example, as written."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(encoding="utf-8"), flags=re.DOTALL)
    return next(b for b in blocks if "CorrGRPOTrainer(" in b)


def _readme_example() -> str:
    """The README's "Use CorrGRPO in TRL" example."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)
    return next(b for b in blocks if "CorrGRPOTrainer(" in b)


def _trl_runs(workdir: str) -> dict:
    """Runs in the TRL venv: each configuration's recorded batches and log history."""
    import os

    import corrgrpo.trainer.integrations.trl as integration
    from tests.test_trl_adapter import _tiny_model_and_tokenizer

    torch.set_num_threads(1)
    base = integration.CorrGRPOTrainer
    batches: list[dict] = []

    class Recording(base):
        def _calculate_rewards(self, *args):
            rewards = super()._calculate_rewards(*args)
            batches.append({"rewards": rewards.tolist(), "applied": []})
            return rewards

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            batches[-1].update(weights=self.reward_weights.tolist(), batch=out["advantages"].tolist(),
                               tokens=integration.trained_tokens(out).tolist())
            return out

        def _compute_loss(self, model, inputs):  # what the loss is given
            batches[-1]["applied"] += inputs["advantages"].reshape(-1).tolist()
            self.loss_inputs = dict(inputs)
            return super()._compute_loss(model, inputs)

    integration.CorrGRPOTrainer = Recording  # the docs example imports it from the module
    results = {}
    os.chdir(workdir)
    model, tokenizer = _tiny_model_and_tokenizer()
    scope = {"model": model, "tokenizer": tokenizer}
    exec(compile(_docs_example(), str(DOCS), "exec"), scope)
    results["docs"] = {"batches": list(batches), "history": scope["trainer"].state.log_history}
    readme = {"model": model, "tokenizer": tokenizer, "grpo_config": scope["trainer"].args}
    exec(compile(_readme_example(), str(README), "exec"), readme)  # builds the trainer, no training
    results["readme"] = {"estimator": readme["trainer"].corrgrpo_estimator,
                         "class": type(readme["trainer"]).__mro__[1].__name__}
    from trl import GRPOConfig

    from corrgrpo_envs.integrations.trl import for_trl

    setup = for_trl("corrgrpo/ScaleDominance-v0", split="all", num_tasks=8, reward_weights=[0.1, 1.0, 1.0])
    # the new estimators' completions end early at random (EOS made likely), so their token counts differ
    early_end = {"generation_kwargs": {"sequence_bias": [[[tokenizer.eos_token_id], 4.0]]}}
    runs = [("mo_grpo", "mo_grpo", {}, {}), ("plugin", PLUGIN, {}, {}), ("trl", None, {}, {}),
            ("grpo_trl_eps", "grpo", {"eps": integration.TRL_EPS}, {}),
            ("trl_nts", None, {}, {"multi_objective_aggregation": "normalize_then_sum"})]
    runs += [(name, name, {}, early_end) for name in NEW_ESTIMATORS]
    runs += [("gd2po_loss", "gd2po", {"keep_weight": "loss"}, early_end)]
    for name, estimator, options, extra in runs:
        batches.clear()
        model, tokenizer = _tiny_model_and_tokenizer()
        args = GRPOConfig(
            output_dir=f"{workdir}/{name}", num_generations=4, per_device_train_batch_size=16,
            max_completion_length=8, learning_rate=1e-3, beta=0.0, max_steps=2, use_cpu=True, seed=0,
            report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
            reward_weights=setup.reward_weights, **extra,
        )
        trainer = Recording(model=model, reward_funcs=setup.reward_funcs, args=args, train_dataset=setup.dataset,
                            processing_class=tokenizer, estimator=estimator, estimator_options=options)
        trainer.train()
        results[name] = {"batches": list(batches), "history": trainer.state.log_history}
    results["loss_weight"] = _loss_weight_is_a_policy_term_weight(trainer)
    return results


def _loss_weight_is_a_policy_term_weight(trainer) -> dict[str, list[float]]:
    """For each of TRL's loss types, on a batch the trainer's loss saw with ratios away from 1: the
    loss of the advantages times weights ``w``, ``sum_j w_j`` times the loss of response j's
    advantage alone (its policy term), and the loss of the unweighted advantages."""
    inputs = trainer.loss_inputs
    rows = 6
    inputs = {k: v[:rows] if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == len(inputs["advantages"])
              else v for k, v in inputs.items()}
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        logps = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention,
                                                           inputs["completion_ids"].shape[1])[0]
        inputs["old_per_token_logps"] = logps + 0.6 * torch.randn(logps.shape, generator=generator)  # clipping
    advantages = torch.randn(rows, generator=generator)
    weights = torch.tensor([0.0, 0.5, 1.0, 2.0, 0.25, 1.5])
    base = type(trainer).__mro__[1]  # CorrGRPOTrainer's loss, without the recorder

    def loss(a: torch.Tensor) -> float:
        with torch.no_grad():
            return float(base._compute_loss(trainer, trainer.model, {**inputs, "advantages": a}))

    out = {}
    for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo"):
        trainer.loss_type = loss_type
        alone = [loss(advantages * (torch.arange(rows) == j)) for j in range(rows)]
        out[loss_type] = [loss(advantages * weights), float(sum(w * v for w, v in zip(weights.tolist(), alone))),
                          loss(advantages)]
    return out


@pytest.fixture(scope="module")
def trl_runs(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("trl")
    out = work / "result.json"
    code = (
        "import json; from pathlib import Path; from tests import test_trl_estimators as t;"
        f"Path({str(out)!r}).write_text(json.dumps(t._trl_runs({str(work)!r})))"
    )
    run_in_trl_venv(code, timeout=600)
    return json.loads(out.read_text())


def _check_batches(batches: list[dict], estimator: str, options: dict | None = None) -> None:
    assert len(batches) == 2
    for b in batches:
        rewards = np.array(b["rewards"])
        ours = compute_advantages(rewards, np.arange(len(rewards)) // 4, estimator, b["weights"],
                                  token_counts=b["tokens"], **(options or {}))
        np.testing.assert_allclose(b["batch"], ours.loss_weighted_advantages.numpy(), rtol=0, atol=1e-6)
        # TRL shuffles the batch before the loss: the loss gets the same advantages, permuted
        np.testing.assert_allclose(sorted(b["applied"]), sorted(b["batch"]), rtol=0, atol=1e-6)
    assert any(np.abs(b["batch"]).max() > 0.01 for b in batches)  # there was signal to compare


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_docs_example_trains_with_corrgrpo_a_schedule_and_a_gate(trl_runs):
    run = trl_runs["docs"]
    _check_batches(run["batches"], "corrgrpo")
    assert [b["weights"][1] for b in run["batches"]] == [1.0, 2.0]  # the schedule, at steps 0 and 1
    for b in run["batches"]:
        rewards = np.array(b["rewards"])
        assert np.all(rewards[rewards[:, 1] < 1, 2] == 0)  # the gate: word_with_a needs has_a
    logs = [h for h in run["history"] if "loss" in h]
    assert len(logs) == 2
    for log, b in zip(logs, run["batches"]):
        rewards = np.array(b["rewards"])
        result = compute_advantages(rewards, np.arange(len(rewards)) // 4, "corrgrpo", b["weights"])
        ours = reward_metrics(rewards, np.array(b["weights"]), NAMES, result.stats.to_dict())
        for key in ("c_q/median", "k_eff/mean", "cov_share/digits", "zero_variance_fraction",
                    "active_fraction/has_a"):
            if key in ours:
                assert log[METRIC_PREFIX + key] == pytest.approx(ours[key], rel=1e-6), key
        assert log["corrgrpo/reward_weight/has_a"] == b["weights"][1]
        assert 0 <= log["corrgrpo/gate/word_with_a/open_fraction"] <= 1
        assert sum(log[f"corrgrpo/advantage_share/{n}"] for n in NAMES) == pytest.approx(1.0)
        assert log["corrgrpo/time/overhead"] > 0 and log["step_time"] > 0


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_mo_grpo_and_a_plugin_estimator_train_through_trl(trl_runs):
    _check_batches(trl_runs["mo_grpo"]["batches"], "mo_grpo")
    _check_batches(trl_runs["plugin"]["batches"], PLUGIN)
    for b in trl_runs["plugin"]["batches"]:
        rewards = np.array(b["rewards"])
        dr = compute_advantages(rewards, np.arange(len(rewards)) // 4, "dr_grpo", b["weights"]).advantages
        np.testing.assert_allclose(b["batch"], 2 * dr.numpy(), rtol=0, atol=1e-6)
    for name in ("mo_grpo", "plugin"):
        logs = [h for h in trl_runs[name]["history"] if "loss" in h]
        assert len(logs) == 2 and all("corrgrpo/k_eff/mean" in h or "corrgrpo/c_q/median" in h for h in logs)


@pytest.mark.slow
@pytest.mark.timeout(700)
@pytest.mark.parametrize("name", [*NEW_ESTIMATORS, "gd2po_loss"])
def test_every_new_estimator_trains_through_trl_with_its_token_counts(trl_runs, name):
    run = trl_runs[name]
    options = {"keep_weight": "loss"} if name == "gd2po_loss" else {}
    estimator = "gd2po" if name == "gd2po_loss" else name
    _check_batches(run["batches"], estimator, options)
    assert any(len(set(b["tokens"])) > 2 for b in run["batches"])  # the completions' lengths differ
    logs = [h for h in run["history"] if "loss" in h]
    assert len(logs) == 2
    for log, b in zip(logs, run["batches"]):
        rewards = np.array(b["rewards"])
        result = compute_advantages(rewards, np.arange(len(rewards)) // 4, estimator, b["weights"],
                                    token_counts=b["tokens"], **options)
        ours = estimator_metrics(result.metrics, NAMES)
        assert ours
        for key, value in ours.items():
            assert log[METRIC_PREFIX + key] == pytest.approx(value, rel=1e-6, abs=1e-12), key


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_gd2po_keep_weight_reaches_trls_loss_as_a_weight_of_each_policy_term(trl_runs):
    """``min(r wA, clip(r) wA) = w min(r A, clip(r) A)`` for w >= 0, and likewise for every loss type
    of TRL 1.16: the loss of the weighted advantages is the weighted sum of each response's term."""
    kept = []
    for b in trl_runs["gd2po_loss"]["batches"]:  # the run's loss got the advantages times the keep weights
        rewards = np.array(b["rewards"])
        result = compute_advantages(rewards, np.arange(len(rewards)) // 4, "gd2po", b["weights"],
                                    token_counts=b["tokens"], keep_weight="loss")
        np.testing.assert_allclose(sorted(b["applied"]), sorted(result.loss_weighted_advantages.tolist()),
                                   rtol=0, atol=1e-6)
        kept += result.loss_weight.tolist()
    assert min(kept) < 1.0  # some prompt lost responses: the weight did something
    for loss_type, (weighted, summed, plain) in trl_runs["loss_weight"].items():
        assert weighted == pytest.approx(summed, rel=1e-5, abs=1e-7), loss_type
        assert abs(weighted - plain) > 1e-3, loss_type  # the weights changed the loss


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_trls_aggregations_are_our_grpo_and_gdpo(trl_runs):
    """estimator=None keeps TRL's advantages: sum_then_normalize is grpo, normalize_then_sum gdpo (eps 1e-4)."""
    _check_batches(trl_runs["trl"]["batches"], "grpo", {"eps": 1e-4})
    _check_batches(trl_runs["trl_nts"]["batches"], "gdpo", {"eps": 1e-4})
    logs = [h for h in trl_runs["trl"]["history"] if "loss" in h]
    assert all("corrgrpo/cov_share/digits" in h and "corrgrpo/advantage_share/digits" in h for h in logs)


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_grpo_with_trls_eps_gives_trls_own_advantages_and_stds(trl_runs):
    """The same seed generates the same first batch: TRL's own advantages (estimator=None) equal those
    of estimator="grpo" with eps TRL_EPS; the stds we log beside TRL's divide by n-1 as TRL's do."""
    own, ours = trl_runs["trl"]["batches"][0], trl_runs["grpo_trl_eps"]["batches"][0]
    assert own["rewards"] == ours["rewards"]
    np.testing.assert_allclose(ours["applied"], own["applied"], rtol=0, atol=3e-6)
    assert max(abs(a) for a in own["applied"]) > 0.5  # real values are compared
    first = next(h for h in trl_runs["grpo_trl_eps"]["history"] if "loss" in h)
    for name in NAMES:
        assert first[f"corrgrpo/reward/{name}/std"] == pytest.approx(first[f"rewards/{name}/std"], rel=1e-5)
    assert first["corrgrpo/estimator_used/grpo"] == 1.0


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_two_processes_each_train_on_their_slice(tmp_path):
    """accelerate launch with 2 CPU processes (gloo): each applies its slice of the advantages of the gathered
    batch, whose token counts come from both processes."""
    run_bounded([str(require_trl_venv().parent / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
                 "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                 "--main_process_port", str(free_port()), "tests/trl_distributed_check.py", str(tmp_path)],
                env=trl_venv_env())
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in records] == [2, 2]
    for step in range(2):
        gathered = [np.array(r["batches"][step]["rewards"]) for r in records]
        np.testing.assert_array_equal(gathered[0], gathered[1])  # every process holds the whole batch
        tokens = records[0]["batches"][step]["tokens"] + records[1]["batches"][step]["tokens"]
        assert len(set(tokens)) > 2  # lengths differ: a wrong order of the gathered counts would show
        ours = compute_advantages(gathered[0], np.arange(len(gathered[0])) // 4, "dara",
                                  records[0]["batches"][step]["weights"], token_counts=tokens).advantages.numpy()
        local = len(records[0]["batches"][step]["batch"])
        for rank, record in enumerate(records):
            np.testing.assert_allclose(record["batches"][step]["batch"], ours[rank * local:(rank + 1) * local],
                                       rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_the_readme_example_builds_the_trainer(trl_runs):
    assert trl_runs["readme"] == {"estimator": "corrgrpo", "class": "CorrGRPOTrainer"}  # under the recorder


@pytest.mark.slow
@pytest.mark.timeout(700)
def test_advise_reads_the_trl_run_back(trl_runs, tmp_path):
    from corrgrpo.trainer.advice import summarise
    from corrgrpo.trainer.integrations.run_logs import read_run

    history = trl_runs["docs"]["history"]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    log = read_run(tmp_path)
    assert log.kind == "trl" and log.has_diagnostics and len(log.records) == 2
    assert log.estimator == "corrgrpo"  # from corrgrpo/estimator_used/corrgrpo
    summary = summarise(log.records)
    assert summary["names"] == NAMES
    logged = [h["corrgrpo/k_eff/mean"] for h in history if "corrgrpo/k_eff/mean" in h]
    assert summary["k_eff/mean"] == pytest.approx(float(np.mean(logged)))
    assert summary["correlation"].shape == (3, 3)
