"""The tool-calling domain's evaluation metrics: all-exact accuracy and the rewards in percent."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from corrgrpo_envs.metrics import EpisodeRecord, wilson_interval
from corrgrpo_envs.toolcall.rewards import REWARD_HIGH, REWARD_LOW, REWARD_NAMES

__all__ = ["toolcall_metrics", "wilson_interval"]


def _component_percent(value: float, index: int) -> float:
    return 100.0 * (value - REWARD_LOW[index]) / (REWARD_HIGH[index] - REWARD_LOW[index])


def _summarise(records: list[dict[str, Any]]) -> dict[str, float]:
    with_calls = [r for r in records if r.get("info", {}).get("expects_calls", True)]
    out: dict[str, float] = {"num_examples": float(len(records)), "num_with_calls": float(len(with_calls))}

    def exact(r: dict[str, Any]) -> bool:
        if "exact" in r.get("info", {}):
            return bool(r["info"]["exact"])
        comps = r["reward_components"]
        return all(abs(float(comps[n]) - REWARD_HIGH[i]) < 1e-6 for i, n in enumerate(REWARD_NAMES[:3]))

    if with_calls:
        hits = sum(exact(r) for r in with_calls)
        out["all_exact_accuracy"] = 100.0 * hits / len(with_calls)
        low, high = wilson_interval(hits, len(with_calls))
        out["all_exact_ci95_low"], out["all_exact_ci95_high"] = 100.0 * low, 100.0 * high
    for i, name in enumerate(REWARD_NAMES):
        # Correctness rewards are 0 by rule when no call is expected: average them over call examples only.
        pool = records if name == "format" else with_calls
        if pool:
            out[name] = float(np.mean([_component_percent(float(r["reward_components"][name]), i) for r in pool]))
    return out


def toolcall_metrics(results: Iterable[EpisodeRecord]) -> dict[str, float]:
    """Evaluation metrics, overall and per data set (keys ``"<dataset>/<metric>"``).

    ``all_exact_accuracy``: percent of examples with expected calls that the env judged exact
    (``info["exact"]``: BFCL's own verdict on a BFCL task of a Python category, else the three
    correctness rewards at their maxima; records without it fall back to the rewards);
    ``all_exact_ci95_low`` / ``_high``: its
    95 % Wilson interval (:func:`wilson_interval`). ``function_name``, ``parameter``,
    ``values``: each reward mapped to [0, 100] and averaged over the examples with
    expected calls; ``format``: the same over all examples. Records are
    ``{"task_id", "reward_components", "info"}`` as the env's ``step`` returns them.
    """
    results = list(results)
    if not results:
        return {}
    out = _summarise(results)
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        name = r.get("info", {}).get("dataset") or str(r.get("task_id", "")).split("/", 1)[0]
        groups.setdefault(name, []).append(r)
    if len(groups) > 1 or next(iter(groups)) != "":
        for name, recs in sorted(groups.items()):
            out.update({f"{name}/{k}": v for k, v in _summarise(recs).items()})
    return out
