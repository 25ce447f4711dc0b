"""Attacks on the code domain's host-side judge, each as a probe: ``probe_<name>() -> (held, detail)``.

(The last two attack the text rewards instead, which the host computes too: an answer whose
``ast_similarity`` or ``compile`` would cost seconds of the host's CPU must score 0 for it.)

Each probe plays one answer through ``corrgrpo/Code-v0`` (a real sandbox on
``backend``) or hands one forged record to the judge, and checks that the answer
scores ``correct = 0`` with status ``judge:bound`` (or another failing status)
while the step costs the host at most :data:`HOST_CPU_BUDGET` seconds of CPU:
the training process's own (``time.process_time``) plus the judge worker's.

The answers emit their record by replacing ``json.dumps`` in their own process:
the runner then writes whatever text the program chose as its record (records
are never trusted, so this is as good as any honest value would be). Without the
bounds, :func:`probe_shared_tuple_dag` (an answer of under 200 characters) hashed a tuple
of 2^64 nodes and stopped the training process, and
:func:`probe_colliding_hash_set` (a 1 MB record) cost seconds per step holding
the GIL.

``PROBES`` lists them by name, for a red-team command to run; every probe takes an
optional ``backend`` (a sandbox backend name, default ``auto``).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corrgrpo_envs.code.judge import BOUND_STATUS, CallPlan
from corrgrpo_envs.code.judge_pool import JudgePool
from corrgrpo_sandbox.calls import encode

__all__ = ["HOST_CPU_BUDGET", "PROBES", "SHARED_TUPLE_DAG_ANSWER", "colliding_hash_answer",
           "compile_stall_answer", "similarity_stall_answer"]

#: Host CPU seconds one step may cost on any answer (process and judge worker together).
HOST_CPU_BUDGET = 1.0

#: HumanEval/0's entry, as every answer here defines it.
_ENTRY = "def has_close_elements(numbers, threshold):\n    return True\n"

#: Under 200 characters: a record of 66 nodes whose value is a set holding a tuple of 2^64 nodes
#: (each level references the one below twice); hashing it never ends.
SHARED_TUPLE_DAG_ANSWER = (
    "```python\nimport json\n"
    "r = [['N']] + [['T', [i, i]] for i in range(64)] + [['E', [64]]]\n"
    "t = json.dumps(r)\n"
    "json.dumps = lambda *a, **k: t\n"
    "def has_close_elements(numbers, threshold):\n"
    "    return True\n```"
)

#: 2^61 - 1: CPython hashes an int modulo this, so every multiple of it hashes to 0.
_HASH_MODULUS = (1 << 61) - 1


def colliding_hash_answer(n: int = 28_000, tag: str = "E") -> str:
    """An answer whose first record is ``n`` distinct ints with one hash under a set (``E``) or
    in a list (``L``): 0.99 MB for 28,000 (the channel holds 1 MiB, so later calls record
    ``True``); building the set compares every pair."""
    return (
        "```python\nimport json\n"
        f"M = {_HASH_MODULUS}\n"
        f"r = [['I', hex(k * M)] for k in range(1, {n + 1})] + [[{tag!r}, list(range({n}))]]\n"
        "t = [json.dumps(r, separators=(',', ':'))]\n"
        "json.dumps = lambda *a, **k: t.pop() if t else '[[\"B\",1]]'\n"
        f"{_ENTRY}```"
    )


def _step(env: Any, task_id: str, action: str) -> tuple[dict[str, float], dict[str, Any], float]:
    """``(rewards, info, host CPU seconds)`` of one step: this process's plus the judge worker's."""
    env.reset(options={"task_id": task_id})
    start = time.process_time()
    _, reward, _, _, info = env.step(action)
    workers = (info.get("judge_cpu_seconds") or 0.0) + (info.get("compile_cpu_seconds") or 0.0)
    seconds = time.process_time() - start + workers
    return dict(zip(env.unwrapped.reward_names, map(float, reward))), info, seconds


def _held(rewards: dict[str, float], info: dict[str, Any], seconds: float,
          expect: str | None = BOUND_STATUS) -> tuple[bool, str]:
    status = info.get("status")
    ok = rewards["correct"] == 0.0 and seconds <= HOST_CPU_BUDGET and (expect is None or status == expect)
    return ok, f"status {status}, correct {rewards['correct']:.0f}, host CPU {seconds:.2f} s"


def _env(backend: str, dataset: str | Path = "humaneval") -> Any:
    import corrgrpo_envs

    return corrgrpo_envs.make("corrgrpo/Code-v0", dataset=dataset, backend=backend, efficiency="off",
                              timeout=10.0)


def probe_shared_tuple_dag(backend: str = "auto") -> tuple[bool, str]:
    """A 199-character answer whose record is a set holding a tuple of 2^64 shared nodes."""
    env = _env(backend)
    try:
        return _held(*_step(env, "HumanEval/0", SHARED_TUPLE_DAG_ANSWER))
    finally:
        env.close()


def probe_colliding_hash_set(backend: str = "auto") -> tuple[bool, str]:
    """A 1 MB record: a set of 28,000 distinct ints that all hash to 0 (quadratic to build)."""
    env = _env(backend)
    try:
        return _held(*_step(env, "HumanEval/0", colliding_hash_answer(28_000, "E")))
    finally:
        env.close()


def probe_shared_list_dag(backend: str = "auto") -> tuple[bool, str]:
    """No forgery: the entry returns a list of 64 levels, each holding the level below twice.
    The runner's encoder keeps the sharing (66 nodes); any walk of the value on the host
    (``==`` against a nested expected value, ``repr``) would visit 2^64 nodes."""
    answer = ("```python\ndef has_close_elements(numbers, threshold):\n    v = []\n"
              "    for _ in range(64):\n        v = [v, v]\n    return v\n```")
    env = _env(backend)
    try:
        return _held(*_step(env, "HumanEval/0", answer))
    finally:
        env.close()


def probe_deep_tuple_under_a_set(backend: str = "auto") -> tuple[bool, str]:
    """A set holding a chain of 60,000 nested tuples: hashing it recurses 60,000 C frames deep
    (a C stack overflow would end the process that decodes it). Any failing status holds."""
    answer = (
        "```python\nimport json\n"
        "r = [['N']] + [['T', [i]] for i in range(60000)] + [['E', [60000]]]\n"
        "t = [json.dumps(r, separators=(',', ':'))]\n"
        "json.dumps = lambda *a, **k: t.pop() if t else '[[\"B\",1]]'\n"
        f"{_ENTRY}```"
    )
    env = _env(backend)
    try:
        return _held(*_step(env, "HumanEval/0", answer), expect=None)
    finally:
        env.close()


#: A data set of one problem whose check hashes what the candidate returns (as checks that
#: compare sets do): the decode builds only a list, the check's ``set()`` is the slow part.
_SET_CHECK_TASK = {
    "task_id": "probe/0",
    "prompt": "def has_close_elements(numbers, threshold):\n    \"\"\"Distinct numbers.\"\"\"\n",
    "canonical_solution": "    return sorted(set(numbers))\n",
    "test": "def check(candidate):\n    assert set(candidate([1, 2, 2], 0.5)) == {1, 2}\n",
    "entry_point": "has_close_elements",
}


def probe_colliding_hash_in_check(backend: str = "auto") -> tuple[bool, str]:
    """A list of 28,000 ints with one hash, which the check turns into a set: one C-level loop
    holding the GIL for seconds, stopped by the judge worker's CPU deadline."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "set_check.jsonl"
        path.write_text(json.dumps(_SET_CHECK_TASK) + "\n")
        env = _env(backend, path)
        try:
            return _held(*_step(env, "probe/0", colliding_hash_answer(28_000, "L")))
        finally:
            env.close()


def probe_judge_deadline(backend: str = "auto") -> tuple[bool, str]:
    """A check that loops in C (``sum`` over a huge ``range``) on a forged record: the judge
    worker is killed at its CPU deadline, and the next verdict in the pool still scores right
    (no sandbox: ``backend`` is accepted like every probe's, and unused)."""
    from corrgrpo_envs.tasks import Task

    task = Task("probe/deadline", {
        "prompt": "def f(n):\n    pass\n",
        "test": "def check(candidate):\n    assert sum(range(candidate(1))) >= 0\n",
        "entry_point": "f",
    })
    plan = CallPlan((json.dumps(encode(((1,), {})), separators=(",", ":")),), True, ())
    forged = _Run("ok", 'R 0 [["I","0x' + "f" * 15 + '"]]\nok 0.0\n')
    honest = _Run("ok", 'R 0 [["I","0x3"]]\nok 0.0\n')
    with JudgePool(size=1) as pool:
        start = time.process_time()
        status, worker = pool.judge_with_cost(task, plan, forged)
        seconds = time.process_time() - start + (worker or 0.0)
        after = pool.judge(task, plan, honest)
    held = status == BOUND_STATUS and seconds <= HOST_CPU_BUDGET and after == "ok"
    return held, f"status {status}, host CPU {seconds:.2f} s, next verdict {after}"


def _bound_held(rewards: dict[str, float], info: dict[str, Any], seconds: float,
                reward: str) -> tuple[bool, str]:
    bound = info.get("reward_bound", [])
    ok = rewards[reward] == 0.0 and reward in bound and seconds <= HOST_CPU_BUDGET
    return ok, f"{reward} {rewards[reward]:.2f}, bound {bound}, host CPU {seconds:.2f} s"


#: Assigns of 1, 2, ... 40 terms: a reference of 3,500 nodes whose assigns, in order, grow.
_LONG_REFERENCE = (
    "def has_close_elements(numbers, threshold):\n"
    + "".join(f"    v{k} = " + " + ".join(["threshold"] * k) + "\n" for k in range(1, 41))
    + "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
)


def similarity_stall_answer(chars: int = 19_900) -> str:
    """A code block of ``chars`` characters against :data:`_LONG_REFERENCE`: a tuple of names,
    then the reference's growing assigns in order, apart (a ``pass`` after each). difflib's
    recursion matches the longest assign first, then searches the whole tuple again for each
    shorter one (each search looks at every place of every name in the reference): about the
    cube of the sizes."""
    assigns = "".join(f"v{k} = " + " + ".join(["threshold"] * k) + "\npass\n" for k in range(1, 41))
    filler = "x = (" + "a," * ((chars - len(assigns) - 8) // 2) + ")\n"
    return f"```python\n{filler}{assigns}```"


def _long_reference_env(backend: str, folder: str) -> Any:
    row = {"task_id": "probe/long", "prompt": "", "canonical_solution": _LONG_REFERENCE,
           "test": "def check(candidate):\n    assert candidate([1.0, 2.8], 0.3) is False\n",
           "entry_point": "has_close_elements"}
    path = Path(folder) / "long_reference.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return _env(backend, path)


def probe_similarity_stall(backend: str = "auto") -> tuple[bool, str]:
    """A 20,000-character answer whose ``ast_similarity`` to a long reference costs difflib
    about the cube of the sizes: it scores 0 for it, within the step's CPU budget."""
    with tempfile.TemporaryDirectory() as folder:
        env = _long_reference_env(backend, folder)
        try:
            return _bound_held(*_step(env, "probe/long", similarity_stall_answer()), "ast_similarity")
        finally:
            env.close()


def compile_stall_answer(chars: int = 19_900) -> str:
    """HumanEval/0's entry, then a sum of 4,096-character string constants: the compiler folds
    them one by one, copying the growing string each time (quadratic: 24 s for 20,000 characters)."""
    bomb = "y = " + '"a"*4096+' * ((chars - len(_ENTRY) - 8) // 9) + '""\n'
    return f"```python\n{_ENTRY}{bomb}```"


def probe_compile_stall(backend: str = "auto") -> tuple[bool, str]:
    """A 20,000-character answer whose constant folding costs the compiler seconds: it scores
    ``compile = 0`` (the judge worker compiling it is killed at its deadline)."""
    env = _env(backend)
    try:
        return _bound_held(*_step(env, "HumanEval/0", compile_stall_answer()), "compile")
    finally:
        env.close()


class _Run:
    __slots__ = ("status", "channel")

    def __init__(self, status: str, channel: str):
        self.status = status
        self.channel = channel


#: Every probe of this module by name.
PROBES: dict[str, Callable[..., tuple[bool, str]]] = {
    "shared_tuple_dag": probe_shared_tuple_dag,
    "colliding_hash_set": probe_colliding_hash_set,
    "shared_list_dag": probe_shared_list_dag,
    "deep_tuple_under_a_set": probe_deep_tuple_under_a_set,
    "colliding_hash_in_check": probe_colliding_hash_in_check,
    "judge_deadline": probe_judge_deadline,
    "similarity_stall": probe_similarity_stall,
    "compile_stall": probe_compile_stall,
}
