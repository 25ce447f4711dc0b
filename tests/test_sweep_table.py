"""``corrgrpo sweep``'s table: each row names its weights, and the header says the numbers are
means over the seeds with a 95 % t-interval, in percent of each component's range."""

from __future__ import annotations

from corrgrpo.trainer.commands.sweep import front_table

NAMES = ["digits", "has_a", "word_with_a"]


def _point(index, weights, ci95, on_front, estimator="grpo", seeds=(0, 1)):
    return {"estimator": estimator, "weighting": index, "weights": weights, "seeds": list(seeds),
            "non_dominated": on_front,
            "percent": {n: {"mean": 62.5 - 10 * k, "ci95": ci95} for k, n in enumerate(NAMES)}}


def test_rows_name_their_weights_and_the_header_says_what_the_numbers_are():
    front = {"names": NAMES, "points": [_point(0, [1.0, 0.0, 0.0], 12.706, True),
                                       _point(1, [0.5, 0.5, 0.0], 3.0, False)]}
    assert front_table(front, "simplex:2") == [
        "each component: the greedy eval mean over 2 seed(s) ± the half-width of its 95 % t-interval,",
        "  in percent of the component's range (0 = its low bound, 100 = its high bound)",
        "weights: per unit of each component's range, in the order digits, has_a, word_with_a; "
        "* = on the Pareto front",
        "estimator    weighting               digits           has_a     word_with_a  front",
        "grpo         w0 (1 0 0)       62.5 ± 12.7 %   52.5 ± 12.7 %   42.5 ± 12.7 %  *",
        "grpo         w1 (0.5 0.5 0)    62.5 ± 3.0 %    52.5 ± 3.0 %    42.5 ± 3.0 %",
    ]


def test_weights_from_a_file_are_shown_as_given_and_one_seed_has_no_interval():
    front = {"names": NAMES, "points": [_point(0, {"digits": 1}, None, True, "corrgrpo", seeds=(0,)),
                                        _point(1, [2, 1, 1], 1.5, True, "corrgrpo")]}
    lines = front_table(front, "weights.yaml")
    assert lines[0].startswith("each component: the greedy eval mean over 1-2 seed(s) ±")
    assert lines[2].startswith("weights: algorithm.reward_weights as given, in the order digits,")
    assert lines[4] == 'corrgrpo     w0 ({"digits":1})          62.5 %          52.5 %          42.5 %  *'
    assert lines[5].startswith("corrgrpo     w1 (2 1 1)         ")
