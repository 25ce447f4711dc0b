"""corrgrpo's estimators, diagnostics, weight schedules and gates inside TRL's ``GRPOTrainer``.

TRL computes advantages inside ``GRPOTrainer._generate_and_score_completions``, right after
``_calculate_rewards`` returns the ``[N, K]`` values of the K reward functions gathered from
every process; there is no separate method for the aggregation. :class:`CorrGRPOTrainer` (a
``GRPOTrainer`` subclass, built when first imported so that importing this module needs no
TRL) hooks those two methods:

- ``_calculate_rewards``: sets TRL's ``reward_weights`` from a weight schedule at the step
  about to train, applies the reward gates to the gathered matrix (so TRL's own aggregation
  sees gated rewards too), and keeps the matrix;
- ``_generate_and_score_completions``: after TRL built its batch, computes
  ``corrgrpo.trainer.estimators.compute_advantages`` on the kept matrix (groups are TRL's contiguous
  blocks of ``num_generations``; token counts are the completions' trained tokens, TRL's loss
  mask, gathered from every process), replaces this process's slice of the advantages, and logs
  our diagnostics under ``corrgrpo/`` in TRL's metrics, the estimator's own under
  ``corrgrpo/estimator/``.

An estimator's per-response loss weight (GD²PO's ``keep_weight="loss"``) is folded into the
advantages TRL's loss receives (``AdvantageResult.loss_weighted_advantages``): every policy term
of TRL 1.16's losses (``grpo``, ``bnpo``, ``dr_grpo``, ``dapo``, ``luspo``, ``cispo``, ``sapo``,
``vespo``) is a sign-dependent multiple of the advantage, so multiplying the advantage by a
weight >= 0 multiplies that response's policy term by it; the KL and entropy terms keep their
weight of 1 (tests/test_trl_estimators.py checks it on TRL's own ``_compute_loss``).

Every process holds the same gathered matrix, so each computes the same advantages and takes
its own slice, as TRL does. ``estimator=None`` keeps TRL's aggregation
(``multi_objective_aggregation``, ``scale_rewards``) and only adds the diagnostics, the
schedule and the gates. ::

    from trl import GRPOConfig
    from corrgrpo.trainer.integrations.trl import CorrGRPOTrainer, for_trl

    setup = for_trl("corrgrpo/ScaleDominance-v0", split="train")
    trainer = CorrGRPOTrainer(
        model=model, reward_funcs=setup.reward_funcs, train_dataset=setup.dataset,
        args=GRPOConfig(output_dir="runs/trl", reward_weights=setup.reward_weights),
        processing_class=tokenizer, estimator="corrgrpo",
    )
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from corrgrpo.trainer.estimators import AdvantageResult, compute_advantages, get_estimator
from corrgrpo.trainer.estimators.attribution import attribute, attribution_metrics
from corrgrpo.trainer.estimators.reward_gates import RewardGates, check_reward_gates
from corrgrpo.trainer.estimators.reward_metrics import estimator_metrics, reward_metrics
from corrgrpo.trainer.estimators.reward_weights import RewardWeights, resolve_reward_weights

# The env adapter, re-exported so that one import line gives a TRL user both halves.
from corrgrpo_envs.integrations.trl import TRLSetup, for_trl

__all__ = [
    "METRIC_PREFIX",
    "TRL_EPS",
    "TRL_EQUIVALENTS",
    "CorrGRPOMixin",
    "CorrGRPOTrainer",  # noqa: F822 (built on first access, by the module's __getattr__)
    "TRLSetup",
    "for_trl",
    "diagnostic_metrics",
    "bounds_of",
    "group_ids_of",
    "trained_tokens",
]

#: Our metrics sit together in TRL's logs under this prefix (``corrgrpo/c_q/median``, ...).
METRIC_PREFIX = "corrgrpo/"

#: The eps TRL 1.16 adds to the std it divides by. Our estimators' default is 1e-6
#: (``corrgrpo.trainer.estimators.registry.DEFAULT_EPS``), so ``estimator="grpo"`` differs from TRL's default
#: GRPO where a group's std is small; ``estimator="grpo", estimator_options={"eps": TRL_EPS}``
#: reproduces it (tests/test_trl_estimators.py compares it with TRL's own advantages).
TRL_EPS = 1e-4

#: TRL's defaults of the options an estimator overrides (``GRPOConfig``)
TRL_AGGREGATION_DEFAULTS = {"multi_objective_aggregation": "sum_then_normalize", "scale_rewards": "group"}

#: Logged as ``corrgrpo/estimator_used/<name>`` = 1.0: TRL's logs take numbers only, so the
#: estimator's name is in the key (``corrgrpo.trainer.integrations.run_logs`` reads it back for ``advise``).
ESTIMATOR_USED = "estimator_used/"

#: TRL's aggregations as our estimators (``(multi_objective_aggregation, scale_rewards)`` ->
#: ``(estimator, options)``): the same advantages to float32 round-off (tests/test_trl_estimators.py).
#: TRL's ``scale_rewards="batch"`` divides by the std of the uncentred sums, which none of ours does.
TRL_EQUIVALENTS: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {
    ("sum_then_normalize", "group"): ("grpo", {"eps": TRL_EPS}),
    ("sum_then_normalize", "none"): ("dr_grpo", {}),
    ("normalize_then_sum", "group"): ("gdpo", {"eps": TRL_EPS}),
    ("normalize_then_sum", "batch"): ("gdpo", {"eps": TRL_EPS}),
    ("normalize_then_sum", "none"): ("gdpo", {"eps": TRL_EPS}),
}


def group_ids_of(num_rows: int, num_generations: int) -> torch.Tensor:
    """``[num_rows]`` group ids of TRL's gathered batch: contiguous blocks of ``num_generations``.

    TRL's sampler repeats each prompt ``num_generations`` times in a row and ``gather``
    concatenates the processes in rank order, so row ``i`` belongs to group
    ``i // num_generations``.
    """
    if num_generations < 1 or num_rows % num_generations:
        raise ValueError(f"{num_rows} completions do not split into groups of num_generations={num_generations}")
    return torch.arange(num_rows) // num_generations


def trained_tokens(output: dict[str, Any]) -> torch.Tensor:
    """``[local]`` the trained tokens of each completion of TRL's batch: its loss mask summed
    (``completion_mask``, times ``tool_mask`` where tool outputs are not trained on)."""
    mask = output["completion_mask"]
    if output.get("tool_mask") is not None:
        mask = mask * output["tool_mask"]
    return mask.sum(dim=1).to(torch.float32)


def diagnostic_metrics(
    rewards: np.ndarray,
    weights: np.ndarray,
    names: Sequence[str],
    result: AdvantageResult,
    estimator: str | None,
    options: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Our per-step metrics as flat scalars (a logger of scalars takes them), without the prefix.

    The names are those of ``corrgrpo.trainer.estimators.reward_metrics`` and ``corrgrpo.trainer.estimators.attribution`` (``c_q/median``,
    ``k_eff/mean``, ``cov_share/<name>``, ``active_fraction/<name>``, ``zero_variance_fraction``,
    ``advantage_share/<name>``, ...); the correlation matrix becomes one entry per pair,
    ``reward_correlation/<a>/<b>`` (a before b), and the weights in force ``reward_weight/<name>``.
    The advantage shares are those of ``estimator`` with ``options`` (``result`` must be its
    output); None leaves them out. Undefined values (None) are left out. The stds
    ``reward/<name>/std`` and ``reward/weighted/std`` divide by n-1, as TRL's ``rewards/<name>/std``
    and ``reward_std`` beside them do (our own trainer's metrics divide by n).
    """
    names = list(names)
    metrics = reward_metrics(np.asarray(rewards, dtype=np.float64), np.asarray(weights, dtype=np.float64),
                             names, result.stats.to_dict())
    out: dict[str, float] = {}
    correlation = metrics.pop("reward_correlation", None)
    for key, value in metrics.items():
        if isinstance(value, (int, float)):
            out[key] = float(value)
    if correlation is not None:
        for a in range(len(names)):
            for b in range(a + 1, len(names)):
                value = correlation[a][b]
                if value is not None:
                    out[f"reward_correlation/{names[a]}/{names[b]}"] = float(value)
    if estimator is not None:
        attribution = attribute(result.groups, estimator, options or {}, result.advantages)
        out.update({k: float(v) for k, v in attribution_metrics(attribution, names).items()
                    if isinstance(v, (int, float))})
    rewards = np.asarray(rewards, dtype=np.float64)
    for k, name in enumerate(names):
        out[f"reward/{name}/std"] = _sample_std(rewards[:, k])
    weighted = np.nansum(rewards * np.asarray(weights, dtype=np.float64), axis=1)
    weighted[np.isnan(rewards).all(axis=1)] = np.nan  # TRL leaves unscorable completions out too
    out["reward/weighted/std"] = _sample_std(weighted)
    for name, weight in zip(names, np.asarray(weights, dtype=np.float64)):
        out[f"reward_weight/{name}"] = float(weight)
    return out


def _sample_std(values: np.ndarray) -> float:
    """The std of the finite values with n-1 (TRL's ``nanstd``); NaN for fewer than 2 values."""
    finite = values[np.isfinite(values)]
    return float(finite.std(ddof=1)) if finite.size > 1 else float("nan")


def bounds_of(source: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` ``[K]`` of the rewards: from an env (its ``reward_space``), a Box, or a pair."""
    space = getattr(getattr(source, "unwrapped", None), "reward_space", None)
    if space is None and hasattr(source, "low") and hasattr(source, "high"):
        space = source
    if space is not None:
        low, high = space.low, space.high
    else:
        try:
            low, high = source
        except (TypeError, ValueError):
            raise ValueError(
                f"reward_bounds: expected an env, a Box or a (low, high) pair, got {type(source).__name__}"
            ) from None
    return np.asarray(low, dtype=np.float64).reshape(-1), np.asarray(high, dtype=np.float64).reshape(-1)


class CorrGRPOMixin:
    """The hooks of :class:`CorrGRPOTrainer`, for a class that derives from TRL's ``GRPOTrainer``.

    Keyword arguments taken before ``GRPOTrainer``'s own:

    Args:
        estimator: a name of ``corrgrpo.trainer.estimators.available_estimators()`` or an entry point
            ``package.module:function``; None keeps TRL's aggregation (diagnostics only). An
            estimator replaces ``GRPOConfig.multi_objective_aggregation`` and ``scale_rewards``:
            set to other than TRL's defaults, they are ignored with one warning. Our ``grpo``
            adds eps 1e-6 to the std, TRL 1e-4: ``estimator_options={"eps": TRL_EPS}`` gives
            TRL's default GRPO exactly.
        estimator_options: the estimator's options (e.g. ``{"eps": 1e-6}``).
        reward_weights: a weight per component or a schedule, in the form of
            ``algorithm.reward_weights`` (a list, or a mapping by reward function name, whose
            entries are numbers or ``{"values": [[step, weight], ...]}``); default
            ``GRPOConfig.reward_weights``. The step is TRL's ``global_step`` when the batch is
            generated (optimizer steps done before it).
        reward_gates: ``algorithm.reward_gates`` (``{gated: [gate, ...]}`` or
            ``{gated: {gate: threshold}}``), on the reward functions' names.
        reward_bounds: with gates, each component's ``(low, high)`` (or an env: its
            ``reward_space``): a closed gate sets its component to ``low``, a gate without a
            threshold is met at ``high``.
    """

    def __init__(
        self,
        *args: Any,
        estimator: str | None = "corrgrpo",
        estimator_options: dict[str, Any] | None = None,
        reward_weights: Any = None,
        reward_gates: dict[str, Any] | None = None,
        reward_bounds: Any = None,
        **kwargs: Any,
    ):
        options = dict(estimator_options or {})
        if estimator is not None:
            get_estimator(estimator)  # an unknown name fails before TRL loads the model
            # a 2-response dry run rejects an unknown option with the estimator's own message
            compute_advantages(torch.tensor([[0.0], [1.0]]), torch.tensor([0, 0]), estimator, **options)
        elif options:
            raise ValueError("estimator_options need an estimator (estimator=None keeps TRL's aggregation)")
        super().__init__(*args, **kwargs)
        self.corrgrpo_estimator = estimator
        self.corrgrpo_options = options
        if estimator is not None:
            _warn_if_overridden(estimator, {key: getattr(self, key, default)
                                            for key, default in TRL_AGGREGATION_DEFAULTS.items()})
        names = list(self.reward_func_names)
        defaults = self.reward_weights.tolist()
        self.corrgrpo_weights: RewardWeights = resolve_reward_weights(
            reward_weights, names, defaults, key="reward_weights")
        if reward_weights is not None:  # TRL's own aggregation and its logged `reward` use them too
            self.reward_weights = torch.tensor(self.corrgrpo_weights.at(0), dtype=torch.float32)
        self.corrgrpo_gates: RewardGates | None = None
        if reward_gates:
            self.corrgrpo_gates = _gates(reward_gates, names, reward_bounds)
        self._corrgrpo_rewards: torch.Tensor | None = None
        self._corrgrpo_seconds = 0.0

    # TRL's hooks -------------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        started = time.perf_counter()
        if self.corrgrpo_weights.scheduled:  # TRL reads self.reward_weights after this returns
            step = int(self.state.global_step)
            self.reward_weights = torch.tensor(self.corrgrpo_weights.at(step), dtype=torch.float32)
        self._corrgrpo_seconds = time.perf_counter() - started
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        started = time.perf_counter()
        gate_metrics: dict[str, float] = {}
        if self.corrgrpo_gates:
            raw = rewards.detach().to("cpu", torch.float64).numpy()
            gate_metrics = self.corrgrpo_gates.metrics(raw)
            gated = self.corrgrpo_gates.apply(raw)
            rewards = torch.as_tensor(gated, dtype=rewards.dtype, device=rewards.device)
        mode = "train" if self.model.training else "eval"
        for key, value in gate_metrics.items():
            self._metrics[mode][METRIC_PREFIX + key].append(value)
        self._corrgrpo_rewards = rewards
        self._corrgrpo_seconds += time.perf_counter() - started
        return rewards

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        started = time.perf_counter()
        rewards = self._corrgrpo_rewards
        self._corrgrpo_rewards = None
        if rewards is None:  # a subclass scored without _calculate_rewards: nothing to replace
            return output
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        matrix = rewards.detach().to("cpu", torch.float32)
        group_ids = group_ids_of(matrix.shape[0], num_generations)
        weights = self.reward_weights.detach().to("cpu", torch.float64)
        estimator = self.corrgrpo_estimator
        if estimator is None:  # TRL's advantages stand; the diagnostics do not depend on the estimator
            equivalent = TRL_EQUIVALENTS.get((self.multi_objective_aggregation, self.scale_rewards))
            name, options = equivalent or ("grpo", {})
            result = compute_advantages(matrix, group_ids, name, weights, **options)
            estimator_for_shares = name if equivalent else None
        else:
            local = output["advantages"]
            rank, world = self.accelerator.process_index, self.accelerator.num_processes
            if local.shape[0] * world != matrix.shape[0]:
                raise ValueError(f"{matrix.shape[0]} gathered rewards for {world} processes of "
                                 f"{local.shape[0]} completions: cannot take this process's slice")
            # every process calls gather in the same order, as TRL gathers the rewards
            tokens = self.accelerator.gather(trained_tokens(output)).detach().to("cpu", torch.float64)
            result = compute_advantages(matrix, group_ids, estimator, weights, token_counts=tokens,
                                        **self.corrgrpo_options)
            applied, options = result.loss_weighted_advantages, self.corrgrpo_options
            estimator_for_shares = estimator
            mine = applied[rank * local.shape[0]:(rank + 1) * local.shape[0]]
            output["advantages"] = mine.to(device=local.device, dtype=local.dtype)
            logged = self._logs["advantages"]  # the completions table shows the applied advantages
            for _ in range(min(len(logged), matrix.shape[0])):
                logged.pop()
            logged.extend(applied.tolist())
        metrics = diagnostic_metrics(matrix.numpy(), weights.numpy(), self.reward_func_names, result,
                                     estimator_for_shares, options)
        metrics[ESTIMATOR_USED + self._corrgrpo_estimator_name()] = 1.0
        if estimator is not None:
            metrics.update(estimator_metrics(result.metrics, self.reward_func_names))
        seconds = self._corrgrpo_seconds + time.perf_counter() - started
        metrics["time/overhead"] = seconds
        for key, value in metrics.items():
            self._metrics[mode][METRIC_PREFIX + key].append(value)
        return output

    def _corrgrpo_estimator_name(self) -> str:
        """The estimator the advantages came from: ours, TRL's aggregation as the estimator of
        ours that equals it, or ``trl_<aggregation>_<scale_rewards>`` where none does."""
        if self.corrgrpo_estimator is not None:
            return self.corrgrpo_estimator
        key = (self.multi_objective_aggregation, self.scale_rewards)
        equivalent = TRL_EQUIVALENTS.get(key)
        return equivalent[0] if equivalent else f"trl_{key[0]}_{key[1]}"


def _warn_if_overridden(estimator: str, trl_options: dict[str, Any]) -> None:
    """One warning naming the TRL aggregation options set to other than TRL's defaults, which
    ``estimator`` replaces (the defaults are indistinguishable from options left unset)."""
    changed = {key: value for key, value in trl_options.items() if value != TRL_AGGREGATION_DEFAULTS[key]}
    if changed:
        settings = ", ".join(f"{key}={value!r}" for key, value in changed.items())
        warnings.warn(f"CorrGRPOTrainer: estimator={estimator!r} computes the advantages, so GRPOConfig's "
                      f"{settings} is ignored (estimator=None keeps TRL's aggregation)", UserWarning, stacklevel=3)


def _gates(spec: Any, names: list[str], bounds: Any) -> RewardGates:
    """The gates on the reward functions' names, each error naming ``reward_gates``."""
    checked = check_reward_gates(spec, key="reward_gates")
    for gated, gates in checked.items():
        for name in (gated, *gates):
            if name not in names:
                raise ValueError(f"reward_gates.{gated}: {name!r} is not a reward function; "
                                 f"reward functions: {', '.join(names)}")
    if bounds is None:
        raise ValueError("reward_gates need reward_bounds: an env, its reward_space or (low, high)")
    low, high = bounds_of(bounds)
    if len(low) != len(names) or len(high) != len(names):
        raise ValueError(f"reward_bounds have {len(low)} entries for the {len(names)} reward functions {names}")
    return RewardGates(checked, names, low, high)


def _build_trainer_class() -> type:
    from trl import GRPOTrainer

    return type("CorrGRPOTrainer", (CorrGRPOMixin, GRPOTrainer), {
        "__doc__": "TRL's ``GRPOTrainer`` with corrgrpo's estimators and diagnostics (see :class:`CorrGRPOMixin`).",
        "__module__": __name__,
    })


def __getattr__(name: str) -> Any:
    # CorrGRPOTrainer derives from TRL's class: built on first use, so that importing this module
    # (and the rest of the package) does not import trl.
    if name == "CorrGRPOTrainer":
        cls = _build_trainer_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
