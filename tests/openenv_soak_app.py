"""``corrgrpo serve``'s app for a corrgrpo env, with steps that lie on command: the server half of a fault soak.

The env (``SOAK_ENV``, default the toy ``corrgrpo/ScaleDominance-v0``) is served exactly as
``corrgrpo serve`` serves it, except that each step first reads the control file named by
``SOAK_CONTROL``; when it holds one of these words, the step's answer is corrupted:

* ``nan`` / ``inf``: the first reward component is NaN / +infinity;
* ``huge``: the first component is 1e300 (finite as a float64, infinite as the float32 the
  client stores);
* ``renamed``: the first component arrives under another name;
* ``oversize``: the observation carries a 40 MB message.

Anything else (or no file) serves the truth. Run with
``SOAK_CONTROL=PATH uvicorn tests.openenv_soak_app:app --factory``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

LIES = ("nan", "inf", "huge", "renamed", "oversize")


def _lie() -> str:
    path = os.environ.get("SOAK_CONTROL")
    if not path:
        return ""
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _corrupt(observation: Any, lie: str) -> None:
    parts = dict(observation.metadata.get("reward_components", {}))
    if not parts:
        return
    first = next(iter(parts))
    if lie == "nan":
        parts[first] = float("nan")
    elif lie == "inf":
        parts[first] = float("inf")
    elif lie == "huge":
        parts[first] = 1e300
    elif lie == "renamed":
        parts[first + "_v2"] = parts.pop(first)
    elif lie == "oversize":
        observation.messages = [*observation.messages, {"role": "user", "content": "x" * (40 << 20)}]
    observation.metadata = {**observation.metadata, "reward_components": parts}


def app() -> Any:
    """The served app (a factory: each uvicorn process builds its own)."""
    from corrgrpo_envs.integrations import openenv_server

    served = openenv_server.MultiRewardOpenEnv

    class LyingOpenEnv(served):  # type: ignore[misc, valid-type]
        def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
            observation = super().step(action, timeout_s=timeout_s, **kwargs)
            lie = _lie()
            if lie in LIES:
                _corrupt(observation, lie)
            return observation

    openenv_server.MultiRewardOpenEnv = LyingOpenEnv
    try:
        return openenv_server.build_app(os.environ.get("SOAK_ENV", "corrgrpo/ScaleDominance-v0"),
                                        {"split": "all"}, max_sessions=64)
    finally:
        openenv_server.MultiRewardOpenEnv = served
