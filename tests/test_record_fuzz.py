"""Record shapes, not only text, through ``env.step`` of every text-scored domain.

The code domain decodes the values a program emits (``tests/test_code_judge.py``). The
other domains read values out of the action itself: tool-call arguments (JSON) that the
rewards compare with the expected ones (ToolCall), that AgentDojo's runtime validates
and runs, or that the toy rewards scan as text. Here the action carries values of every
shape that made the code judge slow: nested, many distinct integers with one hash (as a
list, and as an object's values), integers at and past the int-string limit, deep nesting,
long strings, many keys, repeated keys; each placed in every argument of a tool the env
knows, in both call formats, and as plain text. Every step must cost at most
:data:`BUDGET_UNITS` units of this process's CPU (``time.process_time``; the unit is
reference work measured in this process, ``cpu_budget``: about 1 s here) on actions of up
to 200,000 characters.
"""

from __future__ import annotations

import json

import pytest
from cpu_budget import CpuBudget, least_cpu_seconds
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import corrgrpo_envs
from corrgrpo_envs.core import MAX_ACTION_CHARS

#: Host CPU one step may take on any action here, in units of reference work (about 1 s here).
BUDGET_UNITS = 90
HASH_MODULUS = (1 << 61) - 1
ENV_IDS = [i for i in corrgrpo_envs.registered_ids() if i.startswith("corrgrpo/") and i != "corrgrpo/Code-v0"]
ENV_KWARGS = {
    "corrgrpo/ToolCall-v0": {"num_tasks": 30},
    "corrgrpo/AgentDojo-v0": {"suites": ["banking"], "attacks": ["important_instructions"], "split": "train"},
}
ROOM = MAX_ACTION_CHARS - 5_000  # the value's share of the action


def value_text(kind: str, size: float) -> str:
    """JSON text of one value of ``kind``, scaled by ``size`` in (0, 1] to fit :data:`ROOM`."""
    n = max(1, int(size * ROOM))
    if kind == "colliding_list":
        return "[" + ",".join(str(k * HASH_MODULUS) for k in range(1, n // 24 + 1)) + "]"
    if kind == "colliding_values":
        return "{" + ",".join(f'"k{k}":{k * HASH_MODULUS}' for k in range(1, n // 32 + 1)) + "}"
    if kind == "int_at_limit":
        return "[" + ",".join(["9" * min(4300, n)] * max(1, n // 4301)) + "]"
    if kind == "int_past_limit":
        return "9" * n
    if kind == "deep_list":
        return "[" * (n // 2) + "]" * (n // 2)
    if kind == "deep_object":
        return '{"a":' * (n // 6) + "1" + "}" * (n // 6)
    if kind == "long_string":
        return json.dumps("a" * n)
    if kind == "many_keys":
        return json.dumps({f"k{i}": i for i in range(n // 16)})
    if kind == "repeated_keys":
        return "{" + ",".join(['"a":1'] * (n // 6)) + "}"
    if kind == "floats":
        return "[" + ",".join(["1e308", "-0.0", "5e-324", "1.7976931348623157e308"] * (n // 41)) + "]"
    raise ValueError(kind)


KINDS = ["colliding_list", "colliding_values", "int_at_limit", "int_past_limit", "deep_list",
         "deep_object", "long_string", "many_keys", "repeated_keys", "floats"]


def actions_for(kind: str, size: float, tool: str, params: list[str]) -> list[str]:
    """The value in every argument of ``tool`` (shrunk to fit), in the Hermes and RLLA call
    formats, and as a final answer's text."""
    params = params or ["x"]
    text = value_text(kind, size / len(params))
    args = "{" + ",".join(f"{json.dumps(p)}:{text}" for p in params) + "}"
    hermes = f'<tool_call>\n{{"name": {json.dumps(tool)}, "arguments": {args}}}\n</tool_call>'
    rlla = f'<think> x </think>\n<tool_call>\n{{"name": {json.dumps(tool)}, "parameters": {args}}}\n</tool_call>'
    out = [hermes, rlla, "The answer is " + text]
    for action in out:
        assert len(action) <= MAX_ACTION_CHARS, (kind, size, len(action))
    return out


def _make(env_id: str):
    try:
        return corrgrpo_envs.make(env_id, **ENV_KWARGS.get(env_id, {}))
    except ImportError as exc:  # an optional extra (agentdojo) is not installed
        pytest.skip(f"{env_id} needs an optional extra that is not installed: {exc}")


def _task_and_tool(env) -> tuple[str, str, list[str]]:
    """A task, a tool its observation lists (or its expected call), and that tool's parameters."""
    u = env.unwrapped
    for tid in u.task_ids:
        calls = u.tasks.get(tid).get("expected_calls") if hasattr(u.tasks.get(tid), "get") else None
        if calls:
            return tid, calls[0]["name"], sorted(calls[0].get("arguments", {}) or ["x"])
    tid = u.task_ids[0]
    obs, _ = env.reset(options={"task_id": tid})
    for tool in obs.get("tools") or []:
        spec = tool.get("function", tool)
        props = (spec.get("parameters") or {}).get("properties") or {}
        if props:
            return tid, spec["name"], sorted(props)
    return tid, "get_balance", ["x"]


@pytest.fixture(scope="module", params=ENV_IDS)
def env_case(request):
    env = _make(request.param)
    yield (request.param, env, *_task_and_tool(env))
    env.close()


def _cpu_of_step(env, task_id: str, action: str, enough: float) -> float:
    """Least CPU seconds of up to 3 steps on ``action`` (fewer once one takes at most ``enough``);
    the reward stays in its space."""
    (_, reward, *_), seconds = least_cpu_seconds(
        lambda: env.reset(options={"task_id": task_id}), lambda: env.step(action), enough=enough
    )
    space = env.unwrapped.reward_space
    assert reward.shape == space.shape and (reward >= space.low).all() and (reward <= space.high).all()
    return seconds


# the six examples below are each kind at its largest; a few drawn sizes cover the rest
@settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(kind="colliding_list", size=1.0)
@example(kind="colliding_values", size=1.0)
@example(kind="int_at_limit", size=1.0)
@example(kind="deep_list", size=1.0)
@example(kind="long_string", size=1.0)
@example(kind="many_keys", size=1.0)
@given(kind=st.sampled_from(KINDS), size=st.floats(0.001, 1.0))
def test_record_shapes_step_within_the_budget(env_case, kind, size):
    env_id, env, tid, tool, params = env_case
    budget = CpuBudget(BUDGET_UNITS, f"{env_id}: a step on {kind} records")
    worst = 0.0
    for action in actions_for(kind, size, tool, params):
        seconds = _cpu_of_step(env, tid, action, enough=budget.seconds)
        assert budget.allows(seconds), (size, action[:80], budget.describe(seconds))
        worst = max(worst, seconds)
    print(f"size {size:.3f}, costliest step: {budget.describe(worst)}")
