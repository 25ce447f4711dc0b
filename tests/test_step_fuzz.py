"""Pathological actions through ``env.step`` and ``GroupedVectorEnv.step`` of every registered env.

Every action here is a string of up to 200,000 characters (the default action limit) built
to hit a known failure of text parsers: floods of opening or closing tags (quadratic for
lazy regular expressions), blank lines, backticks, JSON nested deep enough to exhaust the
stack, integers longer than Python's int-string conversion limit, NUL bytes, lone
surrogates, and floods of well-formed calls. Each step must return a reward inside the
env's reward space, raise nothing, and take at most a step's budget of CPU time
(``step_checks``: counted in a unit of reference work measured in this process, about 0.1 s
here). The code domain runs programs in a sandbox and has fuzz tests of its own.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from cpu_budget import least_cpu_seconds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from step_checks import check_reward, step_budget, timed_step

import corrgrpo_envs
from corrgrpo_envs.core import MAX_ACTION_CHARS
from corrgrpo_envs.vector import GroupedVectorEnv

#: Envs fuzzed elsewhere: the code domain runs the action in a sandbox.
ELSEWHERE = {"corrgrpo/Code-v0"}
#: Small configurations, so making the envs is quick; other envs use their defaults.
ENV_KWARGS = {
    "corrgrpo/ToolCall-v0": {"num_tasks": 30},
    "corrgrpo/AgentDojo-v0": {"suites": ["banking"], "attacks": ["important_instructions"], "split": "train"},
}
ENV_IDS = [i for i in corrgrpo_envs.registered_ids() if i.startswith("corrgrpo/") and i not in ELSEWHERE]
N = MAX_ACTION_CHARS - 1000  # room for a short prefix and suffix


def _fill(unit: str, n: int = N) -> str:
    return unit * max(1, n // len(unit))


def _deep(n: int) -> str:
    return "[" * n + "]" * n


def pathological_actions(name: str) -> list[tuple[str, str]]:
    """(label, action) pairs; ``name`` is a tool the env knows, so calls reach the scoring code."""

    def rlla(params: str) -> str:
        return '{"name": "' + name + '", "parameters": ' + params + "}"

    def hermes(args: str) -> str:
        return '<tool_call>\n{"name": "' + name + '", "arguments": ' + args + "}\n</tool_call>"

    think = "<think> hm </think>\n"
    big = "9" * 5000
    huge = "9" * (N // 2)
    actions = [
        ("open-tag flood", _fill("<tool_call>")),
        ("open-tag flood after think", think + _fill("<tool_call>\n")),
        ("close-tag flood", _fill("</tool_call>")),
        ("think-tag flood", _fill("<think>")),
        ("think-close flood", _fill("</think>")),
        ("response-tag flood", think + "<tool_call>\n" + rlla("{}") + "\n</tool_call>\n" + _fill("<response>")),
        ("response-close flood", think + _fill("</response>")),
        ("empty blocks", _fill("<tool_call></tool_call>")),
        ("blocks then open tags", _fill("<tool_call>\n\n</tool_call>", N // 2) + _fill("<tool_call>", N // 2)),
        ("almost-closed tags", _fill("<tool_call></tool_cal")),
        ("less-than flood", _fill("<")),
        ("rlla call flood", think + "<tool_call>\n" + _fill(rlla('{"a": 1}') + "\n", N - 50) + "</tool_call>"),
        ("hermes call flood", _fill(hermes("{}") + "\n")),
        ("blank lines in a block", think + "<tool_call>" + "\n" * N + "</tool_call>"),
        ("junk lines in a block", think + "<tool_call>\n" + _fill("x\n") + "</tool_call>"),
        ("bad JSON lines in a block", think + "<tool_call>\n" + _fill("{]\n") + "</tool_call>"),
        ("non-object lines in a block", think + "<tool_call>\n" + _fill("1\n") + "</tool_call>"),
        ("short call lines", think + "<tool_call>\n" + _fill('{"name": "' + name + '"}\n') + "</tool_call>"),
        ("blank lines", "x" + "\n" * N),
        ("backticks", _fill("`")),
        ("fenced blocks", _fill('```json\n{"name": "' + name + '"}\n```\n')),
        ("deep nesting, bare", "[" * N),
        ("deep nesting, rlla", think + "<tool_call>\n" + rlla(_deep(N // 2 - 50)) + "\n</tool_call>"),
        ("deep nesting, hermes", hermes('{"a": ' + _deep(N // 2 - 50) + "}")),
        ("nesting just past the stack", think + "<tool_call>\n" + rlla('{"a": ' + _deep(990) + "}") + "\n</tool_call>"),
        ("nesting past the depth limit", hermes('{"a": ' + _deep(70) + "}")),
        ("nested objects", hermes('{"a": ' * (N // 7) + "1" + "}" * (N // 7))),
        ("5000-digit integer, rlla", think + "<tool_call>\n" + rlla('{"a": ' + big + "}") + "\n</tool_call>"),
        ("5000-digit integer, hermes", hermes('{"a": ' + big + "}")),
        ("huge integer", hermes('{"a": -' + huge + "}")),
        ("integer in string-encoded arguments", hermes(json.dumps(json.dumps({"a": 1}).replace("1", big)))),
        ("huge float", hermes('{"a": ' + big + '.5e999999}')),
        ("NaN and Infinity", hermes('{"a": NaN, "b": -Infinity}')),
        ("NUL bytes", "<tool_call>\n{\"name\": \"a\x00b\"}\n</tool_call>" + "\x00" * 100),
        ("escaped NUL", hermes('{"a": "\\u0000"}')),
        ("lone surrogate", think + "\ud800 <tool_call>\n" + rlla("{}") + "\n</tool_call>"),
        ("escaped lone surrogate", hermes('{"a": "\\ud800\\udfff\\udc00"}')),
        ("control characters", "\x01\x02\x1b" * 1000 + "text"),
        ("unicode whitespace", "\u00a0\u2028\u3000\x1c\x85" * 1000 + think + "<tool_call>\n" + rlla("{}") + "\n</tool_call>"),
        ("one long line", think + "<tool_call>\n" + rlla(json.dumps({"s": "a" * (N - 100)})) + "\n</tool_call>"),
        ("many keys", hermes(json.dumps({f"k{i}": i for i in range(N // 16)}))),
        ("exactly the action limit", "a" * MAX_ACTION_CHARS),
        ("one past the action limit", "a" * (MAX_ACTION_CHARS + 1)),
    ]
    for label, action in actions:
        assert len(action) <= MAX_ACTION_CHARS + 1, (label, len(action))
    return actions


def _make(env_id: str):
    try:
        return corrgrpo_envs.make(env_id, **ENV_KWARGS.get(env_id, {}))
    except ImportError as exc:  # an optional extra (e.g. agentdojo) is not installed
        pytest.skip(f"{env_id} needs an optional extra that is not installed: {exc}")


def _task_and_tool(env) -> tuple[str, str]:
    """A task whose answer is a tool call (when the domain has any), and one of its tools' names."""
    u = env.unwrapped
    for tid in u.task_ids:
        task = u.tasks.get(tid)
        calls = task.get("expected_calls") if hasattr(task, "get") else None
        if calls:
            return tid, calls[0]["name"]
    obs, info = env.reset(options={"task_id": u.task_ids[0]})
    tools = obs.get("tools") or []
    name = "get_balance"
    if tools:
        first = tools[0]
        name = first.get("function", first).get("name", name)
    return u.task_ids[0], name


@pytest.fixture(scope="module", params=ENV_IDS)
def env_and_task(request):
    env = _make(request.param)
    tid, name = _task_and_tool(env)
    yield request.param, env, tid, name
    env.close()


def test_pathological_actions_step_fast_and_never_raise(env_and_task):
    env_id, env, tid, name = env_and_task
    budget = step_budget(f"{env_id}: a pathological step")
    slow, worst = [], 0.0
    for label, action in pathological_actions(name):
        (obs, reward, terminated, truncated, info), seconds = timed_step(env, tid, action, enough=budget.seconds)
        check_reward(env, reward)
        assert isinstance(obs, dict) and isinstance(info, dict), label
        worst = max(worst, seconds)
        if not budget.allows(seconds):
            slow.append((label, round(budget.in_units(seconds), 1)))
    print(f"costliest step: {budget.describe(worst)}")
    assert not slow, f"{env_id}: steps over {budget.units:g} units ({budget.seconds:.3f} s of CPU): {slow}"


_TAGS = st.sampled_from(
    ["<tool_call>", "</tool_call>", "<think>", "</think>", "<response>", "</response>", "\n", " ", "`",
     "{", "}", "[", "]", '"name"', '"parameters"', '"arguments"', ":", ",", "1" * 30, "\x00", "\ud800"]
)
_TEXT = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(_TAGS, st.text(max_size=5)), max_size=60).map("".join),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(action=_TEXT)
def test_any_string_steps_without_raising(env_and_task, action):
    env_id, env, tid, _ = env_and_task
    env.reset(options={"task_id": tid})
    _, reward, *_ = env.step(action)
    check_reward(env, reward)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_pathological_actions_through_the_grouped_vector_env(env_id):
    if env_id == "corrgrpo/AgentDojo-v0":
        pytest.importorskip("agentdojo", reason="the agentdojo extra is not installed")
    probe = _make(env_id)
    tid, name = _task_and_tool(probe)
    probe.close()
    actions = [a for _, a in pathological_actions(name)]
    group = 8
    budget = step_budget(f"{env_id}: a step of {group} pathological actions", steps=group)
    worst = 0.0
    venv = GroupedVectorEnv(env_id, num_groups=1, group_size=group, **ENV_KWARGS.get(env_id, {}))
    try:
        for start in range(0, len(actions), group):
            chunk = actions[start : start + group]
            batch = chunk + [None] * (group - len(chunk))
            if None in batch:
                # members without an action must have finished: give them a plain one first
                batch = [a if a is not None else "fine" for a in batch]
            (_, rewards, *_), seconds = least_cpu_seconds(
                lambda: venv.reset(task_ids=[tid]), functools.partial(venv.step, batch), enough=budget.seconds
            )
            assert rewards.shape == (group, len(venv.reward_names))
            assert np.all(np.isfinite(rewards))
            assert budget.allows(seconds), (start, budget.describe(seconds))
            worst = max(worst, seconds)
    finally:
        venv.close()
    print(f"costliest step: {budget.describe(worst)}")


@pytest.mark.parametrize("on_malformed", ["end", "error_message"])
def test_agentdojo_reads_at_most_32_calls_per_message(on_malformed):
    pytest.importorskip("agentdojo", reason="the agentdojo extra is not installed")
    from corrgrpo_envs.agentdojo.episode import MAX_CALLS_PER_MESSAGE

    env = corrgrpo_envs.make("corrgrpo/AgentDojo-v0", on_malformed=on_malformed,
                             **ENV_KWARGS["corrgrpo/AgentDojo-v0"]).unwrapped
    env.reset(options={"task_id": env.task_ids[0]})
    call = '<tool_call>\n{"name": "get_balance", "arguments": {}}\n</tool_call>\n'
    obs, reward, terminated, _, info = env.step(call * (MAX_CALLS_PER_MESSAGE + 8))
    too_many = f"{MAX_CALLS_PER_MESSAGE + 8} tool calls in one message, more than the 32 allowed"
    if on_malformed == "end":
        assert terminated and reward.tolist() == [0.0, 0.0] and too_many in info["error"]
    else:
        tools = [m for m in obs["messages"] if m["role"] == "tool"]
        assert len(tools) == MAX_CALLS_PER_MESSAGE + 1 and too_many in tools[-1]["content"]
        assert not terminated
