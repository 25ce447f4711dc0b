"""Step metrics that stay exact when a batch is split into micro-batches and processes.

A loss reports each diagnostic of its (micro-)batch as a :class:`Mean` (a total and
its weight, e.g. clipped tokens over tokens), a :class:`Max` or a :class:`Min`. They
are floats (their value), so a single call reads as before; :class:`MetricAccumulator`
combines the parts of a step by summing totals and weights and taking maxima and
minima, then reduces them over processes, so the logged number is the one of the
whole step's batch however it was split. A plain float counts as a mean of weight 1.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["Max", "Mean", "MetricAccumulator", "Min"]


class Mean(float):
    """``total / weight`` (0 when the weight is 0), remembering both parts."""

    total: float
    weight: float

    def __new__(cls, total: float, weight: float) -> Mean:
        total, weight = float(total), float(weight)
        obj = super().__new__(cls, total / weight if weight > 0 else 0.0)
        obj.total, obj.weight = total, weight
        return obj


class Max(float):
    """A maximum (``-inf`` for an empty batch)."""


class Min(float):
    """A minimum (``inf`` for an empty batch)."""


class MetricAccumulator:
    """Combines per-call metrics of one step and reduces them over processes."""

    def __init__(self) -> None:
        self._means: dict[str, list[float]] = {}
        self._max: dict[str, float] = {}
        self._min: dict[str, float] = {}

    def add(self, metrics: dict[str, Any], prefix: str = "") -> None:
        for name, value in metrics.items():
            key = prefix + name
            if isinstance(value, Max):
                self._max[key] = max(self._max.get(key, -math.inf), float(value))
            elif isinstance(value, Min):
                self._min[key] = min(self._min.get(key, math.inf), float(value))
            else:
                total, weight = (
                    (value.total, value.weight) if isinstance(value, Mean) else (float(value), 1.0)
                )
                acc = self._means.setdefault(key, [0.0, 0.0])
                acc[0] += total
                acc[1] += weight

    def reduce(self, accelerator: Any | None = None) -> dict[str, float]:
        """Whole-step values, summed / maxed / minned over processes (keys sorted).

        Every process must have added the same keys (they run the same loss code).
        """
        means = sorted(self._means)
        maxes, mins = sorted(self._max), sorted(self._min)
        sums = torch.tensor([v for k in means for v in self._means[k]], dtype=torch.float64)
        extremes = torch.tensor(
            [self._max[k] for k in maxes] + [-self._min[k] for k in mins], dtype=torch.float64
        )
        if accelerator is not None and accelerator.num_processes > 1:
            device = accelerator.device
            sums = accelerator.reduce(sums.to(device), "sum").cpu()
            if extremes.numel():
                gathered = accelerator.gather(extremes.to(device)[None]).cpu()
                extremes = gathered.amax(dim=0)
        out: dict[str, float] = {}
        for i, key in enumerate(means):
            total, weight = float(sums[2 * i]), float(sums[2 * i + 1])
            out[key] = total / weight if weight > 0 else math.nan
        for i, key in enumerate(maxes):
            out[key] = float(extremes[i])
        for i, key in enumerate(mins):
            out[key] = -float(extremes[len(maxes) + i])
        return {k: (v if math.isfinite(v) else math.nan) for k, v in sorted(out.items())}
