"""Multi-reward group advantage estimators, their registry, diagnostics and reward metrics.

Every estimator turns a batch of vector rewards ``[N, K]`` and the group id of each response
``[N]`` into one scalar advantage per response ``[N]``. The math is in ``docs/advantages.md``;
the package is laid out so that adding an estimator is one module and one registry line:

- :mod:`~corrgrpo.trainer.estimators.groups`: the group statistics every estimator reads
  (:class:`RewardGroups`, computed once per batch in float64 by :func:`group_rewards`);
- :mod:`~corrgrpo.trainer.estimators.registry`: :class:`Decomposition` (an estimator's parts per reward
  component, an optional per-response loss weight and its own diagnostics), :func:`decomposed`
  and :func:`register_estimator`;
- one module per estimator family: :mod:`~corrgrpo.trainer.estimators.grpo` (GRPO, Dr. GRPO, RLOO,
  REINFORCE++), :mod:`~corrgrpo.trainer.estimators.gdpo` (MO-GRPO, GDPO),
  :mod:`~corrgrpo.trainer.estimators.corrgrpo` (CorrGRPO, GDPO-Corr) and the newer multi-reward
  estimators, each in its own module;
- :mod:`~corrgrpo.trainer.estimators.compute`: :func:`compute_advantages`, the entry point;
- :mod:`~corrgrpo.trainer.estimators.diagnostics` (:func:`diagnose`), :mod:`~corrgrpo.trainer.estimators.attribution`,
  :mod:`~corrgrpo.trainer.estimators.reward_weights` (weight schedules), :mod:`~corrgrpo.trainer.estimators.reward_gates`
  and :mod:`~corrgrpo.trainer.estimators.reward_metrics`.

This package imports only torch, numpy and ``corrgrpo_registry``: the TRL and verl plug-ins
and the trainer import it, never the other way round.
"""

from __future__ import annotations

# the estimator families register themselves on import: keep every one listed here
from corrgrpo.trainer.estimators import (  # noqa: F401
    corrgrpo,
    dara,
    dvao,
    gd2po,
    gdpo,
    grpo,
    rdpo,
    rvpo,
    saw,
)
from corrgrpo.trainer.estimators.compute import AdvantageResult, check_estimator, compute_advantages
from corrgrpo.trainer.estimators.corrgrpo import corrgrpo_advantages, gdpo_corr_advantages
from corrgrpo.trainer.estimators.diagnostics import NEAR_CANCELLING_S_CORR, AdvantageStats, diagnose
from corrgrpo.trainer.estimators.gdpo import gdpo_advantages, mo_grpo_advantages
from corrgrpo.trainer.estimators.groups import ACTIVITY_RTOL, RewardGroups, group_rewards
from corrgrpo.trainer.estimators.grpo import (
    dr_grpo_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from corrgrpo.trainer.estimators.registry import (
    DEFAULT_EPS,
    ESTIMATORS,
    Decomposition,
    available_estimators,
    decomposed,
    get_estimator,
    register_estimator,
)

__all__ = [
    "ACTIVITY_RTOL",
    "DEFAULT_EPS",
    "ESTIMATORS",
    "NEAR_CANCELLING_S_CORR",
    "AdvantageResult",
    "AdvantageStats",
    "Decomposition",
    "RewardGroups",
    "available_estimators",
    "check_estimator",
    "compute_advantages",
    "corrgrpo_advantages",
    "decomposed",
    "diagnose",
    "dr_grpo_advantages",
    "gdpo_advantages",
    "gdpo_corr_advantages",
    "get_estimator",
    "grpo_advantages",
    "group_rewards",
    "mo_grpo_advantages",
    "register_estimator",
    "reinforce_pp_advantages",
    "rloo_advantages",
]
