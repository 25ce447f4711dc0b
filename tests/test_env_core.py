"""The core API: MultiRewardEnv validation, task sources and splits, spaces, the registry."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import corrgrpo_envs
from corrgrpo_envs.core import MultiRewardEnv, StepOutcome, validate_action
from corrgrpo_envs.registry import load_env_config
from corrgrpo_envs.spaces import Conversation, UnicodeText
from corrgrpo_envs.tasks import DatasetRegistry, Task, TaskSource, hash_fraction, hash_split


class EchoEnv(MultiRewardEnv):
    def __init__(self, n: int = 3, forget: bool = False):
        tasks = TaskSource([Task(f"e{i}", {"i": i}) for i in range(n)], name="echo")
        super().__init__(tasks, ("len", "ok"), (0.0, -1.0), (10.0, 1.0), reward_weights=(1, 2))
        self.forget = forget

    def _observe_task(self, task):
        return {"messages": [{"role": "user", "content": str(task["i"])}], "tools": []}

    def _act(self, action):
        rewards = {"len": float(min(10, len(action)))}
        if not self.forget:
            rewards["ok"] = 1.0
        return StepOutcome(rewards=rewards)


@pytest.mark.parametrize(
    "action, reason",
    [
        ("fine", None),
        ("line\nwith\ttabs", None),
        (3, "must be a str"),
        ("  ", "empty"),
        ("x" * 21, "too long"),
        ("a\x00b", "NUL"),
        ("\udcff", "surrogates"),
        ("\x01" * 20, "control characters"),
    ],
)
def test_validate_action(action, reason):
    got = validate_action(action, max_chars=20)
    assert (got is None) if reason is None else (reason in got)


def test_env_basics_and_invalid_outcome():
    env = EchoEnv()
    assert env.reward_weights.dtype == np.float32 and env.reward_weights.tolist() == [1.0, 2.0]
    obs, info = env.reset(seed=0, options={"task_id": "e2"})
    assert obs["messages"][0]["content"] == "2" and info == {"task_id": "e2"}
    _, r, term, trunc, info = env.step("abc")
    assert r.tolist() == [3.0, 1.0] and term and not trunc
    assert info == {"task_id": "e2", "reward_components": {"len": 3.0, "ok": 1.0}}
    env.reset(seed=0)
    _, r, term, _, info = env.step(None)
    assert r.tolist() == [0.0, -1.0] and term and "str" in info["error"]
    assert env.reward_table()[1] == {"name": "ok", "low": -1.0, "high": 1.0, "weight": 2.0}
    assert env.num_rewards == 2


def test_env_rejects_bad_construction_and_unscored_rewards():
    tasks = TaskSource([Task("x")])
    with pytest.raises(ValueError, match="unique"):
        MultiRewardEnv(tasks, ("a", "a"), (0, 0), (1, 1))
    with pytest.raises(ValueError, match="one bound"):
        MultiRewardEnv(tasks, ("a", "b"), (0,), (1, 1))
    with pytest.raises(ValueError, match="reward_weights"):
        MultiRewardEnv(tasks, ("a",), (0,), (1,), reward_weights=[np.inf])
    with pytest.raises(ValueError, match="no tasks"):
        MultiRewardEnv(TaskSource([], name="empty"), ("a",), (0,), (1,))
    env = EchoEnv(forget=True)
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match="did not score"):
        env.step("abc")


def test_seeded_task_choice_uses_env_generator():
    a, b = EchoEnv(n=50), EchoEnv(n=50)
    ids_a = [a.reset(seed=s)[1]["task_id"] for s in range(10)]
    ids_b = [b.reset(seed=s)[1]["task_id"] for s in range(10)]
    assert ids_a == ids_b and len(set(ids_a)) > 3
    np.random.seed(0)
    a.reset(seed=5)
    first = [a.reset()[1]["task_id"] for _ in range(5)]
    np.random.seed(1)
    a.reset(seed=5)
    assert [a.reset()[1]["task_id"] for _ in range(5)] == first  # global RNG plays no part


def test_task_source_lookup_and_splits():
    src = TaskSource([Task(f"t{i}") for i in range(200)], name="s")
    assert len(src) == 200 and src[3].id == "t3" and "t5" in src and src.get("t9").id == "t9"
    with pytest.raises(KeyError, match="unknown task id 'zz'"):
        src.get("zz")
    train, evl = src.split("train"), src.split("eval")
    assert len(train) + len(evl) == 200 and 20 <= len(evl) <= 60
    assert train.ids == [t for t in src.ids if t in set(train.ids)]  # canonical order kept
    assert src.split("all") is src
    with pytest.raises(ValueError, match="split"):
        src.split("test")
    with pytest.raises(ValueError, match="duplicate"):
        TaskSource([Task("a"), Task("a")])
    # split by family: tasks of one family never straddle
    fam = TaskSource([Task(f"f{i % 7}-{i}") for i in range(70)], split_key=lambda t: t.id.split("-")[0])
    for s in ("train", "eval"):
        families = {t.id.split("-")[0] for t in fam.split(s)}
        other = {t.id.split("-")[0] for t in fam.split("eval" if s == "train" else "train")}
        assert not families & other
    explicit = TaskSource([Task("a", {"s": "eval"}), Task("b", {"s": "train"})], split_of=lambda t: t["s"])
    assert explicit.split("eval").ids == ["a"]


def test_hash_split_is_stable():
    assert hash_fraction("prompt-0000") == pytest.approx(0.5903157754801214, abs=1e-15)
    assert hash_split("k", eval_fraction=0.0) == "train" and hash_split("k", eval_fraction=1.0) == "eval"
    assert [hash_split(f"prompt-{k:04d}") for k in range(64)].count("eval") == 12


def test_dataset_registry(tmp_path):
    reg = DatasetRegistry("demo")

    @reg.builtin("three", "three tasks")
    def _three(n: int = 3):
        return TaskSource([Task(f"b{i}") for i in range(n)], name="three")

    @reg.file_format("lines", detect=lambda p: p.suffix == ".lines")
    def _lines(path, **_):
        return TaskSource([Task(x) for x in path.read_text().split()], name=path.stem)

    assert reg.builtins == ["three"] and reg.formats == ["lines"]
    assert reg.load("three", n=5).ids == [f"b{i}" for i in range(5)]
    f = tmp_path / "x.lines"
    f.write_text("p q r")
    assert reg.load(f).ids == ["p", "q", "r"]
    g = tmp_path / "x.txt"
    g.write_text("u v")
    assert reg.load(g, format="lines").ids == ["u", "v"]
    with pytest.raises(ValueError, match="cannot detect"):
        reg.load(g)
    with pytest.raises(ValueError, match="unknown format"):
        reg.load(g, format="csv")
    with pytest.raises(ValueError, match="neither a built-in"):
        reg.load("nope")
    src = reg.load("three")
    assert reg.load(src, split="all") is src


def test_spaces_accept_any_unicode():
    text = UnicodeText(max_length=10)
    assert text.contains("ünï€😀") and not text.contains("x" * 11) and not text.contains(b"x")
    assert isinstance(text.sample(), str)
    conv = Conversation()
    assert conv.contains({"messages": [{"role": "user", "content": "日本 \x07"}], "tools": []})
    assert conv.contains({"messages": [{"role": "tool", "content": "", "name": "f"}]})
    assert not conv.contains({"messages": [{"role": "bot", "content": "x"}], "tools": []})
    assert not conv.contains({"messages": [{"role": "user", "content": 3}]})
    assert not conv.contains({"messages": [], "tools": "x"})
    assert conv.contains(conv.sample())


def test_registry_make_and_yaml(tmp_path):
    ids = corrgrpo_envs.registered_ids()
    for name in ("ScaleDominance", "Code", "ToolCall", "AgentDojo"):
        assert f"corrgrpo/{name}-v0" in ids
    from corrgrpo.trainer.config import CONFIG_DIR

    env = corrgrpo_envs.make(CONFIG_DIR / "scale_dominance.yaml", num_tasks=5)
    assert len(env.unwrapped.task_ids) == 5
    assert gym.make("corrgrpo/ScaleDominance-v0").unwrapped.reward_names[0] == "digits"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("env:\n  id: corrgrpo/ScaleDominance-v0\n  letter: e\n")
    assert load_env_config(cfg) == {"id": "corrgrpo/ScaleDominance-v0", "letter": "e"}
    assert corrgrpo_envs.make(str(cfg)).unwrapped.reward_names[1] == "has_e"
    bad = tmp_path / "bad.yaml"
    bad.write_text("env:\n  letter: e\n")
    with pytest.raises(ValueError, match="'id'"):
        corrgrpo_envs.make(str(bad))
    with pytest.raises(ValueError, match="unknown env id"):
        corrgrpo_envs.make("corrgrpo/Nope-v0")
    with pytest.raises(ValueError, match="namespace/Name-vN"):
        corrgrpo_envs.register("NoNamespace", EchoEnv)
    with pytest.raises(FileNotFoundError):
        corrgrpo_envs.make("missing-config.yaml")


def test_default_reference_and_metrics_contract():
    env = EchoEnv()
    with pytest.raises(NotImplementedError, match="EchoEnv has no reference answers"):
        env.reference_action("e0")
    records = [
        {"task_id": "e0", "reward_components": {"len": 4.0, "ok": 1.0}, "info": {}, "text": "abcd"},
        {"task_id": "e1", "reward_components": {"len": 2.0, "ok": -1.0}},
    ]
    # weights (1, 2): totals 6 and 0
    assert env.metrics(records) == {"len": 3.0, "ok": 0.0, "total": 3.0}
    assert env.metrics([]) == {}
    with pytest.raises(KeyError, match="'e2'.*'ok'"):
        env.metrics([{"task_id": "e2", "reward_components": {"len": 1.0}}])


def test_observations_are_fresh_copies():
    env = EchoEnv()
    obs, _ = env.reset(options={"task_id": "e1"})
    obs["messages"][0]["content"] = "changed"
    obs["tools"].append({"name": "x"})
    step_obs, *_ = env.step("abc")
    assert step_obs == {"messages": [{"role": "user", "content": "1"}], "tools": []}
    assert step_obs is not env._obs and step_obs["messages"] is not env._obs["messages"]


def test_make_entry_points(tmp_path, monkeypatch):
    (tmp_path / "user_echo_env.py").write_text(
        "from tests_echo_base import EchoEnv\n"
        "def build(n=2, **kwargs):\n    return EchoEnv(n=n, **kwargs)\n"
        "class Holder:\n    Env = EchoEnv\n"
        "NOT_CALLABLE = 3\n"
    )
    (tmp_path / "tests_echo_base.py").write_text(
        "from corrgrpo_envs.core import MultiRewardEnv, StepOutcome\n"
        "from corrgrpo_envs.tasks import Task, TaskSource\n"
        "class EchoEnv(MultiRewardEnv):\n"
        "    def __init__(self, n=3, **kwargs):\n"
        "        super().__init__(TaskSource([Task(f'e{i}') for i in range(n)]), ('a',), (0,), (1,), **kwargs)\n"
        "    def _observe_task(self, task):\n"
        "        return {'messages': [{'role': 'user', 'content': task.id}], 'tools': []}\n"
        "    def _act(self, action):\n"
        "        return StepOutcome(rewards={'a': 1.0})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = corrgrpo_envs.make("user_echo_env:build", n=5)
    assert env.unwrapped.task_ids == [f"e{i}" for i in range(5)] and env.spec.id == "user_echo_env:build"
    assert corrgrpo_envs.make("user_echo_env:Holder.Env").unwrapped.num_rewards == 1
    env.reset(seed=0)
    with pytest.raises(gym.error.ResetNeeded):  # the same wrappers as a registered id
        corrgrpo_envs.make("user_echo_env:build").step("x")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("env:\n  id: user_echo_env:build\n  n: 4\n")
    assert len(corrgrpo_envs.make(str(cfg)).unwrapped.task_ids) == 4
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        corrgrpo_envs.make("user_echo_env:Nope")
    with pytest.raises(TypeError, match="not a class or a factory"):
        corrgrpo_envs.make("user_echo_env:NOT_CALLABLE")
    with pytest.raises(ModuleNotFoundError):
        corrgrpo_envs.make("no_such_module_abc:Env")
    with pytest.raises(ValueError, match="entry point"):
        corrgrpo_envs.make("not an id")


def test_env_yaml_with_a_duplicated_key_is_rejected(tmp_path):
    from corrgrpo_envs.registry import load_env_config
    from corrgrpo_registry.yaml_files import DuplicateKeyError

    path = tmp_path / "twice.yaml"
    path.write_text("env:\n  id: corrgrpo/ScaleDominance-v0\n  num_tasks: 4\n  num_tasks: 5\n")
    with pytest.raises(DuplicateKeyError, match=r"twice.yaml:4: duplicate key 'num_tasks' \(first set on line 3\)"):
        load_env_config(path)
