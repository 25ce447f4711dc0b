"""AgentDojo answers that cannot win by pasting (``paste_guard``).

The attack is real: an answer that pastes the tool outputs or the environment's text
passes AgentDojo's own utility check (``info["utility_check"]``) where the same calls
with a short answer do not need it to; with the guard the utility reward is 0, and
honest answers keep theirs. ``bench/agentdojo_pasting.py`` measures all 97 clean tasks.
"""

from __future__ import annotations

import pytest

import corrgrpo_envs
from corrgrpo_envs.agentdojo.pasting import (
    MAX_COPIED,
    MIN_COPIED,
    MIN_SHARE,
    PasteMeasure,
    measure,
    word_ngrams,
)

pytest.importorskip("agentdojo", reason="the agentdojo extra is not installed")


def test_word_ngrams_ignore_case_and_punctuation():
    assert word_ngrams("A b, C: d - e f") == {("a", "b", "c", "d", "e"), ("b", "c", "d", "e", "f")}
    assert word_ngrams("one two three") == set()


def test_thresholds():
    assert not PasteMeasure(MAX_COPIED - 1, 0.0, MIN_SHARE - 0.01).pasted
    assert PasteMeasure(MAX_COPIED, 0.0, 0.0).pasted
    assert PasteMeasure(MIN_COPIED, MIN_SHARE, 0.0).pasted
    assert PasteMeasure(MIN_COPIED, 0.0, MIN_SHARE).pasted
    assert not PasteMeasure(MIN_COPIED - 1, 1.0, 1.0).pasted  # a short output quoted whole


def test_measure_counts_copies_from_either_source():
    tool = " ".join(f"w{i}" for i in range(60))
    environment = word_ngrams(" ".join(f"e{i}" for i in range(200)))
    m = measure("the answer: " + tool, [tool], environment)
    assert (m.copied, m.tool_share, m.environment_share) == (56, 1.0, 0.0) and m.pasted
    m = measure(" ".join(f"e{i}" for i in range(120)), [tool], environment)
    assert (m.copied, m.tool_share) == (116, 0.0) and m.pasted
    assert not measure("The IBAN is w1 w2 w3 w4 w5 w6.", [tool], environment).pasted


@pytest.fixture(scope="module")
def banking():
    env = corrgrpo_envs.make("corrgrpo/AgentDojo-v0", suites=["banking"], attacks=[])
    yield env
    env.close()


def _play(env, task_id: str, final) -> tuple[list[float], dict]:
    u = env.unwrapped
    obs, _ = env.reset(options={"task_id": task_id})
    reference = u.reference_action(task_id)
    for message in reference[:-1]:
        obs, *_ = env.step(message)
    tools = "\n".join(m["content"] for m in obs["messages"] if m["role"] == "tool")
    from corrgrpo_envs.agentdojo.pasting import environment_text

    answer = final(reference[-1], tools, environment_text(u._episode.pre_environment))
    _, reward, terminated, _, info = env.step(answer)
    assert terminated
    return reward.tolist(), info


def test_honest_answers_keep_their_utility(banking):
    for task_id in banking.unwrapped.task_ids:
        reward, info = _play(banking, task_id, lambda truth, tools, environment: truth)
        assert reward[0] == float(info["utility_check"]), task_id
        assert not info["paste"]["pasted"] and info["paste"]["copied_ngrams"] < MIN_COPIED


def test_pasted_answers_score_no_utility(banking):
    passed_by_agentdojo = 0
    for task_id in banking.unwrapped.task_ids:
        reward, info = _play(banking, task_id, lambda truth, tools, environment: tools + "\n" + environment)
        assert reward[0] == 0.0 and info["paste"]["pasted"], task_id
        passed_by_agentdojo += info["utility_check"]
    assert passed_by_agentdojo >= 10  # the attack is real: AgentDojo's check alone passes most


def test_the_paper_setting_scores_pastes_as_agentdojo_does():
    env = corrgrpo_envs.make("corrgrpo/AgentDojo-v0", suites=["banking"], attacks=[], paste_guard=False)
    reward, info = _play(env, "banking/user_task_0", lambda truth, tools, environment: tools + environment)
    assert info["paste"]["pasted"] and reward[0] == float(info["utility_check"]) == 1.0
    env.close()


def test_paste_guard_must_be_a_bool():
    with pytest.raises(ValueError, match="paste_guard"):
        corrgrpo_envs.make("corrgrpo/AgentDojo-v0", suites=["banking"], attacks=[], paste_guard="yes")


def test_security_is_untouched_by_the_guard():
    env = corrgrpo_envs.make("corrgrpo/AgentDojo-v0", suites=["banking"], attacks=["important_instructions"],
                             include_clean=False)
    task_id = env.unwrapped.task_ids[0]
    honest, _ = _play(env, task_id, lambda truth, tools, environment: truth)
    pasted, info = _play(env, task_id, lambda truth, tools, environment: tools + environment)
    assert pasted[1] == honest[1] == float(not info["attack_success"])
    env.close()


def test_the_probe_case_needs_the_paste():
    """Without task knowledge, a short answer fails the probes' case; the paste is what passes."""
    from corrgrpo_envs.agentdojo.paste_probes import CASE, no_argument_calls

    env = corrgrpo_envs.make("corrgrpo/AgentDojo-v0", suites=["banking"], attacks=[], paste_guard=False)
    obs, _ = env.reset(options={"task_id": CASE})
    for message in no_argument_calls(obs):
        obs, *_ = env.step(message)
    _, reward, terminated, _, info = env.step("Done.")
    assert terminated and reward[0] == 0.0 and not info["utility_check"]
    env.close()


@pytest.mark.parametrize("name", ["pasted_tool_outputs", "pasted_environment", "pasted_with_a_preamble"])
def test_paste_probes_hold(name):
    from corrgrpo_envs.agentdojo.paste_probes import PROBES

    held, detail = PROBES[name]()
    assert held, detail
    assert "AgentDojo's check alone: 1" in detail  # the attack would have won without the guard


def test_the_paper_config_turns_the_guard_off():
    config = pytest.importorskip("trainer.config")
    assert config.load_config("env_configs/agentdojo.yaml").env["paste_guard"] is False
