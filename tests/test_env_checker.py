"""``corrgrpo_envs.check_env`` and ``corrgrpo envs check``: every registered env passes, and
each way of breaking the contract fails its own check with a line that says what is wrong."""

from __future__ import annotations

import numpy as np
import pytest

import corrgrpo_envs
from corrgrpo_envs import MultiRewardEnv, StepOutcome, Task, TaskSource
from corrgrpo_envs.checker import CHECKS, EnvCheckError, check_env
from corrgrpo_envs.commands import run_check

#: keyword arguments that keep an id cheap (the same ones the conformance suite uses)
ID_KWARGS = {
    "corrgrpo/ScaleDominance-v0": {"num_tasks": 16},
    "corrgrpo/Code-v0": {"efficiency": "off"},
    "corrgrpo/AgentDojo-v0": {"suites": ["banking"]},
}


class GoodEnv(MultiRewardEnv):
    """A correct single-turn env; the broken ones below each change one thing."""

    def __init__(self, split: str = "all", **kwargs):
        tasks = TaskSource([Task(f"t{i}", {"word": w}) for i, w in enumerate(["ab", "cd", "ef"])])
        super().__init__(tasks.split(split), ("echo", "short"), (0.0, 0.0), (1.0, 1.0), **kwargs)

    def _observe_task(self, task):
        return {"messages": [{"role": "user", "content": f"Say {task['word']}."}], "tools": []}

    def _act(self, action):
        return StepOutcome(
            rewards={"echo": float(self.task["word"] in action), "short": float(len(action) < 9)},
            terminated=True,
        )

    def reference_action(self, task_id):
        return [self.tasks.get(task_id)["word"]]


class OutOfBoundsEnv(GoodEnv):
    def _act(self, action):
        return StepOutcome(rewards={"echo": 3.0, "short": 0.0}, terminated=True)


class RandomRewardEnv(GoodEnv):
    """Rewards from the global RNG: two instances with one seed disagree."""

    def _act(self, action):
        return StepOutcome(rewards={"echo": float(np.random.rand()), "short": 0.0}, terminated=True)


class SharedObservationEnv(GoodEnv):
    """Returns its own state: a caller's edit leaks into the next observation."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return self._obs, {"task_id": self.task.id}

    def _act(self, action):
        out = super()._act(action)
        out.observation = self._obs
        return out


class NeverEndsEnv(GoodEnv):
    def _act(self, action):
        return StepOutcome(rewards={"echo": 0.0, "short": 0.0}, terminated=False)


class BadMaxTurnsEnv(GoodEnv):
    max_turns = 0


class NoRewardsEnv(GoodEnv):
    """Declares a reward weight that is not finite (the base class would refuse it; set after)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.reward_weights = np.array([1.0, np.nan], np.float32)


def _results(env_cls) -> dict[str, str]:
    """``{check name: detail}`` of the failed checks of ``env_cls``."""
    results = check_env(env_cls(), raise_on_error=False)
    assert [r.name for r in results] == [name for name, _ in CHECKS]
    return {r.name: r.detail for r in results if not r.passed}


@pytest.mark.parametrize("env_id", corrgrpo_envs.registered_ids())
def test_every_registered_env_passes(env_id):
    try:
        results = check_env(env_id, **ID_KWARGS.get(env_id, {}))
    except ImportError as exc:
        pytest.skip(f"{env_id} needs a module that does not import here: {exc}")
    assert all(r.passed for r in results) and len(results) == len(CHECKS)


def test_a_correct_user_env_passes_as_an_instance_and_as_an_entry_point():
    assert _results(GoodEnv) == {}
    assert all(r.passed for r in check_env(f"{__name__}:GoodEnv"))


@pytest.mark.parametrize(
    ("env_cls", "check", "says"),
    [
        (OutOfBoundsEnv, "reference episode and metrics", "echo=3 not in [0, 1]"),
        (OutOfBoundsEnv, "sampled actions stay in bounds", "echo=3 not in [0, 1]"),
        (RandomRewardEnv, "same seed and action, same rewards", "gives rewards"),
        (SharedObservationEnv, "fresh observations", "changed the env's state"),
        (NeverEndsEnv, "reference episode and metrics", "did not end the episode"),
        (BadMaxTurnsEnv, "max_turns", "positive int"),
        (NoRewardsEnv, "reward declaration", "finite"),
    ],
)
def test_each_broken_contract_fails_its_check_with_the_reason(env_cls, check, says):
    failed = _results(env_cls)
    assert check in failed, failed
    assert says in failed[check]


def test_raising_lists_every_failed_check_one_per_line():
    with pytest.raises(EnvCheckError) as info:
        check_env(f"{__name__}:OutOfBoundsEnv")
    lines = str(info.value).splitlines()
    assert lines[0].endswith("fails 2 of 9 checks:")
    assert all(line.startswith("FAIL ") for line in lines[1:]) and len(lines) == 3


def test_cli_prints_a_line_per_check_and_exits_by_outcome(capsys):
    import argparse

    ok = run_check(argparse.Namespace(targets=["corrgrpo/ScaleDominance-v0"], set=["num_tasks=8"]))
    out = capsys.readouterr().out
    assert ok == 0 and "9/9 checks passed" in out and out.count("  ok   ") == 9
    bad = run_check(argparse.Namespace(targets=[f"{__name__}:RandomRewardEnv"], set=[]))
    out = capsys.readouterr().out
    assert bad == 1 and "FAIL same seed and action, same rewards" in out
    missing = run_check(argparse.Namespace(targets=["corrgrpo/NoSuchEnv-v9"], set=[]))
    assert missing == 2 and capsys.readouterr().out.startswith("error: corrgrpo/NoSuchEnv-v9")
    # on/off stay strings (YAML 1.1 would read them as booleans)
    assert run_check(argparse.Namespace(targets=["corrgrpo/Code-v0"], set=["efficiency=off"])) == 0
