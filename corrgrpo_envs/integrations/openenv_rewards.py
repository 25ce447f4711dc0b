"""The reward components an OpenEnv env expects, and the check of every step against them.

The components come from the server's schema, else the config, else a first episode
(:meth:`_RewardContract.resolve`); a step whose vector misses one, has an extra one, changes
where its rewards come from, or holds a value that is not a number float32 holds within the
bounds is refused with a :class:`~corrgrpo_envs.integrations.openenv_remote.RemoteRewardError`
(:meth:`_RewardContract.vector`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from corrgrpo_envs.integrations.openenv_remote import RemoteEnvError
from corrgrpo_envs.integrations.openenv_schema import (
    _FIX,
    _bounds,
    _components_in,
    _lie,
    _metadata,
    _number,
    _spec,
)

Components = tuple[list[str], list[float], list[float], list[float] | None]


class _RewardContract:
    """Where the components were declared (``origin``, in words), whether a step's scalar may stand
    for the one component (``scalar_ok``: no server published them), and where a first episode
    carried them (``learned_source``; a later step elsewhere means the server changed)."""

    def __init__(self, origin: str, scalar_ok: bool, learned_source: str | None = None):
        self.origin = origin
        self.scalar_ok = scalar_ok
        self.learned_source = learned_source

    @classmethod
    def resolve(
        cls,
        server: str,
        published: Sequence[Mapping[str, Any]] | None,
        names: Sequence[str] | None,
        low: Sequence[float] | None,
        high: Sequence[float] | None,
        weights: Sequence[float] | None,
        learn: Callable[[], dict[str, Any]],
    ) -> tuple[_RewardContract, Components]:
        """The contract, and the names, bounds and weights: the server's schema, else the config,
        else ``learn()`` (a first episode); checked in float32, a mismatch a :class:`RemoteEnvError`."""
        learned_source: str | None = None
        declared: list[tuple[str, Any, Any, Any]] | None = None
        try:
            if published is not None:
                declared = _spec(published, f"OpenEnv server {server} /schema")
                p_names = [r[0] for r in declared]
                if names is not None and [str(n) for n in names] != p_names:
                    raise RemoteEnvError(
                        f"OpenEnv server {server} publishes rewards {p_names}, "
                        f"the config says {list(names)}"
                    )
                p_low, p_high = _bounds(p_names, [r[1] for r in declared], [r[2] for r in declared],
                                        f"OpenEnv server {server} /schema")
                for key, given, theirs in (("low", low, p_low), ("high", high, p_high)):
                    if given is not None and [float(x) for x in given] != theirs:
                        raise RemoteEnvError(
                            f"OpenEnv server {server}: reward_{key} {list(given)} differs from the server's "
                            f"{theirs} for {p_names}"
                        )
                names = p_names
                origin = f"published by {server}"
            elif names is not None:
                names = [str(n) for n in names]
                origin = "env.reward_names"
            else:
                learned = learn()
                names, declared = list(learned["names"]), learned["declared"]
                learned_source = learned["source"]
                origin = f"learned from the {learned['when']} of {learned['server']}"
                if declared is not None and [r[0] for r in declared] != names:
                    declared = None  # a spec for other names says nothing about these
            k = len(names)
            if low is None:
                low = [r[1] for r in declared] if declared else [-math.inf] * k
            if high is None:
                high = [r[2] for r in declared] if declared else [math.inf] * k
            where = "env" if published is None else f"OpenEnv server {server}"
            lo, hi = _bounds(names, list(low), list(high), where)
            weights_from = "env.reward_weights"
            if weights is None and declared:
                weights, weights_from = [r[3] for r in declared], f"OpenEnv server {server}"
            w = None if weights is None else list(weights)
            if w is not None:
                if len(w) != k:
                    raise ValueError(f"{weights_from}: {len(w)} weights for the {k} components {names}")
                w = [_number(x, f"{weights_from}: the weight of {n!r}") for n, x in zip(names, w)]
        except ValueError as exc:
            raise RemoteEnvError(str(exc)) from None
        return cls(origin, published is None, learned_source), (names, lo, hi, w)

    def vector(self, result: Any, where: str, names: Sequence[str], low: Sequence[Any],
               high: Sequence[Any]) -> dict[str, float]:
        """The step's components, checked against ``names`` and their bounds (in float32); a
        :class:`RemoteRewardError` at ``where`` (server and task) when they break them."""
        meta = _metadata(result)
        found = _components_in(meta)
        if found is not None:
            source, raw = found
        elif len(names) == 1 and self.scalar_ok:
            reward = result.reward
            if reward is None and not result.done:
                reward = 0.0  # OpenEnv's reward is optional: a turn that scores nothing, mid-episode
            source, raw = "reward", {names[0]: reward}
        else:
            raise _lie(where, f"the step carries no reward components {list(names)} "
                              f"({self.origin}); {_FIX}")
        if self.learned_source is not None and source != self.learned_source:
            raise _lie(where, f"the step's rewards are in {source}, but they were in {self.learned_source} "
                              f"({self.origin} {list(names)}): the server's components "
                              f"changed; {_FIX}")
        missing = [n for n in names if n not in raw]
        extra = [str(n) for n in raw if n not in names]
        if missing or extra:
            raise _lie(where, f"{source} is missing component(s) {missing} / has unknown {extra}; "
                              f"expected {list(names)} ({self.origin}); {_FIX}")
        values: dict[str, float] = {}
        for name, lo, hi in zip(names, low, high):
            try:
                value = _number(raw[name], f"component {name!r}")
            except ValueError as exc:
                raise _lie(where, str(exc)) from None
            if not (float(lo) - 1e-6 <= value <= float(hi) + 1e-6):
                raise _lie(where, f"component {name!r} = {value} is outside its bounds [{lo:g}, {hi:g}]")
            values[name] = value
        return values
