"""OpenEnv apps written with the ``openenv`` package alone (no corrgrpo code on the server side).

``scripted_rewards`` sends ``metadata["reward_components"]`` that go wrong on
purpose, by the reset seed: 0 a good vector, 1 a missing component, 2 a NaN,
3 a value outside [0, 1], 4 an extra component. Run with
``uvicorn tests.openenv_apps:scripted_rewards``. ``counting`` is a three-turn episode
whose reward depends on every earlier turn (for replaying an episode on another server).
"""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class SayAction(Action):
    message: str


class TextObservation(Observation):
    text: str = ""


class ScriptedRewardEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._seed = 0
        self._state = State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TextObservation:
        self._seed = int(seed or 0)
        self._state = State(episode_id=episode_id, step_count=0)
        return TextObservation(text=f"case {self._seed}: say something")

    def step(self, action: SayAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        self._state.step_count += 1
        parts: dict[str, Any] = {"a": 0.5, "b": 1.0}
        case = self._seed % 5
        if case == 1:
            del parts["b"]
        elif case == 2:
            parts["a"] = float("nan")
        elif case == 3:
            parts["b"] = 7.0
        elif case == 4:
            parts["c"] = 0.0
        return TextObservation(text="ok", done=True, reward=1.5, metadata={"reward_components": parts})

    @property
    def state(self) -> State:
        return self._state


scripted_rewards = create_app(
    ScriptedRewardEnvironment, SayAction, TextObservation, env_name="scripted", max_concurrent_envs=8
)


class CountingEnvironment(Environment):
    """Three turns; each turn's reward is 0.1 x the number of characters said so far (capped at 1)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._said = 0
        self._state = State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TextObservation:
        self._said = 0
        self._state = State(episode_id=episode_id, step_count=0)
        return TextObservation(text="say three things")

    def step(self, action: SayAction, timeout_s: float | None = None, **kwargs: Any) -> TextObservation:
        self._state.step_count += 1
        self._said += len(action.message)
        score = min(0.1 * self._said, 1.0)
        return TextObservation(text=f"turn {self._state.step_count}", done=self._state.step_count >= 3,
                               reward=score, metadata={"reward_components": {"said": score}})

    @property
    def state(self) -> State:
        return self._state


counting = create_app(CountingEnvironment, SayAction, TextObservation, env_name="counting", max_concurrent_envs=8)
