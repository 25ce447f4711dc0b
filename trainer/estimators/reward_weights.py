"""Reward weights over a run: constants or piecewise-linear schedules, one per component.

``algorithm.reward_weights`` is a list with one entry per component (in reward-vector
order) or a mapping from component names to entries (components left out keep the
env's weight). An entry is a number, or a schedule ``{values: [[step, weight], ...]}``:
the weight at step ``s`` is linear between the listed points and constant before the
first and after the last. ``s`` counts the optimizer steps done before the batch (0 for
the first batch; ``metrics.jsonl``'s ``step`` minus 1), so a schedule is a pure
function of the step and a resumed run continues it exactly. ::

    algorithm:
      reward_weights:
        digits: 1.0
        has_a: {values: [[0, 0.5], [100, 1.5]]}   # 0.5 -> 1.5 over the first 100 steps

Weights that are not finite, schedule steps that are not integers >= 0 in increasing
order, unknown component names and a list of the wrong length are errors naming the key.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from corrgrpo_registry.settings import ConfigError

__all__ = ["RewardWeights", "Schedule", "check_reward_weights", "resolve_reward_weights"]

KEY = "algorithm.reward_weights"


class WeightSpecError(ConfigError):
    """A reward weight or schedule is not allowed (the message names the key)."""


@dataclass(frozen=True)
class Schedule:
    """A piecewise-linear weight over steps: ``points`` ``((step, weight), ...)``, steps increasing."""

    points: tuple[tuple[int, float], ...]

    def at(self, step: int) -> float:
        steps, values = zip(*self.points)
        return float(np.interp(step, steps, values))


def _number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise WeightSpecError(f"{key}: expected a number or {{values: [[step, weight], ...]}}, got {value!r}")
    try:
        x = float(value)
    except ValueError:
        raise WeightSpecError(f"{key}: expected a number, got {value!r}") from None
    if not math.isfinite(x):
        raise WeightSpecError(f"{key}: {x!r} is out of range; allowed: a finite number")
    return x


def _entry(value: Any, key: str) -> float | Schedule:
    """One component's weight: a finite number or a validated schedule."""
    if not isinstance(value, dict):
        return _number(value, key)
    if set(value) != {"values"}:
        raise WeightSpecError(f"{key}: a schedule has exactly one key, 'values'; got {sorted(value)}")
    points = value["values"]
    if not isinstance(points, (list, tuple)) or not points:
        raise WeightSpecError(f"{key}.values: expected a non-empty list of [step, weight] pairs, got {points!r}")
    out: list[tuple[int, float]] = []
    for i, point in enumerate(points):
        where = f"{key}.values[{i}]"
        if not isinstance(point, (list, tuple)) or len(point) != 2:
            raise WeightSpecError(f"{where}: expected a [step, weight] pair, got {point!r}")
        step, weight = point
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise WeightSpecError(f"{where}: step {step!r} is not allowed; allowed: an integer >= 0")
        if out and step <= out[-1][0]:
            raise WeightSpecError(
                f"{where}: step {step} is not after step {out[-1][0]}; the steps of a schedule must increase"
            )
        out.append((step, _number(weight, where)))
    return Schedule(tuple(out))


def check_reward_weights(spec: Any, key: str = KEY) -> list[float | Schedule] | dict[str, float | Schedule] | None:
    """Validate ``algorithm.reward_weights`` (without the env: names and length are checked later)."""
    if spec is None:
        return None
    if isinstance(spec, dict):
        return {str(name): _entry(value, f"{key}.{name}") for name, value in spec.items()}
    if isinstance(spec, (list, tuple)):
        return [_entry(value, f"{key}[{i}]") for i, value in enumerate(spec)]
    raise WeightSpecError(f"{key}: expected a list (one entry per component) or a mapping by name, got {spec!r}")


class RewardWeights:
    """The weight of each component at each step."""

    def __init__(self, names: Sequence[str], entries: Sequence[float | Schedule]):
        self.names = list(names)
        self.entries = list(entries)

    @property
    def scheduled(self) -> bool:
        return any(isinstance(e, Schedule) for e in self.entries)

    def at(self, step: int) -> np.ndarray:
        """``[K]`` float64 weights in force at ``step`` (steps done before the batch)."""
        return np.array([e.at(step) if isinstance(e, Schedule) else e for e in self.entries], dtype=np.float64)


def resolve_reward_weights(
    spec: Any, names: Sequence[str], defaults: Sequence[float], key: str = KEY
) -> RewardWeights:
    """Each of ``names``' weight: from ``spec`` (a list or a mapping by name), else ``defaults``."""
    checked = check_reward_weights(spec, key)
    if checked is None:
        return RewardWeights(names, [float(d) for d in defaults])
    if isinstance(checked, dict):
        unknown = sorted(set(checked) - set(names))
        if unknown:
            raise WeightSpecError(
                f"{key}.{unknown[0]}: no reward component is named {unknown[0]!r}; components: {', '.join(names)}"
            )
        return RewardWeights(names, [checked.get(n, float(d)) for n, d in zip(names, defaults)])
    if len(checked) != len(names):
        raise WeightSpecError(f"{key} has {len(checked)} entries for {len(names)} rewards {list(names)}")
    return RewardWeights(names, checked)
