"""corrgrpo/ToolCall-v0: API, generator, metrics, configs."""

from __future__ import annotations

import collections
import pickle
from pathlib import Path

import numpy as np
import pytest
import yaml

import corrgrpo_envs
from corrgrpo_envs.tasks import Task, TaskSource
from corrgrpo_envs.toolcall.answer_format import parse_answer, render_answer
from corrgrpo_envs.toolcall.env import ToolCallEnv, toolcall_metrics
from corrgrpo_envs.toolcall.generator import TASK_KINDS, TOOL_FAMILIES, generate_task

CONFIGS = Path(__file__).resolve().parents[1] / "env_configs"
MAXIMA = (0.5, 1.0, 1.5, 1.0)


@pytest.fixture(scope="module")
def env() -> ToolCallEnv:
    return ToolCallEnv(num_tasks=400, seed=0)


def test_registered_and_made_by_id():
    env = corrgrpo_envs.make("corrgrpo/ToolCall-v0", num_tasks=20)
    u = env.unwrapped
    assert isinstance(u, ToolCallEnv)
    assert u.reward_names == ("function_name", "parameter", "values", "format")
    assert u.reward_space.low.tolist() == [-0.5, -1.0, -1.5, 0.0]
    assert u.reward_space.high.tolist() == [0.5, 1.0, 1.5, 1.0]
    assert u.reward_weights.tolist() == [1.0, 1.0, 1.0, 1.0]
    assert len(u.task_ids) == 20


def test_reset_gives_a_conversation_with_tool_schemas(env):
    obs, info = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    assert [m["role"] for m in obs["messages"]] == ["system", "user"]
    assert "**Available Tools**" in obs["messages"][0]["content"]
    assert "<tool_call>" in obs["messages"][0]["content"]
    names = [t["name"] for t in obs["tools"]]
    assert all(f"Name: {n}" in obs["messages"][0]["content"] for n in names)
    assert all(t["parameters"]["type"] == "object" for t in obs["tools"])
    obs["messages"][0]["content"] = "mutated"
    again, _ = env.reset(options={"task_id": info["task_id"]})
    assert again["messages"][0]["content"] != "mutated"


def test_reference_action_scores_the_maxima_on_every_generated_task(env):
    for tid in env.task_ids:
        env.reset(options={"task_id": tid})
        _, reward, terminated, truncated, info = env.step(env.reference_action(tid)[0])
        assert terminated and not truncated
        want = MAXIMA if info["expects_calls"] else (0.0, 0.0, 0.0, 1.0)
        assert tuple(reward.tolist()) == want, tid
        assert reward.dtype == np.float32 and "error" not in info


def test_generator_variety_and_determinism():
    tasks = [generate_task(0, i) for i in range(400)]
    kinds = collections.Counter(t["kind"] for t in tasks)
    assert set(kinds) == set(TASK_KINDS)
    assert all(kinds[k] >= 15 for k in TASK_KINDS)
    n_calls = collections.Counter(len(t["expected_calls"]) for t in tasks)
    assert n_calls[0] > 0 and n_calls[1] > 0 and n_calls[2] > 0
    used = {c["name"] for t in tasks for c in t["expected_calls"]}
    assert used == {f.name for f in TOOL_FAMILIES}
    types = {type(v).__name__ for t in tasks for c in t["expected_calls"] for v in c["parameters"].values()}
    assert {"str", "int", "float", "bool", "list"} <= types
    parallel = [t for t in tasks if t["kind"] == "parallel"]
    assert all(len({c["name"] for c in t["expected_calls"]}) == 1 for t in parallel)
    assert all(t["expected_calls"][0] != t["expected_calls"][1] for t in parallel)
    assert any(t["expects_response"] and t["expected_calls"] for t in tasks)
    # deterministic: task (0, 7) is this recorded one on every run and in every process (two
    # calls in one process would also agree for a generator seeded from the process's state),
    # and the same after 400 other tasks were made (no state carried from call to call)
    seven = generate_task(0, 7)
    assert (seven["kind"], seven["expected_calls"], seven["response"]) == (
        "follow_up", [], "Here is the result: reminder 'stretch' set for 10 minutes.")
    assert "<user> In 10 minutes, remind me to stretch. </user>" in seven["messages"][1]["content"]
    assert seven == tasks[7]
    assert generate_task(0, 7) != generate_task(1, 7)
    # every argument value is spelled out in the user's words
    for t in tasks[:100]:
        user = t["messages"][1]["content"]
        for c in t["expected_calls"]:
            for v in c["parameters"].values():
                if isinstance(v, (str, int, float)) and not isinstance(v, bool):
                    assert str(v) in user, (user, v)


def test_generated_ids_do_not_depend_on_num_tasks():
    small = ToolCallEnv(num_tasks=5, seed=1)
    big = ToolCallEnv(num_tasks=50, seed=1)
    assert small.tasks.get("generated/00003").data == big.tasks.get("generated/00003").data


def test_splits_partition_the_tasks():
    train = ToolCallEnv(num_tasks=200, split="train").task_ids
    held = ToolCallEnv(num_tasks=200, split="eval").task_ids
    assert not set(train) & set(held) and len(train) + len(held) == 200 and held


def test_a_list_of_data_sets_is_concatenated_and_split():
    both = ToolCallEnv(dataset=["generated"], num_tasks=30)
    assert len(both.task_ids) == 30
    src = TaskSource([Task("own/0", generate_task(5, 0) | {"dataset": "own"})], name="own")
    mixed = ToolCallEnv(dataset=["generated", src], num_tasks=10)
    assert len(mixed.task_ids) == 11 and mixed.tasks.name == "generated+own"
    e = ToolCallEnv(dataset=["generated", src], num_tasks=100, split="eval")
    assert 0 < len(e.task_ids) < 101


@pytest.mark.parametrize("junk", [None, 12, "", "   ", "\x00abc", "x" * 300_000])
def test_invalid_actions_get_the_lowest_reward(env, junk):
    env.reset(options={"task_id": env.task_ids[1]})
    _, reward, terminated, _, info = env.step(junk)
    assert tuple(reward.tolist()) == (-0.5, -1.0, -1.5, 0.0) and terminated and info["error"]


def _call_task(env) -> str:
    return next(t for t in env.task_ids if env.tasks.get(t)["expected_calls"])


def _reply_task(env) -> str:
    return next(t for t in env.task_ids if not env.tasks.get(t)["expected_calls"])


def test_free_text_on_a_call_task_is_unparseable(env):
    env.reset(options={"task_id": _call_task(env)})
    _, reward, _, _, info = env.step("sure, I'll do that")
    assert tuple(reward.tolist()) == (-0.5, -1.0, -1.5, 0.0) and info["error"]
    assert not info["exact"]


def test_free_text_on_a_reply_task(env):
    env.reset(options={"task_id": _reply_task(env)})
    _, reward, _, _, info = env.step("hello")
    assert tuple(reward.tolist()) == (0.0, 0.0, 0.0, 0.0) and info["error"]


def test_step_after_end_raises(env):
    env.reset(options={"task_id": env.task_ids[0]})
    env.step("x")
    with pytest.raises(RuntimeError):
        env.step("x")


def test_reference_action_unknown_id(env):
    with pytest.raises(KeyError):
        env.reference_action("generated/99999")
    ref = env.reference_action(_call_task(env))[0]
    assert parse_answer(ref).think


def test_metrics_hand_computed():
    def rec(tid, comps, expects_calls, dataset):
        names = ("function_name", "parameter", "values", "format")
        return {
            "task_id": tid,
            "reward_components": dict(zip(names, comps)),
            "info": {"expects_calls": expects_calls, "dataset": dataset},
        }

    results = [
        rec("a/0", (0.5, 1.0, 1.5, 1.0), True, "a"),  # exact
        rec("a/1", (0.0, 0.0, 0.0, 1.0), True, "a"),  # half marks
        rec("a/2", (0.0, 0.0, 0.0, 0.0), False, "a"),  # reply-only
        rec("b/0", (-0.5, -1.0, -1.5, 0.0), True, "b"),
    ]
    m = toolcall_metrics(results)
    assert m["all_exact_accuracy"] == pytest.approx(100 / 3)
    assert m["function_name"] == pytest.approx((100 + 50 + 0) / 3)
    assert m["values"] == pytest.approx((100 + 50 + 0) / 3)
    assert m["format"] == pytest.approx(50.0)
    assert m["num_examples"] == 4 and m["num_with_calls"] == 3
    assert m["a/all_exact_accuracy"] == pytest.approx(50.0)
    assert m["a/parameter"] == pytest.approx(75.0)
    assert m["a/format"] == pytest.approx(100 * 2 / 3)
    assert m["b/all_exact_accuracy"] == 0.0
    assert toolcall_metrics([]) == {}


def test_metrics_from_env_episodes(env):
    results = []
    for i, tid in enumerate(env.task_ids[:40]):
        env.reset(options={"task_id": tid})
        action = env.reference_action(tid)[0] if i % 2 == 0 else "nothing"
        _, _, _, _, info = env.step(action)
        results.append({"task_id": tid, "reward_components": info["reward_components"], "info": info})
    m = env.metrics(results)
    with_calls = [r for r in results if r["info"]["expects_calls"]]
    exact = [r for r in with_calls if r["info"]["exact"]]
    assert m["generated/all_exact_accuracy"] == pytest.approx(100 * len(exact) / len(with_calls))
    assert 0 < m["all_exact_accuracy"] < 100


def test_env_pickles_and_is_rebuilt_from_kwargs():
    env = corrgrpo_envs.make("corrgrpo/ToolCall-v0", num_tasks=8, seed=2)
    spec = pickle.loads(pickle.dumps(env.spec))
    rebuilt = corrgrpo_envs.make(spec.id, **spec.kwargs)
    assert rebuilt.unwrapped.task_ids == env.unwrapped.task_ids


@pytest.mark.parametrize("name", ["toolcall_rlla.yaml", "toolcall_tiny.yaml"])
def test_configs(name):
    data = yaml.safe_load((CONFIGS / name).read_text())
    assert data["env"]["id"] == "corrgrpo/ToolCall-v0"
    for section in ("model", "algorithm", "rollout", "train"):
        assert section in data
    if name == "toolcall_rlla.yaml":
        assert data["model"]["name_or_path"] == "Qwen/Qwen2.5-7B-Instruct"
        assert data["algorithm"]["group_size"] == 4 and data["algorithm"]["prompts_per_step"] == 128
        assert data["optim"]["lr"] == 1e-6 and data["algorithm"]["kl_beta"] == 0.0
        assert data["rollout"]["max_new_tokens"] == 2048
    else:
        env = corrgrpo_envs.make(str(CONFIGS / name))
        assert env.unwrapped.tasks.name == "generated" and len(env.unwrapped.task_ids) > 300


def test_render_answer_shapes():
    text = render_answer([{"name": "f", "parameters": {"a": 1}}], response="ok", think="t")
    assert text == '<think> t </think>\n<tool_call>\n{"name": "f", "parameters": {"a": 1}}\n</tool_call>\n<response> ok </response>'
