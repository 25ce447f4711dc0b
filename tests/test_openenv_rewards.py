"""The reward components an OpenEnv env expects, alone: where they come from (schema, config, a
first episode), and each step's check against them (no server: results are plain objects)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from corrgrpo_envs.integrations.openenv_remote import RemoteEnvError, RemoteRewardError
from corrgrpo_envs.integrations.openenv_rewards import _RewardContract

SERVER = "http://a:1"
WHERE = "OpenEnv server http://a:1, task t1"


def _never() -> dict:
    raise AssertionError("learned although the components were declared")


def _resolve(published=None, names=None, low=None, high=None, weights=None, learn=_never):
    return _RewardContract.resolve(SERVER, published, names, low, high, weights, learn)


def _step(reward=None, done=True, **metadata):
    return SimpleNamespace(observation={"text": "ok"}, metadata=metadata or None, done=done, reward=reward)


# ------------------------------------------------------------------ where they come from
def test_published_components_win_and_the_config_must_agree():
    published = [{"name": "a", "low": 0, "high": 1, "weight": 2}, {"name": "b", "low": -1, "high": 1}]
    contract, (names, low, high, weights) = _resolve(published, names=["a", "b"], low=[0, -1])
    assert (names, low, high, weights) == (["a", "b"], [0.0, -1.0], [1.0, 1.0], [2.0, 1.0])
    assert contract.origin == f"published by {SERVER}" and not contract.scalar_ok
    with pytest.raises(RemoteEnvError, match=r"^OpenEnv server http://a:1 publishes rewards \['a', 'b'\], "
                                             r"the config says \['b', 'a'\]$"):
        _resolve(published, names=["b", "a"])
    with pytest.raises(RemoteEnvError, match=r"reward_high \[1, 2\] differs from the server's \[1.0, 1.0\]"):
        _resolve(published, high=[1, 2])


def test_configured_components_default_to_unbounded():
    contract, (names, low, high, weights) = _resolve(names=["x"])
    assert (names, low, high, weights) == (["x"], [-math.inf], [math.inf], None)
    assert contract.origin == "env.reward_names" and contract.scalar_ok


def test_a_bad_weight_or_bound_is_one_error_naming_its_source():
    with pytest.raises(RemoteEnvError, match=r"^env.reward_weights: 1 weights for the 2 components \['a', 'b'\]$"):
        _resolve(names=["a", "b"], weights=[1])
    with pytest.raises(RemoteEnvError, match="^OpenEnv server http://a:1: the weight of 'a' = 1e\\+39 is beyond"):
        _resolve([{"name": "a", "weight": 1e39}])
    with pytest.raises(RemoteEnvError, match="^OpenEnv server http://a:1 /schema: reward_high of 'a' = 1e\\+300"):
        _resolve([{"name": "a", "high": 1e300}])


def test_unnamed_components_are_learned_with_the_bounds_the_reset_declared():
    learned = {"names": ["a"], "source": "metadata['reward_components']", "when": "first step",
               "server": SERVER, "declared": [("a", 0.0, 2.0, 3.0)]}
    contract, (names, low, high, weights) = _resolve(learn=lambda: learned)
    assert (names, low, high, weights) == (["a"], [0.0], [2.0], [3.0])
    assert contract.origin == f"learned from the first step of {SERVER}"
    assert contract.learned_source == "metadata['reward_components']"
    other = dict(learned, declared=[("z", 0.0, 2.0, 3.0)])  # a spec for other names says nothing
    _, (_, low, high, weights) = _resolve(learn=lambda: other)
    assert (low, high, weights) == ([-math.inf], [math.inf], None)


# ------------------------------------------------------------------ each step
def test_a_step_carrying_the_declared_components_reads_as_them():
    contract = _RewardContract("env.reward_names", scalar_ok=False)
    step = _step(reward_components={"a": 0.25, "b": 1})
    assert contract.vector(step, WHERE, ["a", "b"], [0, 0], [1, 1]) == {"a": 0.25, "b": 1.0}


def test_a_scalar_stands_for_the_one_component_only_when_no_server_published_it():
    scalar = _RewardContract("env.reward_names", scalar_ok=True)
    assert scalar.vector(_step(reward=0.5), WHERE, ["r"], [0], [1]) == {"r": 0.5}
    assert scalar.vector(_step(reward=None, done=False), WHERE, ["r"], [0], [1]) == {"r": 0.0}
    published = _RewardContract(f"published by {SERVER}", scalar_ok=False)
    with pytest.raises(RemoteRewardError, match=r"^OpenEnv server http://a:1, task t1: the step carries no "
                                                r"reward components \['r'\] \(published by http://a:1\); set "
                                                r"env.reward_names"):
        published.vector(_step(reward=0.5), WHERE, ["r"], [0], [1])


@pytest.mark.parametrize("components, reason", [
    ({"a": math.nan, "b": 0.5}, "^component 'a' is nan$"),
    ({"a": 1e300, "b": 0.5}, "^component 'a' = 1e\\+300 is beyond float32's range"),
    ({"a": 2.0, "b": 0.5}, r"^component 'a' = 2.0 is outside its bounds \[0, 1\]$"),
    ({"a": 0.5, "c": 0.5}, r"^metadata\['reward_components'\] is missing component\(s\) \['b'\] / has unknown "
                           r"\['c'\]; expected \['a', 'b'\] \(env.reward_names\)"),
])
def test_a_step_that_breaks_the_components_is_refused_naming_why(components, reason):
    contract = _RewardContract("env.reward_names", scalar_ok=False)
    with pytest.raises(RemoteRewardError, match=reason.replace("^", f"^{WHERE}: ", 1)) as caught:
        contract.vector(_step(reward_components=components), WHERE, ["a", "b"], [0, 0], [1, 1])
    # the message names the server and task; the reason alone is what a failover log lists
    assert str(caught.value) == f"{WHERE}: {caught.value.reason}"


def test_rewards_that_move_from_where_they_were_learned_are_refused():
    contract = _RewardContract("learned from the first step of x", scalar_ok=True,
                               learned_source="metadata['reward_components']")
    with pytest.raises(RemoteRewardError, match=r"the step's rewards are in metadata\['rubric_scores'\], but they "
                                                r"were in metadata\['reward_components'\]"):
        contract.vector(_step(rubric_scores={"a": 0.5}), WHERE, ["a"], [0], [1])
