"""The four tool-calling rewards, as small pure functions.

In reward-vector order (ranges in brackets):

1. ``function_name`` [-0.5, 0.5]: ``n - 0.5`` with ``n`` the multiset Jaccard of
   predicted versus expected tool names.
2. ``parameter`` [-1, 1]: ``2 p / P_max - 1``. Each expected call, in order,
   takes the best unused predicted call of the same name (best = key-Jaccard of
   the parameter names + number of exactly equal values, and must be > 0);
   ``p`` sums the key-Jaccard scores of those matches, ``P_max`` is the number of
   expected calls.
3. ``values`` [-1.5, 1.5]: ``3 v / V_max - 1.5``, ``v`` the exactly equal values
   over those matches, ``V_max`` the number of expected parameters.
4. ``format`` {0, 1}: the answer has exactly the expected shape.

Rules: an exact match of the call list gives the maxima (in order, or, for a task whose
calls may come in any order, as BFCL checks its parallel categories: each expected call in
turn takes the first unused predicted call that matches it exactly); unreadable calls
(``predicted=None``: no tool-call block, or a line that is not a call) give the
minima; with no expected call the three correctness rewards are 0; a vacuous
maximum (``V_max = 0``) gives the maximum.

An expected call is ``{"name", "parameters"}``; BFCL-style calls may add
``"allowed"`` (each parameter's list of accepted values; a dict spec, or a list of them,
stands for the dicts it accepts) and ``"optional"`` (parameters that may be left out; they
count as expected when given). Values are equal when they are the same JSON value; ``1``
equals ``1.0`` but ``true`` is not ``1`` and ``"1"`` is not ``1``.

These are training rewards. A task may be judged by a benchmark's own rule instead (BFCL's,
:mod:`corrgrpo_envs.toolcall.bfcl_verdict`): :func:`score_answer`'s ``benchmark`` then decides
``exact``, which can differ from "the three correctness rewards at their maxima" (BFCL ignores
case and some punctuation in strings, rejects an integer written as a float, ...; see
docs/toolcall.md).

Rule sets (``rules=``):

* ``"paper"`` (default): the rules above, as RLLA / ToolRL define them. Only the
  best-matching predicted calls are scored, so a policy unsure between k
  candidate calls earns more by emitting all of them than by committing to one.
* ``"strict"``: every correctness reward's normalised score (``n``,
  ``p / P_max``, ``v / V_max``, each in [0, 1]) is multiplied by the share of
  predicted calls that count: for ``function_name`` the predicted names that
  are expected names (multiset intersection / number of predicted calls), for
  ``parameter`` and ``values`` the predicted calls the matching pairs with an
  expected call. No predicted call at all scores the minima. An answer without
  unmatched predicted calls scores as under ``"paper"``. For one expected call,
  emitting k candidates then scores at most the mean of the k single-call
  answers (strictly less when one of them has the expected name), so committing
  to the most likely call wins in expectation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corrgrpo_envs.toolcall.answer_format import has_expected_shape, parse_answer

__all__ = [
    "RULE_SETS",
    "REWARD_NAMES",
    "REWARD_LOW",
    "REWARD_HIGH",
    "CallMatch",
    "AnswerScore",
    "multiset_jaccard",
    "values_equal",
    "allowed_value_matches",
    "is_dict_spec",
    "is_spec_list",
    "match_calls",
    "calls_exactly_match",
    "function_name_reward",
    "parameter_reward",
    "values_reward",
    "format_reward",
    "score_answer",
]

REWARD_NAMES = ("function_name", "parameter", "values", "format")
REWARD_LOW = (-0.5, -1.0, -1.5, 0.0)
REWARD_HIGH = (0.5, 1.0, 1.5, 1.0)
#: The reward rule sets: the paper's, and one where unmatched predicted calls cost reward.
RULE_SETS = ("paper", "strict")

Call = Mapping[str, Any]


def multiset_jaccard(a: Sequence[Hashable], b: Sequence[Hashable]) -> float:
    """|a ∩ b| / |a ∪ b| as multisets; 1 when both are empty, 0 when only one is."""
    if not a and not b:
        return 1.0
    if not a or not b:
        return 0.0
    common = sum((Counter(a) & Counter(b)).values())
    return common / (len(a) + len(b) - common)


def values_equal(a: Any, b: Any) -> bool:
    """Exact equality of two JSON values (numbers compare by value, booleans only with booleans)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def is_dict_spec(value: Any) -> bool:
    """Whether an accepted value is a BFCL dict spec: a non-empty dict of lists of accepted values
    (BFCL's spelling of a dict-valued argument)."""
    return isinstance(value, dict) and bool(value) and all(isinstance(v, list) for v in value.values())


def is_spec_list(value: Any) -> bool:
    """Whether an accepted value is a non-empty list of BFCL dict specs (a list-of-dicts argument)."""
    return isinstance(value, list) and bool(value) and all(is_dict_spec(v) for v in value)


def _spec_matches(spec: Mapping[str, list[Any]], value: Any) -> bool:
    # One level deep, as BFCL's checker reads specs: the values inside are compared as they are.
    if not isinstance(value, dict):
        return False
    for key, options in spec.items():
        options = options or [[], ""]  # an empty list of accepted values: [] or left out
        if key in value:
            if not any(values_equal(o, value[key]) for o in options):
                return False
        elif "" not in options:
            return False
    return all(key in spec for key in value)


def allowed_value_matches(allowed: Any, value: Any) -> bool:
    """Whether ``value`` equals the accepted value ``allowed``. A BFCL dict spec is matched key
    by key and a list of them item by item (:func:`is_dict_spec`, :func:`is_spec_list`); the spec
    itself, written as a value, does not match."""
    if is_dict_spec(allowed):
        return _spec_matches(allowed, value)
    if is_spec_list(allowed):
        return (isinstance(value, list) and len(value) == len(allowed)
                and all(_spec_matches(s, v) for s, v in zip(allowed, value)))
    return values_equal(allowed, value)


def _value_matches(expected: Call, key: str, value: Any) -> bool:
    allowed = expected.get("allowed")
    if allowed and key in allowed:
        return any(allowed_value_matches(a, value) for a in allowed[key])
    params = expected.get("parameters", {})
    return key in params and values_equal(params[key], value)


def _expected_keys(expected: Call, predicted_params: Mapping[str, Any]) -> list[str]:
    keys = list(expected.get("parameters", {}))
    keys += [k for k in expected.get("optional", ()) if k in predicted_params and k not in keys]
    return keys


@dataclass(frozen=True)
class CallMatch:
    """An expected call paired with a predicted one."""

    expected_index: int
    predicted_index: int
    key_score: float  # key-Jaccard of the parameter names
    equal_values: int  # expected parameters whose value the prediction gets exactly
    num_expected_keys: int


def _key_jaccard(keys: Sequence[str], predicted_keys: Sequence[str]) -> float:
    # Both lists are duplicate-free (dict keys), so set Jaccard equals multiset Jaccard.
    a, b = set(keys), set(predicted_keys)
    if not a and not b:
        return 1.0
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def match_calls(expected: Sequence[Call], predicted: Sequence[Call]) -> tuple[list[CallMatch], int]:
    """Greedy matching in expected order; returns the matches and ``V_max``.

    Ties go to the earliest predicted call. ``V_max`` counts, per expected call,
    its parameters (plus the optional ones its match gives).
    """
    by_name: dict[Any, list[int]] = {}
    for j, pred in enumerate(predicted):
        name = pred.get("name")
        if isinstance(name, str):
            by_name.setdefault(name, []).append(j)
    used: set[int] = set()
    matches: list[CallMatch] = []
    v_max = 0
    for i, exp in enumerate(expected):
        best: CallMatch | None = None
        best_score = 0.0
        for j in by_name.get(exp.get("name"), ()) if isinstance(exp.get("name"), str) else ():
            if j in used:
                continue
            pred_params = predicted[j].get("parameters") or {}
            if not pred_params and exp.get("parameters"):
                continue  # no key in common and no value: scores 0, never a match (and a flood of them is cheap)
            keys = _expected_keys(exp, pred_params)
            key_score = _key_jaccard(keys, list(pred_params))
            equal = sum(1 for k in keys if k in pred_params and _value_matches(exp, k, pred_params[k]))
            if key_score + equal > best_score:
                best_score = key_score + equal
                best = CallMatch(i, j, key_score, equal, len(keys))
        if best is None:
            v_max += len(exp.get("parameters", {}))
        else:
            used.add(best.predicted_index)
            matches.append(best)
            v_max += best.num_expected_keys
    return matches, v_max


def _call_matches(exp: Call, pred: Call) -> bool:
    """``pred`` is ``exp`` exactly: its name, exactly the expected parameters, accepted values."""
    params = pred.get("parameters") or {}
    if exp.get("name") != pred.get("name"):
        return False
    if sorted(_expected_keys(exp, params)) != sorted(params):
        return False
    return all(_value_matches(exp, k, v) for k, v in params.items())


def calls_exactly_match(expected: Sequence[Call], predicted: Sequence[Call], ordered: bool = True) -> bool:
    """The same calls, each with exactly the expected parameters and values.

    ``ordered``: in the same order. Otherwise BFCL's rule for its parallel categories: as many
    calls, and each expected call in turn takes the first unused predicted call that matches it.
    """
    if len(expected) != len(predicted):
        return False
    if ordered:
        return all(_call_matches(exp, pred) for exp, pred in zip(expected, predicted))
    used: set[int] = set()
    for exp in expected:
        j = next((j for j, pred in enumerate(predicted) if j not in used and _call_matches(exp, pred)), None)
        if j is None:
            return False
        used.add(j)
    return True


def _check_rules(rules: str) -> None:
    if rules not in RULE_SETS:
        raise ValueError(f"rules must be one of {RULE_SETS}, got {rules!r}")


def _names(calls: Sequence[Call]) -> list[Any]:
    return [c.get("name") for c in calls]


def _name_precision(expected: Sequence[Call], predicted: Sequence[Call]) -> float:
    """Share of predicted calls whose name is an expected name (multiset intersection); 0 for none."""
    if not predicted:
        return 0.0
    names = [n for n in _names(predicted) if isinstance(n, str)]
    common = sum((Counter(_names(expected)) & Counter(names)).values())
    return common / len(predicted)


def _match_precision(matches: Sequence[CallMatch], predicted: Sequence[Call]) -> float:
    """Share of predicted calls the greedy matching pairs with an expected call; 0 for none."""
    return len(matches) / len(predicted) if predicted else 0.0


def function_name_reward(
    expected: Sequence[Call], predicted: Sequence[Call] | None, rules: str = "paper", ordered: bool = True
) -> float:
    """``n - 0.5``, ``n`` the multiset Jaccard of tool names (``"strict"``: times the name precision); in [-0.5, 0.5]."""
    _check_rules(rules)
    if not expected:
        return 0.0
    if predicted is None:
        return -0.5
    if calls_exactly_match(expected, predicted, ordered):
        return 0.5
    names = [n if isinstance(n, str) else None for n in _names(predicted)]
    n = multiset_jaccard(_names(expected), names)
    if rules == "strict":
        n *= _name_precision(expected, predicted)
    return n - 0.5


def _parameter_from_matches(
    expected: Sequence[Call], predicted: Sequence[Call], matches: Sequence[CallMatch], rules: str
) -> float:
    share = sum(m.key_score for m in matches) / len(expected)
    if rules == "strict":
        share *= _match_precision(matches, predicted)
    return 2.0 * share - 1.0


def _values_from_matches(
    predicted: Sequence[Call], matches: Sequence[CallMatch], v_max: int, rules: str
) -> float:
    share = 1.0 if v_max == 0 else sum(m.equal_values for m in matches) / v_max
    if rules == "strict":
        share *= _match_precision(matches, predicted)
    return 3.0 * share - 1.5


def parameter_reward(
    expected: Sequence[Call], predicted: Sequence[Call] | None, rules: str = "paper", ordered: bool = True
) -> float:
    """``2 p / P_max - 1`` over the greedy matches (``"strict"``: ``p / P_max`` times the match precision); in [-1, 1]."""
    _check_rules(rules)
    if not expected:
        return 0.0
    if predicted is None:
        return -1.0
    if calls_exactly_match(expected, predicted, ordered):
        return 1.0
    matches, _ = match_calls(expected, predicted)
    return _parameter_from_matches(expected, predicted, matches, rules)


def values_reward(
    expected: Sequence[Call], predicted: Sequence[Call] | None, rules: str = "paper", ordered: bool = True
) -> float:
    """``3 v / V_max - 1.5`` over the greedy matches, 1.5 when ``V_max = 0`` (``"strict"``: ``v / V_max``
    times the match precision); in [-1.5, 1.5]."""
    _check_rules(rules)
    if not expected:
        return 0.0
    if predicted is None:
        return -1.5
    if calls_exactly_match(expected, predicted, ordered):
        return 1.5
    matches, v_max = match_calls(expected, predicted)
    return _values_from_matches(predicted, matches, v_max, rules)


def _correctness_rewards(
    expected: Sequence[Call], predicted: Sequence[Call] | None, rules: str, ordered: bool = True
) -> tuple[float, float, float]:
    """The three correctness rewards with one matching (what the three functions give one by one)."""
    if not expected or predicted is None or calls_exactly_match(expected, predicted, ordered):
        return (
            function_name_reward(expected, predicted, rules, ordered),
            parameter_reward(expected, predicted, rules, ordered),
            values_reward(expected, predicted, rules, ordered),
        )
    matches, v_max = match_calls(expected, predicted)
    return (
        function_name_reward(expected, predicted, rules, ordered),
        _parameter_from_matches(expected, predicted, matches, rules),
        _values_from_matches(predicted, matches, v_max, rules),
    )


def format_reward(answer: str, expects_calls: bool, expects_response: bool) -> float:
    """1.0 when the answer has exactly the expected block shape, else 0.0."""
    return 1.0 if has_expected_shape(answer, expects_calls, expects_response) else 0.0


@dataclass
class AnswerScore:
    """The four rewards of one answer, and what the environment reports about it."""

    rewards: dict[str, float]
    #: calls were expected, and the benchmark accepts the calls (without one: the three
    #: correctness rewards are at their maxima)
    exact: bool
    num_predicted_calls: int
    error: str | None = None


def score_answer(
    answer: str, expected_calls: Sequence[Call], expects_response: bool, rules: str = "paper",
    ordered: bool = True, benchmark: Callable[[list[dict[str, Any]] | None], bool] | None = None,
) -> AnswerScore:
    """Score an answer against the expected calls (``[]``: no call expected) under a rule set
    of :data:`RULE_SETS`; ``ordered=False``: the calls may come in any order (BFCL's parallel
    categories). ``benchmark``: a verdict on the answer's calls (``None`` when they cannot be
    read) that decides ``exact`` in place of the rewards. Never raises on any answer (nor may
    ``benchmark``)."""
    _check_rules(rules)
    parsed = parse_answer(answer)
    error: str | None = None
    predicted: list[dict[str, Any]] | None = parsed.tool_calls
    if expected_calls and not parsed.calls_readable:
        predicted = None
        error = parsed.errors[0] if parsed.errors else "no <tool_call> block"
    elif parsed.think is None and not parsed.num_tool_blocks and parsed.response is None:
        error = "answer has no <think>, <tool_call> or <response> block"
    name_r, parameter_r, values_r = _correctness_rewards(expected_calls, predicted, rules, ordered)
    rewards = {
        "function_name": name_r,
        "parameter": parameter_r,
        "values": values_r,
        "format": format_reward(answer, bool(expected_calls), expects_response),
    }
    if benchmark is not None:
        exact = bool(expected_calls) and benchmark(predicted)
    else:
        exact = bool(expected_calls) and all(
            rewards[n] == hi for n, hi in zip(REWARD_NAMES[:3], REWARD_HIGH[:3])
        )
    return AnswerScore(rewards, exact, len(parsed.tool_calls), error)
