"""corrgrpo's advantage estimators and envs in verl (written against verl 0.9.1).

Two pieces, usable apart:

- **Estimators.** :func:`register` puts every estimator of :mod:`corrgrpo.trainer.estimators`
  (built-ins and plug-ins) into verl's advantage-estimator registry
  (``verl.trainer.ppo.core_algos.register_adv_est``), so that
  ``algorithm.adv_estimator=corrgrpo`` selects CorrGRPO. Like verl's GDPO, an
  estimator reads the per-component scores from the batch's ``non_tensor_batch``
  under the keys ``algorithm.gdpo_reward_keys`` (the keys a ``compute_score`` returns)
  and weighs them with ``algorithm.gdpo_reward_weights``; its options (``eps``,
  ``min_denominator``, ...) come from ``algorithm.corrgrpo_options``. A name that verl
  already uses (``grpo``, ``gdpo``, ``rloo``) is registered as ``corrgrpo_<name>``.
  Importing this module registers them when verl is installed; so does ``import verl``
  itself, through the ``verl.plugins`` entry point of this project.
- **Rewards.** :func:`compute_score` is a verl custom reward function: it scores a
  response with a corrgrpo env (``reset`` on the row's task, one ``step`` with the text)
  and returns ``{component: value, ..., "score": weighted total}``. :func:`dataset_rows`
  writes an env's prompts as verl dataset rows that it reads back. It needs no verl.

verl 0.9.1 hands ``non_tensor_batch`` to the estimator named ``gdpo`` only, and its
trainer logs only the metrics it computes itself. :func:`register` therefore wraps two
functions of ``verl.trainer.ppo.ray_trainer`` (the trainer of ``trainer.use_v1=False``):
``compute_advantage``, which for our names makes the batch visible to the estimator and
stores our diagnostics in ``data.meta_info``, and ``compute_data_metrics``, which adds
those diagnostics to the step's metrics as ``corrgrpo/<name>`` (the names of
:func:`corrgrpo.trainer.estimators.reward_metrics.reward_metrics`). Both leave every other estimator's path
unchanged. verl's v1 trainer (``trainer.use_v1=True``) does not fetch the component
scores for the advantage step at all, so there our estimators stop with an error that
says so (docs/verl.md).

An estimator gets each response's trained tokens (``response_mask`` summed), so those that weigh
their batch means by tokens (SAW, GD²PO, DARA, RVPO) whiten over the batch's tokens as their
authors' verl code does; its own diagnostics are logged as ``corrgrpo/estimator/<name>``. A
per-response loss weight (GD²PO's ``keep_weight: loss``) multiplies the advantages verl's actor
receives (``AdvantageResult.loss_weighted_advantages``). For a weight >= 0 that weighs the
response's policy term in every policy loss of verl 0.9.1 whose term is a sign-dependent multiple
of the advantage: ``vanilla`` (dual-clip PPO), ``gspo``, ``gpg``, ``cispo``, ``sapo``,
``geo_mean``, ``dppo_tv``, ``dppo_kl`` and ``bypass_mode`` (tests/test_verl_integration.py checks
each). The KL loss is not weighted, nor is ``dro``'s quadratic penalty; ``clip_cov`` and
``kl_cov`` pick the tokens they clip by the batch covariance of advantage and log-probability, so
there a weight also moves that choice.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.util
import json
import math
import numbers
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from corrgrpo.trainer.estimators import available_estimators, compute_advantages
from corrgrpo.trainer.estimators.reward_metrics import estimator_metrics, reward_metrics

__all__ = [
    "METRICS_KEY",
    "METRIC_PREFIX",
    "VerlEstimator",
    "check_reward_totals",
    "compute_score",
    "corrgrpo_metrics",
    "dataset_rows",
    "register",
    "verl_name",
]

#: ``data.meta_info`` key under which an estimator call leaves its metrics for the step's log
METRICS_KEY = "corrgrpo_metrics"
#: prefix of our metrics in verl's logs
METRIC_PREFIX = "corrgrpo/"
#: keys a compute_score dict must not use for a component: verl's own per-sample fields
#: (reward_extra_info is merged into non_tensor_batch, where these already live)
RESERVED_KEYS = frozenset(
    {
        "score",
        "acc",
        "reward",
        "uid",
        "data_source",
        "reward_model",
        "extra_info",
        "index",
        "raw_prompt",
        "raw_prompt_ids",
        "tools_kwargs",
        "interaction_kwargs",
        "multi_modal_data",
        "__num_turns__",
        "request_id",
        "agent_name",
    }
)
#: envs kept per process by compute_score (one per id and kwargs); the oldest is closed
MAX_CACHED_ENVS = 8
#: the largest ``extra_info["env_kwargs"]`` JSON text compute_score parses
MAX_ENV_KWARGS_CHARS = 10_000


# --------------------------------------------------------------------------- #
# Estimators
# --------------------------------------------------------------------------- #
@dataclass
class _AdvantageCall:
    """The batch of one ``compute_advantage`` call, and the metrics its estimator produced."""

    data: Any
    metrics: dict[str, float] = field(default_factory=dict)


_CURRENT_CALL: contextvars.ContextVar[_AdvantageCall | None] = contextvars.ContextVar(
    "corrgrpo_verl_advantage_call", default=None
)


def verl_name(name: str, taken: Sequence[str] | frozenset[str] = ()) -> str:
    """The name of our estimator ``name`` in verl: itself, or ``corrgrpo_<name>`` if verl has it."""
    return f"corrgrpo_{name}" if name in taken else name


def _config_get(config: Any, key: str) -> Any:
    if config is None:
        return None
    getter = getattr(config, "get", None)
    return getter(key, None) if callable(getter) else getattr(config, key, None)


def _plain(value: Any) -> Any:
    """An OmegaConf container (verl's config) as plain python lists/dicts."""
    to_container = getattr(sys.modules.get("omegaconf"), "OmegaConf", None)
    if to_container is not None and type(value).__module__.startswith("omegaconf"):
        return to_container.to_container(value, resolve=True)
    return value


def _component_column(non_tensor_batch: Mapping[str, Any], key: str, size: int) -> np.ndarray:
    """One component's ``[size]`` float64 scores; None (not applicable) becomes NaN."""
    if key not in non_tensor_batch:
        raise KeyError(
            f"reward key {key!r} (algorithm.gdpo_reward_keys) is not in the batch; its keys: "
            f"{sorted(non_tensor_batch)}; compute_score must return a dict with {key!r}, "
            "and verl's v1 trainer never passes one (run trainer.use_v1=False)"
        )
    column = np.asarray(non_tensor_batch[key])
    if column.shape != (size,):
        raise ValueError(f"reward key {key!r}: shape {column.shape}, expected ({size},)")
    if column.dtype.kind in "biuf":
        return column.astype(np.float64)
    out = np.empty(size, dtype=np.float64)
    for i, value in enumerate(column.tolist()):
        if value is None:
            out[i] = math.nan
        elif isinstance(value, numbers.Real):
            out[i] = float(value)
        else:
            raise ValueError(f"reward key {key!r}, row {i}: {type(value).__name__} is not a number")
    return out


def corrgrpo_metrics(
    rewards: np.ndarray, weights: np.ndarray, names: Sequence[str], stats: dict[str, Any]
) -> dict[str, float]:
    """:func:`corrgrpo.trainer.estimators.reward_metrics.reward_metrics` as flat ``corrgrpo/...`` scalars.

    Undefined values are left out; the correlation matrix becomes
    ``corrgrpo/reward_correlation/<a>/<b>`` for each pair ``a`` before ``b``.
    """
    out: dict[str, float] = {}
    for key, value in reward_metrics(rewards, weights, names, stats).items():
        if key == "reward_correlation":
            for a in range(len(names)):
                for b in range(a + 1, len(names)):
                    v = value[a][b]
                    if v is not None:
                        out[f"{METRIC_PREFIX}reward_correlation/{names[a]}/{names[b]}"] = float(v)
        elif value is not None and math.isfinite(float(value)):
            out[METRIC_PREFIX + key] = float(value)
    return out


class VerlEstimator:
    """One of our estimators as a verl advantage estimator (GDPO's signature).

    Args:
        name: the estimator's name in our registry (or an entry point ``pkg.mod:fn``).
    """

    def __init__(self, name: str):
        self.corrgrpo_estimator = name
        self.__name__ = f"corrgrpo_{name}_advantage"
        self.__doc__ = (
            f"corrgrpo's {name!r} estimator on the components of algorithm.gdpo_reward_keys."
        )

    def __repr__(self) -> str:
        return f"VerlEstimator({self.corrgrpo_estimator!r})"

    def __call__(
        self,
        token_level_rewards: Any,
        response_mask: Any,
        index: Any = None,
        epsilon: float = 1e-6,
        norm_adv_by_std_in_grpo: bool = True,
        config: Any = None,
        non_tensor_batch: Mapping[str, Any] | None = None,
        batch: Any = None,
        **kwargs: Any,
    ) -> tuple[Any, Any]:
        """``(advantages, returns)``, both ``[bs, response_length]``: the response's advantage on
        each of its tokens. ``epsilon`` and ``norm_adv_by_std_in_grpo`` (GRPO's) are not used: our
        options come from ``algorithm.corrgrpo_options``."""
        import torch

        name = self.corrgrpo_estimator
        keys = _plain(_config_get(config, "gdpo_reward_keys"))
        if not keys:
            raise ValueError(
                f"estimator {name!r} needs algorithm.gdpo_reward_keys: the component keys that "
                "compute_score returns (e.g. [digits,has_a,word_with_a])"
            )
        call = _CURRENT_CALL.get()
        if non_tensor_batch is None and call is not None:
            non_tensor_batch = call.data.non_tensor_batch
        if non_tensor_batch is None:
            raise RuntimeError(
                f"estimator {name!r} got no per-component scores: verl passes them to 'gdpo' only; "
                "corrgrpo.trainer.integrations.verl.register() makes its legacy trainer pass them "
                "(trainer.use_v1=False); the v1 trainer does not fetch them"
            )
        if index is None:
            raise ValueError(
                f"estimator {name!r} needs the group of each response (the batch's 'uid')"
            )
        size = int(token_level_rewards.shape[0])
        names = [str(k) for k in keys]
        rewards = np.stack([_component_column(non_tensor_batch, k, size) for k in names], axis=1)
        weights = _plain(_config_get(config, "gdpo_reward_weights"))
        weights = np.ones(len(names)) if weights is None else np.asarray(weights, dtype=np.float64)
        if weights.shape != (len(names),):
            raise ValueError(
                f"algorithm.gdpo_reward_weights has {weights.size} entries for the "
                f"{len(names)} keys of algorithm.gdpo_reward_keys"
            )
        scores = token_level_rewards.detach().sum(dim=-1).to("cpu", torch.float64).numpy()
        check_reward_totals(name, config, rewards, weights, scores, non_tensor_batch.get("score"))
        options = dict(_plain(_config_get(config, "corrgrpo_options")) or {})
        _, group_ids = np.unique(np.asarray(index, dtype=object).astype(str), return_inverse=True)
        # each response's trained tokens: what verl's masked_whiten and its policy loss count
        tokens = response_mask.detach().sum(dim=-1).to("cpu", torch.float64)
        result = compute_advantages(
            rewards, group_ids.astype(np.int64), estimator=name, weights=weights,
            token_counts=tokens, **options
        )
        advantages = result.loss_weighted_advantages.to(
            device=token_level_rewards.device, dtype=torch.float32
        )
        advantages = advantages.unsqueeze(-1) * response_mask
        if call is not None:
            call.metrics = corrgrpo_metrics(rewards, weights, names, result.stats.to_dict())
            # verl's loggers take numbers only: the name is in the key (read back by `advise`)
            call.metrics[f"{METRIC_PREFIX}estimator_used/{name}"] = 1.0
            for key, value in estimator_metrics(result.metrics, names).items():
                call.metrics[METRIC_PREFIX + key] = value
        return advantages, advantages


def check_reward_totals(
    name: str,
    config: Any,
    rewards: np.ndarray,
    weights: np.ndarray,
    token_totals: np.ndarray,
    scores: Any = None,
) -> None:
    """Refuse, in one line, a batch whose rewards are more than the components we read.

    Our estimators see the components of ``gdpo_reward_keys`` weighted by ``gdpo_reward_weights``;
    verl's ``token_level_rewards`` are what its own estimators see. A term only the latter carry
    (verl's KL-in-reward penalty, a reward manager's overlong penalty, ...) would change verl's
    advantages and not ours, silently: so it stops the step instead. Adding it to our totals
    would leave it outside every per-component normalisation, which is what these estimators
    are for; the KL penalty belongs in the loss (``actor.use_kl_loss``). ``scores`` (the
    ``score`` compute_score returned, from ``reward_kwargs.reward_weights``) must also be the
    weighted components: the two weight settings must agree.

    Args:
        name: the estimator, for the message.
        config: verl's ``algorithm`` config.
        rewards: ``[N, K]`` the components (NaN: not applicable).
        weights: ``[K]`` ``gdpo_reward_weights``.
        token_totals: ``[N]`` each response's ``token_level_rewards`` summed.
        scores: ``[N]`` compute_score's ``score`` column of the batch, or None where it has none.
    """
    if _config_get(config, "use_kl_in_reward"):
        raise ValueError(
            f"estimator {name!r} reads the components of algorithm.gdpo_reward_keys, so "
            "algorithm.use_kl_in_reward=True would not reach its advantages: set it to False and "
            "use actor_rollout_ref.actor.use_kl_loss=True for the KL penalty"
        )
    expected = np.nansum(rewards * weights[None, :], axis=1)
    if scores is not None:
        column = np.array([np.nan if v is None else float(v) for v in np.asarray(scores, dtype=object)])
        wrong = np.flatnonzero(~np.isclose(column, expected, rtol=1e-5, atol=1e-4) & np.isfinite(column))
        if wrong.size:
            i = int(wrong[0])
            raise ValueError(
                f"estimator {name!r}: algorithm.gdpo_reward_weights {weights.tolist()} do not give the "
                f"'score' compute_score returned (row {i}: {column[i]:.6g}, weighted components "
                f"{expected[i]:.6g}): set reward.custom_reward_function.reward_kwargs.reward_weights "
                "to the same weights"
            )
    wrong = np.flatnonzero(~np.isclose(token_totals, expected, rtol=1e-5, atol=1e-4))
    if wrong.size:
        i = int(wrong[0])
        raise ValueError(
            f"estimator {name!r}: token_level_rewards sum to {token_totals[i]:.6g} on row {i} where "
            f"the weighted components of algorithm.gdpo_reward_keys give {expected[i]:.6g}: verl "
            "added a reward term our estimators do not read (a KL-in-reward or overlong penalty?); "
            "remove it, or put the KL penalty in the loss (actor_rollout_ref.actor.use_kl_loss)"
        )


def _is_ours(fn: Any) -> bool:
    return getattr(fn, "corrgrpo_estimator", None) is not None


def _wrap_compute_advantage(
    original: Callable[..., Any], registry: Mapping[str, Any]
) -> Callable[..., Any]:
    @functools.wraps(original)
    def compute_advantage(data: Any, adv_estimator: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(adv_estimator, "value", adv_estimator)
        if not _is_ours(registry.get(name)):
            return original(data, adv_estimator, *args, **kwargs)
        call = _AdvantageCall(data)
        token = _CURRENT_CALL.set(call)
        try:
            out = original(data, adv_estimator, *args, **kwargs)
        finally:
            _CURRENT_CALL.reset(token)
        out.meta_info[METRICS_KEY] = call.metrics
        return out

    compute_advantage.corrgrpo_hook = True  # type: ignore[attr-defined]
    return compute_advantage


def _wrap_compute_data_metrics(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compute_data_metrics(batch: Any, *args: Any, **kwargs: Any) -> Any:
        metrics = original(batch, *args, **kwargs)
        extra = getattr(batch, "meta_info", {}).get(METRICS_KEY)
        if extra:
            metrics.update(extra)
        return metrics

    compute_data_metrics.corrgrpo_hook = True  # type: ignore[attr-defined]
    return compute_data_metrics


_REGISTER_LOCK = threading.Lock()
#: the modules that call compute_advantage / compute_data_metrics by their module-level name
_TRAINER_MODULES = ("verl.trainer.ppo.ray_trainer", "verl.experimental.separation.ray_trainer")


def register(names: Sequence[str] | None = None) -> dict[str, str]:
    """Register our estimators in verl and install the two trainer hooks (idempotent).

    Args:
        names: our estimators to register, default every one of ``available_estimators()``
            (call again after registering a plug-in of your own to add it).

    Returns:
        ``{our name: verl's name}`` of the estimators registered by this call or before.
    """
    from verl.trainer.ppo import core_algos, ray_trainer

    registry = core_algos.ADV_ESTIMATOR_REGISTRY
    with _REGISTER_LOCK:
        theirs = frozenset(k for k, fn in registry.items() if not _is_ours(fn))
        mapping: dict[str, str] = {}
        for name in available_estimators() if names is None else names:
            target = verl_name(name, theirs)
            current = registry.get(target)
            if current is None:
                core_algos.register_adv_est(target)(VerlEstimator(name))
            elif getattr(current, "corrgrpo_estimator", None) != name:
                raise ValueError(f"verl's estimator {target!r} is taken by {current!r}")
            mapping[name] = target
        for module_name in _TRAINER_MODULES:
            module = (
                ray_trainer if module_name == ray_trainer.__name__ else sys.modules.get(module_name)
            )
            if module is None:
                continue
            for attr, wrap in (
                ("compute_advantage", lambda f: _wrap_compute_advantage(f, registry)),
                ("compute_data_metrics", _wrap_compute_data_metrics),
            ):
                fn = getattr(module, attr, None)
                if fn is not None and not getattr(fn, "corrgrpo_hook", False):
                    setattr(module, attr, wrap(fn))
    return mapping


# --------------------------------------------------------------------------- #
# Rewards
# --------------------------------------------------------------------------- #
class _ScoringEnv:
    """An env and the lock that keeps its reset-then-step pairs whole: verl's reward managers
    call compute_score from a thread pool."""

    def __init__(self, env: Any):
        self.env = env
        self.lock = threading.Lock()
        unwrapped = env.unwrapped
        self.names: tuple[str, ...] = tuple(unwrapped.reward_names)
        self.weights = np.asarray(unwrapped.reward_weights, dtype=np.float64)
        clash = sorted(RESERVED_KEYS.intersection(self.names))
        if clash:
            raise ValueError(f"reward component {clash[0]!r} clashes with one of verl's batch keys")

    def score(self, task_id: str, text: str) -> np.ndarray:
        with self.lock:
            self.env.reset(options={"task_id": task_id})
            return np.asarray(self.env.step(text)[1], dtype=np.float64)


_ENVS: OrderedDict[str, _ScoringEnv] = OrderedDict()
_ENVS_LOCK = threading.Lock()


def _scoring_env(env_id: str, env_kwargs: Mapping[str, Any], trusted_id: bool) -> _ScoringEnv:
    import corrgrpo_envs

    if not trusted_id and env_id not in corrgrpo_envs.registered_ids():
        raise ValueError(
            f"data_source {env_id!r} is not a registered corrgrpo env id "
            f"({', '.join(corrgrpo_envs.registered_ids())}); name other envs in reward_kwargs.env_id"
        )
    key = json.dumps([env_id, env_kwargs], sort_keys=True, default=str)
    with _ENVS_LOCK:
        if key in _ENVS:
            _ENVS.move_to_end(key)
            return _ENVS[key]
        scoring = _ScoringEnv(corrgrpo_envs.make(env_id, **env_kwargs))
        _ENVS[key] = scoring
        while len(_ENVS) > MAX_CACHED_ENVS:
            _, old = _ENVS.popitem(last=False)
            with old.lock:
                old.env.close()
        return scoring


def _row_env_kwargs(extra_info: Mapping[str, Any]) -> dict[str, Any]:
    text = extra_info.get("env_kwargs")
    if text in (None, ""):
        return {}
    if not isinstance(text, str) or len(text) > MAX_ENV_KWARGS_CHARS:
        raise ValueError(
            f"extra_info.env_kwargs must be a JSON object of at most {MAX_ENV_KWARGS_CHARS} characters"
        )
    kwargs = json.loads(text)
    if not isinstance(kwargs, dict):
        raise ValueError("extra_info.env_kwargs must be a JSON object")
    return kwargs


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any = None,
    extra_info: Mapping[str, Any] | None = None,
    *,
    env_id: str | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    reward_weights: Sequence[float] | None = None,
    **_: Any,
) -> dict[str, float]:
    """verl custom reward function: a response's reward vector on its task.

    Args:
        data_source: the env id (a registered corrgrpo id) unless ``env_id`` is given.
        solution_str: the decoded response: the text of the env's one ``step``.
        ground_truth: unused (the env knows its task's answer).
        extra_info: the row's ``task_id``, and ``env_kwargs`` (a JSON object) the env is made with.
        env_id: from ``reward.custom_reward_function.reward_kwargs``: any id ``corrgrpo_envs.make``
            takes (also entry points, YAML, ``openenv://``); overrides ``data_source``.
        env_kwargs: from ``reward_kwargs``, merged over the row's.
        reward_weights: from ``reward_kwargs``, the weights of ``score`` (default: the env's).

    Returns:
        ``{component: value, ..., "score": sum_k w_k r_k}`` (NaN, not applicable, adds nothing
        to ``score``).
    """
    info = dict(extra_info or {})
    task_id = info.get("task_id")
    if not isinstance(task_id, str) or not task_id:
        raise ValueError("compute_score needs extra_info.task_id (rows from dataset_rows carry it)")
    kwargs = {**_row_env_kwargs(info), **dict(_plain(env_kwargs) or {})}
    scoring = _scoring_env(str(env_id or data_source), kwargs, trusted_id=env_id is not None)
    weights = (
        scoring.weights
        if reward_weights is None
        else np.asarray(_plain(reward_weights), dtype=np.float64)
    )
    if weights.shape != (len(scoring.names),):
        raise ValueError(
            f"reward_weights has {weights.size} entries for the components {list(scoring.names)}"
        )
    vector = scoring.score(task_id, str(solution_str))
    out = {name: float(v) for name, v in zip(scoring.names, vector)}
    out["score"] = float(np.nansum(weights * vector))
    return out


def dataset_rows(
    env_id: str, task_ids: Sequence[str] | None = None, **env_kwargs: Any
) -> list[dict[str, Any]]:
    """verl dataset rows (``data_source``, chat ``prompt``, ``reward_model``, ``extra_info``) of an
    env's tasks (default: all of its split), for a parquet file that :func:`compute_score` scores.

    ``env_kwargs`` make the env here and, through ``extra_info.env_kwargs``, in compute_score.
    """
    import corrgrpo_envs

    env = corrgrpo_envs.make(env_id, **env_kwargs)
    try:
        ids = list(env.unwrapped.task_ids if task_ids is None else task_ids)
        encoded = json.dumps(env_kwargs, sort_keys=True) if env_kwargs else ""
        rows = []
        for task_id in ids:
            obs, _ = env.reset(options={"task_id": task_id})
            rows.append(
                {
                    "data_source": env_id,
                    "prompt": [
                        {"role": m["role"], "content": m["content"]} for m in obs["messages"]
                    ],
                    "ability": "corrgrpo",
                    "reward_model": {"style": "rule", "ground_truth": ""},
                    "extra_info": {"task_id": str(task_id), "env_kwargs": encoded},
                }
            )
        return rows
    finally:
        env.close()


# Importing this module registers the estimators when verl is there (also when verl's own
# import loads it as a plug-in); without verl, compute_score and dataset_rows still work.
if importlib.util.find_spec("verl") is not None:
    register()
