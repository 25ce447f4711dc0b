"""The tool-call reward rule sets: the paper's (hedging pays) and ``strict`` (committing pays)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import corrgrpo_envs
from corrgrpo_envs.toolcall.answer_format import render_answer
from corrgrpo_envs.toolcall.rewards import REWARD_NAMES, RULE_SETS, score_answer


def total(predicted: list[dict], expected: list[dict], rules: str) -> float:
    s = score_answer(render_answer(predicted), expected, False, rules)
    return sum(s.rewards[n] for n in REWARD_NAMES)


def candidates(k: int) -> list[dict]:
    """k calls of one tool that share one argument and differ in the other."""
    return [{"name": "book_table", "parameters": {"city": "Paris", "day": f"day-{i}"}} for i in range(k)]


def expected_rewards(k: int, rules: str) -> tuple[float, float]:
    """(emit all k candidates, commit to one), in expectation when each candidate is right with 1/k."""
    calls = candidates(k)
    hedge = sum(total(calls, [truth], rules) for truth in calls) / k
    commit = sum(total(calls[:1], [truth], rules) for truth in calls) / k
    return hedge, commit


@pytest.mark.parametrize("k, hedge, commit", [(2, 3.50, 3.25), (5, 3.20, 2.80)])
def test_paper_rules_pay_for_hedging(k, hedge, commit):
    # hedge = 3 + 1/k (only the best match is scored); commit = 2.5 + 1.5/k
    assert expected_rewards(k, "paper") == pytest.approx((hedge, commit), abs=1e-12)
    assert expected_rewards(k, "paper") == pytest.approx((3 + 1 / k, 2.5 + 1.5 / k), abs=1e-12)  # the formulas


@pytest.mark.parametrize("k", [2, 3, 4, 5, 8, 16])
def test_strict_rules_pay_for_committing(k):
    hedge, commit = expected_rewards(k, "strict")
    # commit is unchanged (a single call has no unmatched prediction); hedge = 1/k^2 + 5/k - 2
    assert commit == pytest.approx(2.5 + 1.5 / k, abs=1e-12)
    assert hedge == pytest.approx(1 / k**2 + 5 / k - 2, abs=1e-12)
    assert commit > hedge
    paper_hedge, paper_commit = expected_rewards(k, "paper")
    assert paper_hedge > paper_commit and commit == pytest.approx(paper_commit, abs=1e-12)


def test_strict_numbers_for_the_documented_cases():
    assert expected_rewards(2, "strict") == pytest.approx((0.75, 3.25), abs=1e-12)
    assert expected_rewards(5, "strict") == pytest.approx((-0.96, 2.80), abs=1e-12)


def test_strict_hand_values():
    f = {"name": "f", "parameters": {"a": 1}}
    g = {"name": "g", "parameters": {"b": 2}}
    h = {"name": "h", "parameters": {"c": 3}}
    s = score_answer(render_answer([f, h]), [f], False, "strict").rewards
    # names: Jaccard 1/2 x precision 1/2; matches: 1 of 2 predicted
    assert s == pytest.approx({"function_name": 0.25 - 0.5, "parameter": 0.0, "values": 0.0, "format": 1.0})
    s = score_answer(render_answer([f, g]), [f, g], False, "strict").rewards
    assert s == pytest.approx({"function_name": 0.5, "parameter": 1.0, "values": 1.5, "format": 1.0})
    # an empty call block earns nothing under strict (the paper gives +1.5 for V_max = 0)
    empty = "<think> x </think>\n<tool_call>\n\n</tool_call>"
    no_args = [{"name": "ping", "parameters": {}}]
    assert score_answer(empty, no_args, False, "paper").rewards["values"] == 1.5
    assert score_answer(empty, no_args, False, "strict").rewards["values"] == -1.5


def test_env_option():
    env = corrgrpo_envs.make("corrgrpo/ToolCall-v0", num_tasks=30, rules="strict").unwrapped
    assert env.rules == "strict"
    for tid in env.task_ids:
        env.reset(options={"task_id": tid})
        if env.task["expected_calls"]:
            break
    calls = env.task["expected_calls"]
    decoy = {"name": calls[0]["name"], "parameters": {k: "decoy" for k in calls[0]["parameters"]} or {"x": 1}}
    _, reward, *_ = env.step(render_answer([*calls, decoy]))
    paper = score_answer(render_answer([*calls, decoy]), calls, env.task["expects_response"], "paper")
    assert reward.sum() < sum(paper.rewards.values())
    with pytest.raises(ValueError, match="rules: 'lenient' is not allowed; allowed values: one of 'paper', 'strict'"):
        corrgrpo_envs.make("corrgrpo/ToolCall-v0", num_tasks=3, rules="lenient")
    assert RULE_SETS == ("paper", "strict")


# ------------------------------------------------------------------ properties
_NAMES = st.sampled_from(["f", "g", "h"])
_VALUE = st.one_of(st.integers(-3, 3), st.sampled_from(["x", "y"]), st.booleans())
_CALL = st.builds(
    lambda name, params: {"name": name, "parameters": params},
    _NAMES,
    st.dictionaries(st.sampled_from(["a", "b", "c"]), _VALUE, max_size=3),
)


@settings(max_examples=150, deadline=None)
@given(correct=st.lists(_CALL, min_size=1, max_size=3), extra=st.lists(_CALL, min_size=1, max_size=3), data=st.data())
def test_a_superset_of_the_correct_calls_never_scores_more(correct, extra, data):
    predicted = list(correct)
    for call in extra:  # extra calls inserted anywhere
        predicted.insert(data.draw(st.integers(0, len(predicted))), call)
    for rules in RULE_SETS:
        assert total(predicted, correct, rules) <= total(correct, correct, rules) + 1e-12
    assert total(predicted, correct, "strict") < total(correct, correct, "strict")


@settings(max_examples=150, deadline=None)
@given(truth=_CALL, others=st.lists(_CALL, min_size=1, max_size=4), data=st.data())
def test_strict_emitting_candidates_never_beats_the_mean_single_call(truth, others, data):
    # For one expected call, the k candidates together score at most the mean of the k
    # single-call answers, so under any belief over which one is right, committing to the
    # likeliest candidate earns at least as much as emitting all of them.
    calls = list(others)
    calls.insert(data.draw(st.integers(0, len(calls))), truth)
    together = total(calls, [truth], "strict")
    singles = [total([c], [truth], "strict") for c in calls]
    assert together < sum(singles) / len(singles)


@settings(max_examples=100, deadline=None)
@given(expected=st.lists(_CALL, min_size=1, max_size=3), data=st.data())
def test_strict_equals_paper_without_unmatched_predictions(expected, data):
    # any subset of the expected calls (every prediction matches): the two rule sets agree
    keep = data.draw(st.lists(st.booleans(), min_size=len(expected), max_size=len(expected)))
    predicted = [c for c, k in zip(expected, keep) if k] or expected[:1]
    paper = score_answer(render_answer(predicted), expected, False, "paper").rewards
    strict = score_answer(render_answer(predicted), expected, False, "strict").rewards
    assert strict == pytest.approx(paper, abs=1e-12)
