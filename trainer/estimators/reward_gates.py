"""Reward gates: a component counts only when other components are met.

``algorithm.reward_gates: {correct: [format, compile]}`` scores ``correct`` at its lower
bound unless ``format`` and ``compile`` are both at their upper bounds;
``{correct: {format: 1.0, compile: 0.5}}`` gives each gate its own threshold (``null``: the
gate's upper bound). Gates read the RAW reward vectors the env returned (a gate is never
itself gated first, so the order of the entries does not matter) and are applied before
advantages and dynamic sampling, so every estimator and the "all rewards equal" test of
dynamic sampling see the gated vectors. A gate that does not apply to a response (NaN)
is not met; a gated component that does not apply stays NaN. The trainer logs
``reward/<name>/mean`` of the gated vectors and ``reward_raw/<name>/mean`` and
``gate/<name>/open_fraction`` for each gated component.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["RewardGates", "check_reward_gates"]

KEY = "algorithm.reward_gates"

#: A gate is met when its value is >= its threshold minus this much (relative, at least
#: absolute): float32 rewards of exactly the threshold must pass.
TOLERANCE = 1e-6


def check_reward_gates(spec: Any, key: str = KEY) -> dict[str, dict[str, float | None]]:
    """``{gated: {gate: threshold or None}}`` from the config's form (names checked later)."""
    if spec is None:
        return {}
    if not isinstance(spec, dict):
        raise ValueError(f"{key}: expected a mapping {{component: [gate, ...]}}, got {spec!r}")
    out: dict[str, dict[str, float | None]] = {}
    for gated, gates in spec.items():
        where = f"{key}.{gated}"
        if isinstance(gates, str):
            gates = [gates]
        if isinstance(gates, (list, tuple)):
            if not gates or not all(isinstance(g, str) for g in gates):
                raise ValueError(f"{where}: expected a non-empty list of component names, got {gates!r}")
            gates = {g: None for g in gates}
        if not isinstance(gates, dict) or not gates:
            raise ValueError(f"{where}: expected a list of gates or a mapping {{gate: threshold}}, got {gates!r}")
        checked: dict[str, float | None] = {}
        for gate, threshold in gates.items():
            if gate == gated:
                raise ValueError(f"{where}.{gate}: a component cannot gate itself")
            if threshold is not None:
                if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
                    raise ValueError(f"{where}.{gate}: threshold {threshold!r} is not allowed; allowed: a finite number or null")
                threshold = float(threshold)
            checked[str(gate)] = threshold
        out[str(gated)] = checked
    return out


class RewardGates:
    """Gates resolved against the env's components and bounds.

    Args:
        spec: ``algorithm.reward_gates``.
        names: the component names, in reward-vector order.
        low, high: each component's bounds (``reward_space.low`` / ``.high``).
    """

    def __init__(self, spec: Any, names: Sequence[str], low: Sequence[float], high: Sequence[float]):
        self.names = list(names)
        index = {n: k for k, n in enumerate(self.names)}
        checked = check_reward_gates(spec)
        self.rules: list[tuple[int, float, list[tuple[int, float]]]] = []
        for gated, gates in checked.items():
            if gated not in index:
                raise ValueError(f"{KEY}.{gated}: no reward component is named {gated!r}; components: {', '.join(self.names)}")
            pairs = []
            for gate, threshold in gates.items():
                if gate not in index:
                    raise ValueError(
                        f"{KEY}.{gated}: gate {gate!r} is not a reward component; components: {', '.join(self.names)}"
                    )
                g = index[gate]
                pairs.append((g, float(high[g]) if threshold is None else threshold))
            self.rules.append((index[gated], float(low[index[gated]]), pairs))

    def __bool__(self) -> bool:
        return bool(self.rules)

    @property
    def gated(self) -> list[int]:
        """Indices of the gated components."""
        return [k for k, _, _ in self.rules]

    def open(self, rewards: np.ndarray) -> np.ndarray:
        """``[n, len(rules)]`` bool: every gate of each rule is met (NaN is not)."""
        raw = np.asarray(rewards, dtype=np.float64)
        cols = []
        for _, _, pairs in self.rules:
            ok = np.ones(len(raw), dtype=bool)
            for g, threshold in pairs:
                ok &= raw[:, g] >= threshold - TOLERANCE * max(1.0, abs(threshold))  # NaN compares False
            cols.append(ok)
        return np.stack(cols, axis=1) if cols else np.zeros((len(raw), 0), dtype=bool)

    def apply(self, rewards: np.ndarray) -> np.ndarray:
        """A copy of ``rewards`` ``[n, K]`` with each closed gated component at its lower bound."""
        out = np.array(rewards, copy=True)
        if not self.rules:
            return out
        is_open = self.open(rewards)
        for j, (k, low, _) in enumerate(self.rules):
            closed = ~is_open[:, j] & ~np.isnan(out[:, k])
            out[closed, k] = low
        return out

    def metrics(self, raw: np.ndarray) -> dict[str, float]:
        """``reward_raw/<name>/mean`` and ``gate/<name>/open_fraction`` of each gated component."""
        out: dict[str, float] = {}
        is_open = self.open(raw)
        for j, (k, _, _) in enumerate(self.rules):
            col = np.asarray(raw[:, k], dtype=np.float64)
            col = col[np.isfinite(col)]
            name = self.names[k]
            out[f"reward_raw/{name}/mean"] = float(col.mean()) if col.size else float("nan")
            out[f"gate/{name}/open_fraction"] = float(is_open[:, j].mean()) if len(raw) else float("nan")
        return out
