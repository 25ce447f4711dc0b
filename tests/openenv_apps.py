"""OpenEnv apps written with the ``openenv`` package alone (no corrgrpo code on the server side).

``scripted_rewards`` sends ``metadata["reward_components"]`` that go wrong on
purpose, by the reset seed: 0 a good vector, 1 a missing component, 2 a NaN,
3 a value outside [0, 1], 4 an extra component. Run with
``uvicorn tests.openenv_apps:scripted_rewards``. ``counting`` is a three-turn episode
whose reward depends on every earlier turn (for replaying an episode on another server).
``mcp_adder`` is an MCP tool env (one tool, ``add``).
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


def _adder_environment() -> Environment:
    """An MCP tool env (OpenEnv's ``MCPEnvironment`` over a FastMCP server) with one tool, ``add``.

    The task (by reset seed) is to make ``seed`` with one call; the call ends the episode
    with reward 1 when the sum is right, else 0.
    """
    from fastmcp import FastMCP
    from openenv.core.env_server.mcp_environment import MCPEnvironment
    from openenv.core.env_server.mcp_types import CallToolAction

    class AdderEnvironment(MCPEnvironment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            mcp = FastMCP("adder")

            @mcp.tool()
            def add(a: int, b: int) -> int:
                """Add two integers."""
                return a + b

            super().__init__(mcp)
            self._target = 0
            self._state = State(step_count=0)

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
            self._target = int(seed or 0)
            self._state = State(episode_id=episode_id, step_count=0)
            return Observation(metadata={"task": f"Use add to make {self._target}."})

        def _judge(self, action: Action, obs: Observation) -> Observation:
            if isinstance(action, CallToolAction):
                self._state.step_count += 1
                data = getattr(obs.result, "data", None) if obs.result is not None else None
                obs.done = True
                obs.reward = 1.0 if data == self._target else 0.0
            return obs

        def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
            return self._judge(action, super().step(action, timeout_s=timeout_s, **kwargs))

        async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
            # the WebSocket route calls step_async, which MCPEnvironment implements itself
            return self._judge(action, await super().step_async(action, timeout_s=timeout_s, **kwargs))

        def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
            return Observation(done=True, reward=0.0, metadata={"error": "call the add tool"})

        @property
        def state(self) -> State:
            return self._state

    return AdderEnvironment()


def _mcp_app():
    from openenv.core.env_server.mcp_types import CallToolObservation

    env_cls = type(_adder_environment())
    return create_app(env_cls, Action, CallToolObservation, env_name="adder", max_concurrent_envs=8)


mcp_adder = _mcp_app()
