"""The four tool-calling rewards, rule by rule, with hand-computed values."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corrgrpo_envs.toolcall.answer_format import has_expected_shape, parse_answer, render_answer
from corrgrpo_envs.toolcall.rewards import (
    REWARD_HIGH,
    REWARD_LOW,
    REWARD_NAMES,
    allowed_value_matches,
    function_name_reward,
    match_calls,
    multiset_jaccard,
    parameter_reward,
    score_answer,
    values_equal,
    values_reward,
)

MAXIMA = (0.5, 1.0, 1.5, 1.0)
MINIMA_NO_FORMAT = (-0.5, -1.0, -1.5, 0.0)


def call(name: str, **params) -> dict:
    return {"name": name, "parameters": params}


def scores(answer: str, expected: list[dict], expects_response: bool = False) -> tuple:
    s = score_answer(answer, expected, expects_response)
    return tuple(s.rewards[n] for n in REWARD_NAMES)


def approx(values) -> object:
    return pytest.approx(tuple(values), abs=1e-12)


# ------------------------------------------------------------------ helpers
def test_multiset_jaccard_hand_values():
    assert multiset_jaccard([], []) == 1.0
    assert multiset_jaccard(["a"], []) == 0.0
    assert multiset_jaccard([], ["a"]) == 0.0
    assert multiset_jaccard(["a", "b"], ["b", "a"]) == 1.0
    assert multiset_jaccard(["a", "a", "b"], ["a", "b"]) == pytest.approx(2 / 3)
    assert multiset_jaccard(["a", "a"], ["a"]) == pytest.approx(1 / 2)
    assert multiset_jaccard(["a", "b"], ["c"]) == 0.0
    assert multiset_jaccard(["a", "b", "c"], ["a", "d"]) == pytest.approx(1 / 4)


def test_values_equal_is_exact_json_equality():
    assert values_equal(1, 1.0)
    assert not values_equal("1", 1)
    assert not values_equal(True, 1)
    assert not values_equal(0, False)
    assert values_equal(True, True)
    assert values_equal([1, "a", {"x": [2.0]}], [1.0, "a", {"x": [2]}])
    assert not values_equal([1, 2], [2, 1])
    assert not values_equal({"a": 1}, {"a": 1, "b": 2})
    assert values_equal(None, None)
    assert not values_equal(None, "")


# ---------------------------------------------------------------- the rules
def test_exact_match_gives_the_maxima():
    expected = [call("f", a=1, b="x"), call("g")]
    answer = render_answer(expected)
    assert scores(answer, expected) == MAXIMA
    assert score_answer(answer, expected, False).exact


@pytest.mark.parametrize(
    "answer",
    [
        "<think> hm </think>\nI would call f(a=1).",  # missing tags
        '<think> x </think>\n<tool_call>\nf(a=1)\n</tool_call>',  # a line that is not JSON
        '<think> x </think>\n<tool_call>\n{"name": "f", "parameters": {"a": 1}}\n',  # no closing tag
        '<think> x </think>\n<tool_call>\n{"name": "f", "parameters": {"a": 1}}\n[1, 2]\n</tool_call>',
        '<think> x </think>\n<tool_call>\n{"parameters": {"a": 1}}\n</tool_call>',  # no name
        '<think> x </think>\n<tool_call>\n{"name": "f", "parameters": [1]}\n</tool_call>',
        '<think> x </think>\n<tool_call>\n{"name": "f",\n "parameters": {"a": 1}}\n</tool_call>',  # split over lines
    ],
)
def test_unparseable_calls_give_the_minima(answer):
    s = score_answer(answer, [call("f", a=1)], False)
    assert tuple(s.rewards[n] for n in REWARD_NAMES[:3]) == (-0.5, -1.0, -1.5)
    assert s.error
    assert not s.exact


def test_no_expected_call_gives_zero_correctness():
    reply = "<think> chat </think>\n<response> Hello! </response>"
    assert scores(reply, [], expects_response=True) == (0.0, 0.0, 0.0, 1.0)
    with_call = render_answer([call("f", a=1)], response="Hello!")
    assert scores(with_call, [], expects_response=True) == (0.0, 0.0, 0.0, 0.0)
    broken = "<think> x </think>\n<tool_call>\nnot json\n</tool_call>"
    assert scores(broken, [], expects_response=True) == (0.0, 0.0, 0.0, 0.0)
    assert not score_answer(reply, [], True).exact


def test_vacuous_value_maximum():
    expected = [call("get_today")]
    # A call without parameters, answered with an empty block: names and keys miss, V_max = 0.
    empty_block = "<think> x </think>\n<tool_call>\n\n</tool_call>"
    assert scores(empty_block, expected) == (-0.5, -1.0, 1.5, 1.0)
    # The right call with no parameters: P and V both full.
    assert scores(render_answer(expected), expected) == MAXIMA
    # An extra empty-parameter call: names 1/2, keys of the match full, V_max = 0.
    assert scores(render_answer([call("get_today"), call("other")]), expected) == approx((0.0, 1.0, 1.5, 1.0))


def test_wrong_value():
    expected = [call("f", a=1, b=2)]
    # names equal (n=1), keys equal (p=1), one of two values (v=1, V=2): 3*1/2 - 1.5 = 0
    assert scores(render_answer([call("f", a=1, b=3)]), expected) == approx((0.5, 1.0, 0.0, 1.0))


def test_missing_parameter():
    expected = [call("f", a=1, b=2)]
    # key-Jaccard 1/2 -> 2*0.5 - 1 = 0; v=1 of V=2 -> 0
    assert scores(render_answer([call("f", a=1)]), expected) == approx((0.5, 0.0, 0.0, 1.0))


def test_extra_parameter():
    expected = [call("f", a=1)]
    # key-Jaccard 1/2 -> 0; v = 1 of 1 -> 1.5
    assert scores(render_answer([call("f", a=1, z=9)]), expected) == approx((0.5, 0.0, 1.5, 1.0))


def test_wrong_name():
    expected = [call("f", a=1, b=2)]
    assert scores(render_answer([call("g", a=1, b=2)]), expected) == approx((-0.5, -1.0, -1.5, 1.0))


def test_extra_call():
    expected = [call("f", a=1, b=2)]
    # names {f} vs {f, g}: 1/2 -> 0; the match is perfect
    assert scores(render_answer([call("f", a=1, b=2), call("g", x=1)]), expected) == approx((0.0, 1.0, 1.5, 1.0))


def test_several_calls_in_any_order():
    expected = [call("f", a=1), call("g", b=2)]
    swapped = render_answer([call("g", b=2), call("f", a=5)])
    # names equal as multisets; both keys match (p=2, P=2); one value of two -> 0
    assert scores(swapped, expected) == approx((0.5, 1.0, 0.0, 1.0))
    assert scores(render_answer([call("g", b=2), call("f", a=1)]), expected) == approx(MAXIMA)


def test_missing_one_of_several_calls():
    expected = [call("f", a=1), call("g", b=2, c=3)]
    # names 1/2 -> 0; p = 1 of P=2 -> 0; v = 1 of V=3 -> 3/3 - 1.5 = -0.5
    assert scores(render_answer([call("f", a=1)]), expected) == approx((0.0, 0.0, -0.5, 1.0))


def test_same_tool_called_twice_greedy_best_unused():
    expected = [call("f", a=1), call("f", a=2)]
    # parallel calls in the other order: each expected call takes its exact twin
    assert scores(render_answer([call("f", a=2), call("f", a=1)]), expected) == approx(MAXIMA)
    # only one call: expected #1 (a=1) takes it (key score 1, no value), expected #2 gets nothing
    # names {f,f} vs {f}: 1/2 -> 0; p = 1 of 2 -> 0; v = 0 of 2 -> -1.5
    assert scores(render_answer([call("f", a=2)]), expected) == approx((0.0, 0.0, -1.5, 1.0))
    matches, v_max = match_calls(expected, [call("f", a=2)])
    assert [(m.expected_index, m.predicted_index) for m in matches] == [(0, 0)] and v_max == 2
    # three predictions for two expected: the duplicate is an extra call
    triple = render_answer([call("f", a=1), call("f", a=1), call("f", a=2)])
    assert scores(triple, expected) == approx((2 / 3 - 0.5, 1.0, 1.5, 1.0))


def test_ties_go_to_the_earliest_prediction():
    expected = [call("f", a=1, b=2)]
    matches, _ = match_calls(expected, [call("f", a=1, b=9), call("f", a=9, b=2)])
    assert matches[0].predicted_index == 0


def test_a_match_needs_a_positive_score():
    expected = [call("f", a=1)]
    # same name, no shared key and no equal value: no match
    assert match_calls(expected, [call("f", b=1)]) == ([], 1)
    assert scores(render_answer([call("f", b=1)]), expected) == approx((0.5, -1.0, -1.5, 1.0))


def test_value_types_must_match_exactly():
    expected = [call("f", page="1", flag=True, x=2)]
    answer = render_answer([call("f", page=1, flag=1, x=2.0)])
    # keys all right; only x (2 == 2.0) counts: 3*1/3 - 1.5 = -0.5
    assert scores(answer, expected) == approx((0.5, 1.0, -0.5, 1.0))


def test_component_functions_alone():
    expected = [call("f", a=1)]
    assert function_name_reward(expected, None) == -0.5
    assert parameter_reward(expected, None) == -1.0
    assert values_reward(expected, None) == -1.5
    assert function_name_reward([], [call("f")]) == 0.0
    assert values_reward([call("f")], []) == 1.5


# ------------------------------------------------------------- BFCL values
def bfcl(name: str, allowed: dict) -> dict:
    from corrgrpo_envs.toolcall.datasets import bfcl_expected_call

    return bfcl_expected_call(name, allowed)


def test_bfcl_any_allowed_value_matches_and_optional_parameters():
    expected = [bfcl("area", {"base": [10, 10.0], "unit": ["units", ""]})]
    assert expected[0]["parameters"] == {"base": 10}
    assert scores(render_answer([call("area", base=10.0)]), expected) == MAXIMA
    assert scores(render_answer([call("area", base=10, unit="units")]), expected) == MAXIMA
    # the optional unit, given with a wrong value, counts as expected: v = 1 of 2 -> 0
    assert scores(render_answer([call("area", base=10, unit="cm")]), expected) == approx((0.5, 1.0, 0.0, 1.0))
    # leaving out the required base but giving unit: keys {base, unit} vs {unit} -> 1/2 -> 0;
    # v = 1 (unit) of 2 -> 0
    assert scores(render_answer([call("area", unit="units")]), expected) == approx((0.5, 0.0, 0.0, 1.0))
    # giving nothing of it: no match
    assert scores(render_answer([call("area")]), expected) == approx((0.5, -1.0, -1.5, 1.0))


def test_bfcl_nested_dict_specs():
    spec = {"mode": ["COOL"], "eco": ["", False]}
    assert allowed_value_matches(spec, {"mode": "COOL"})
    assert allowed_value_matches(spec, {"mode": "COOL", "eco": False})
    assert not allowed_value_matches(spec, {"mode": "COOL", "eco": True})
    assert not allowed_value_matches(spec, {"eco": False})
    assert not allowed_value_matches(spec, {"mode": "COOL", "other": 1})
    expected = [bfcl("ac", {"body": [spec]})]
    assert expected[0]["parameters"] == {"body": {"mode": "COOL"}}
    assert scores(render_answer(expected), expected) == MAXIMA


def test_bfcl_empty_accepted_list_means_empty_list_or_omitted():
    expected = [bfcl("f", {"a": [1], "tags": []})]
    assert scores(render_answer([call("f", a=1)]), expected) == MAXIMA
    assert scores(render_answer([call("f", a=1, tags=[])]), expected) == MAXIMA


# ------------------------------------------------------------------- format
GOOD_CALL = '<think> t </think>\n<tool_call>\n{"name": "f", "parameters": {}}\n</tool_call>'


@pytest.mark.parametrize(
    ("answer", "calls", "reply", "ok"),
    [
        (GOOD_CALL, True, False, True),
        (GOOD_CALL + "\n", True, False, True),
        (GOOD_CALL + "\n<response> done </response>", True, True, True),
        (GOOD_CALL + "\n<response> done </response>", True, False, False),
        (GOOD_CALL, True, True, False),  # reply expected but missing
        ("<think> t </think>\n<response> hi </response>", False, True, True),
        ("<think> t </think>\n<response> hi </response>", True, False, False),
        ('<think> t </think>\n<tool_call>{"name": "f", "parameters": {}}\n</tool_call>', True, False, False),
        ('<think> t </think>\n<tool_call>\n{"name": "f", "parameters": {}}</tool_call>', True, False, False),
        (GOOD_CALL + "\n" + GOOD_CALL.split("\n", 1)[1], True, False, False),  # two blocks
        (GOOD_CALL + " trailing words", True, False, False),
        ("hello " + GOOD_CALL, True, False, False),  # think not first
        (GOOD_CALL.replace("<think> t </think>", ""), True, False, False),  # no think
        ("<think> I will write <tool_call> tags </think>" + GOOD_CALL[len("<think> t </think>"):], True, False, True),
        ("<think> t </think>\n<response> a </response>\n<response> b </response>", False, True, False),
        ("<think> t </think>", False, False, True),
    ],
)
def test_format_rule(answer, calls, reply, ok):
    assert has_expected_shape(answer, calls, reply) is ok


def test_tags_inside_the_reasoning_are_not_calls():
    answer = '<think> I will put it in <tool_call> ... </tool_call> </think>\n<tool_call>\n{"name": "f", "parameters": {"a": 1}}\n</tool_call>'
    parsed = parse_answer(answer)
    assert parsed.num_tool_blocks == 1 and parsed.tool_calls == [call("f", a=1)]
    assert scores(answer, [call("f", a=1)]) == MAXIMA


def test_arguments_spelling_is_read_like_parameters():
    answer = '<think> t </think>\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    assert scores(answer, [call("f", a=1)]) == MAXIMA


def test_render_then_parse_round_trip():
    calls = [call("f", a=[1, 2], b={"c": None}), call("g", s="é ü")]
    text = render_answer(calls, response="ok")
    parsed = parse_answer(text)
    assert parsed.tool_calls == calls and parsed.response == "ok" and not parsed.errors
    assert json.loads(text.split("\n")[2]) == calls[0]


# ----------------------------------------------------------- never raises
_TAGGY = st.lists(
    st.sampled_from(list('<>/{}[]":, \n\tabfnptx01') + ["<think>", "</think>", "<tool_call>", "</tool_call>", "<response>", "</response>", '"name"', '"parameters"']),
    max_size=80,
).map("".join)
_EXPECTED = st.lists(
    st.builds(
        call,
        st.sampled_from(["f", "g"]),
        a=st.one_of(st.integers(0, 2), st.text("ab", max_size=2)),
    ),
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(answer=_TAGGY, expected=_EXPECTED, reply=st.booleans())
def test_any_text_scores_within_bounds(answer, expected, reply):
    s = score_answer(answer, expected, reply)
    for i, name in enumerate(REWARD_NAMES):
        assert REWARD_LOW[i] <= s.rewards[name] <= REWARD_HIGH[i]
    if not expected:
        assert (s.rewards["function_name"], s.rewards["parameter"], s.rewards["values"]) == (0, 0, 0)


@settings(max_examples=200, deadline=None)
@given(expected=_EXPECTED, data=st.data())
def test_any_permutation_of_the_exact_calls_scores_the_maxima(expected, data):
    if not expected:
        return
    order = data.draw(st.permutations(range(len(expected))))
    answer = render_answer([expected[i] for i in order])
    assert scores(answer, expected) == approx(MAXIMA)


@pytest.mark.parametrize("junk", [None, 3, b"bytes", "", "\x00\x01", "<tool_call>" * 50, "{" * 5000])
def test_junk_never_raises(junk):
    s = score_answer(junk, [call("f", a=1)], False)  # type: ignore[arg-type]
    assert tuple(s.rewards[n] for n in REWARD_NAMES) == MINIMA_NO_FORMAT
