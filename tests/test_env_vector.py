"""GroupedVectorEnv: group layout, rewards, thread/process agreement, multi-turn members."""

from __future__ import annotations

import numpy as np
import pytest

from corrgrpo_envs.core import MultiRewardEnv, StepOutcome
from corrgrpo_envs.tasks import Task, TaskSource
from corrgrpo_envs.toy.env import score_text
from corrgrpo_envs.vector import GroupedVectorEnv

TOY = "corrgrpo/ScaleDominance-v0"


class TurnsEnv(MultiRewardEnv):
    """A multi-turn test env: each turn scores 1 on ``turns``; ``"stop"`` ends the episode
    (``stopped`` = 1); otherwise the env answers and the episode goes on, truncated at ``max_turns``."""

    def __init__(self, max_turns: int = 4):
        tasks = TaskSource([Task(f"t{i}", {"n": i}) for i in range(5)], name="turns")
        super().__init__(tasks, ("turns", "stopped"), (0.0, 0.0), (1.0, 1.0))
        self.max_turns = max_turns
        self.turn = 0

    def _observe_task(self, task: Task) -> dict:
        self.turn = 0
        return {"messages": [{"role": "user", "content": f"task {task['n']}"}], "tools": []}

    def _act(self, action: str) -> StepOutcome:
        self.turn += 1
        stop = action.strip() == "stop"
        messages = self._obs["messages"] + [
            {"role": "assistant", "content": action},
            {"role": "user", "content": f"turn {self.turn} done"},
        ]
        return StepOutcome(
            rewards={"turns": 1.0, "stopped": float(stop)},
            terminated=stop,
            truncated=not stop and self.turn >= self.max_turns,
            observation={"messages": messages, "tools": []},
        )

    def reference_action(self, task_id: str) -> list[str]:
        return ["go", "stop"]

    def metrics(self, results: list[dict]) -> dict[str, float]:
        return {}


def toy_actions(n: int) -> list[str]:
    """Distinct strings with known scores: ``i % 7`` digits, and an "a"/"ab" word in some."""
    out = []
    for i in range(n):
        word = ["zz", "a", "ab", "qq"][i % 4]
        out.append(f"{word} " + "5" * (i % 7))
    return out


def test_toy_64_groups_of_8_group_ids_and_rewards():
    with GroupedVectorEnv(TOY, num_groups=64, group_size=8, num_tasks=64) as venv:
        obs, infos = venv.reset(seed=0)
        assert venv.num_envs == 512 and len(obs) == 512
        np.testing.assert_array_equal(venv.group_ids, np.repeat(np.arange(64), 8))
        assert venv.group_ids.dtype == np.int64
        # 64 distinct tasks, all members of a group on the same task and prompt
        assert len(set(venv.current_task_ids)) == 64
        for i, info in enumerate(infos):
            g = i // 8
            assert info["group_id"] == g and info["task_id"] == venv.current_task_ids[g]
            k = int(info["task_id"].split("-")[1])
            assert obs[i]["messages"][0]["content"] == f"write a short string: {k}"
        actions = toy_actions(512)
        _, rewards, terminated, truncated, infos = venv.step(actions)
        assert rewards.shape == (512, 3) and rewards.dtype == np.float32
        expected = np.array([score_text(a) for a in actions], np.float32)
        np.testing.assert_array_equal(rewards, expected)
        assert rewards[5].tolist() == [5.0, 1.0, 0.0]  # "a 55555": lone "a" is no word
        assert rewards[6].tolist() == [6.0, 1.0, 1.0]  # "ab 555555"
        assert terminated.all() and not truncated.any() and not venv.active.any()
        np.testing.assert_array_equal(venv.returns, expected)
        assert venv.reward_names == ("digits", "has_a", "word_with_a")
        np.testing.assert_array_equal(venv.reward_weights, np.ones(3, np.float32))


def test_explicit_task_ids_and_seeded_draws():
    with GroupedVectorEnv(TOY, num_groups=3, group_size=2, num_tasks=10) as venv:
        obs, infos = venv.reset(task_ids=["prompt-0002", "prompt-0002", "prompt-0009"])
        assert [i["task_id"] for i in infos] == ["prompt-0002"] * 4 + ["prompt-0009"] * 2
        first = venv.reset(seed=7)[1]
        second = venv.reset(seed=7)[1]
        assert [i["task_id"] for i in first] == [i["task_id"] for i in second]
        with pytest.raises(ValueError, match="3 task ids"):
            venv.reset(task_ids=["prompt-0001"])
        with pytest.raises(ValueError, match="unknown task ids"):
            venv.reset(task_ids=["prompt-0001", "nope", "prompt-0002"])
        with pytest.raises(ValueError, match="6 actions"):
            venv.step(["a"])


@pytest.mark.parametrize("workers", [1, 2])
def test_thread_and_process_executors_agree(workers):
    actions = toy_actions(64)
    results = {}
    for executor in ("thread", "process"):
        with GroupedVectorEnv(TOY, 8, 8, workers=workers, executor=executor, num_tasks=32) as venv:
            obs, infos = venv.reset(seed=11)
            out = venv.step(actions)
            ref = venv.call("reference_action", "prompt-0003")
            results[executor] = (obs, infos, out, ref, venv.returns.copy())
    (o1, i1, s1, r1, ret1), (o2, i2, s2, r2, ret2) = results["thread"], results["process"]
    assert o1 == o2 and i1 == i2 and r1 == r2
    for a, b in zip(s1[1:4], s2[1:4]):
        np.testing.assert_array_equal(a, b)
    assert s1[0] == s2[0] and s1[4] == s2[4]
    np.testing.assert_array_equal(ret1, ret2)


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_multi_turn_members_finish_at_different_turns(executor):
    with GroupedVectorEnv(TurnsEnv, 2, 3, workers=2, executor=executor) as venv:
        venv.reset(task_ids=["t1", "t3"])
        # member i says "stop" at turn i + 1; members 4 and 5 never stop and hit max_turns=4
        stop_turn = [1, 2, 3, 4, 99, 99]
        turns = 0
        history = []
        while venv.active.any():
            turns += 1
            actions = [
                None if not venv.active[i] else ("stop" if stop_turn[i] == turns else "go")
                for i in range(6)
            ]
            obs, rewards, terminated, truncated, infos = venv.step(actions)
            history.append((terminated.copy(), truncated.copy()))
            for i in range(6):
                if actions[i] is None:  # finished members: zero reward, no flags, empty info
                    assert rewards[i].tolist() == [0.0, 0.0] and infos[i] == {}
                    assert not terminated[i] and not truncated[i]
        assert turns == 4
        np.testing.assert_array_equal(venv.episode_lengths, [1, 2, 3, 4, 4, 4])
        np.testing.assert_array_equal(venv.returns[:, 0], [1, 2, 3, 4, 4, 4])
        np.testing.assert_array_equal(venv.returns[:, 1], [1, 1, 1, 1, 0, 0])
        assert history[0][0].tolist() == [True, False, False, False, False, False]
        assert history[3][1].tolist() == [False, False, False, False, True, True]
        assert len(obs[5]["messages"]) == 1 + 2 * 4  # the conversation grew turn by turn
        with pytest.raises(RuntimeError, match="every member has finished"):
            venv.step([None] * 6)


def test_action_none_rules():
    with GroupedVectorEnv(TurnsEnv, 1, 2) as venv:
        venv.reset(task_ids=["t0"])
        with pytest.raises(ValueError, match="needs an action"):
            venv.step(["go", None])
        venv.step(["stop", "go"])
        with pytest.raises(ValueError, match="pass None"):
            venv.step(["go", "go"])


def test_constructor_errors_and_close():
    with pytest.raises(ValueError, match="executor"):
        GroupedVectorEnv(TOY, 1, 1, executor="fiber")
    with pytest.raises(ValueError, match=">= 1"):
        GroupedVectorEnv(TOY, 0, 4)
    with pytest.raises(ValueError, match="picklable"):
        GroupedVectorEnv(lambda: TurnsEnv(), 1, 1, executor="process")
    with pytest.raises(RuntimeError, match="failed"):
        GroupedVectorEnv(TOY, 1, 1, executor="process", letter="not a letter")
    venv = GroupedVectorEnv(TOY, 1, 2, workers=8)
    assert venv.workers == 2  # never more workers than members
    venv.close()
    venv.close()
    with pytest.raises(RuntimeError, match="closed"):
        venv.reset()


ENTRY_MODULE = '''
from corrgrpo_envs import MultiRewardEnv, StepOutcome, Task, TaskSource


class LengthEnv(MultiRewardEnv):
    def __init__(self, n: int = 3, **kwargs):
        tasks = TaskSource([Task(f"len-{i}", {"i": i}) for i in range(n)], name="length")
        super().__init__(tasks, ("length", "short"), (0.0, 0.0), (100.0, 1.0), **kwargs)

    def _observe_task(self, task):
        return {"messages": [{"role": "user", "content": f"write {task['i']} words"}], "tools": []}

    def _act(self, action):
        return StepOutcome(rewards={"length": float(min(100, len(action))), "short": float(len(action) < 5)})


def build(**kwargs):
    return LengthEnv(**kwargs)
'''


@pytest.fixture
def entry_module(tmp_path, monkeypatch):
    """A module of the user's, importable only through the temporary folder put on sys.path."""
    import sys

    (tmp_path / "user_length_env.py").write_text(ENTRY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "user_length_env", raising=False)
    return "user_length_env"


@pytest.mark.parametrize("executor", ["thread", "process"])
@pytest.mark.parametrize("attribute", ["LengthEnv", "build"])
def test_entry_point_envs_in_workers(entry_module, executor, attribute):
    """``package.module:attribute`` (a class or a factory) builds in threads and in spawned processes."""
    spec = f"{entry_module}:{attribute}"
    with GroupedVectorEnv(spec, num_groups=2, group_size=2, workers=2, executor=executor, n=4) as venv:
        assert venv.reward_names == ("length", "short") and venv.task_ids == [f"len-{i}" for i in range(4)]
        obs, infos = venv.reset(task_ids=["len-1", "len-3"])
        assert obs[2]["messages"][0]["content"] == "write 3 words"
        _, rewards, terminated, _, _ = venv.step(["abc", "abcdefgh", "", "x" * 200])
        assert rewards.tolist() == [[3.0, 1.0], [8.0, 0.0], [0.0, 0.0], [100.0, 0.0]]
        assert terminated.all()
