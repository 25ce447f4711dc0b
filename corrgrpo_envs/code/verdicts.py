"""Verdicts of the code domain, decided where the judged program cannot reach.

A candidate never runs next to its tests. Per problem, once:

1. **Plan** (sandbox, trusted code only): the reference solution runs under the
   data set's own ``check`` with a recorder in place of the candidate; the
   recorder keeps the arguments of every call as plain data
   (:mod:`corrgrpo_sandbox.calls`). That list of inputs is the plan.

Per answer:

2. **Calls** (sandbox, the candidate): ``prompt + code`` runs, then the runner
   calls the entry point on each planned input and reports what each call
   returned, as plain data. No expected output, no test code and no reference
   is in that sandbox.
3. **Verdict** (host, :mod:`corrgrpo_envs.code.judge`; the env runs it in a worker
   process under a CPU-time deadline, :mod:`corrgrpo_envs.code.judge_pool`): the
   data set's ``check`` runs in a fresh namespace,
   against a *replay* function: call ``k`` must have the planned arguments and
   gets the candidate's recorded value ``k`` back (decoded from data; a value
   that is not plain data, a missing one or a raised exception fails). Checks
   that test properties (``find_zero``, ``decode_cyclic``) or use tolerances
   work unchanged, and a value's ``__eq__`` is never the candidate's.

``random`` is private and seeded (``Random(0)``) inside every check namespace,
in the plan and in the verdict, so checks that draw random inputs draw the same
ones. Timing is the CPU time the kernel counted for the candidate's processes
(:attr:`~corrgrpo_sandbox.RunResult.cpu_seconds`), or the host's wall time
where a backend cannot see it.
"""

from __future__ import annotations

import ast
import hashlib
import json
import threading

from corrgrpo_envs.code import inside
from corrgrpo_envs.code.judge import (
    BOUND_STATUS,
    HOST_STATUSES,
    CallPlan,
    check_source,
    judge,
)
from corrgrpo_envs.code.references import measured_seconds
from corrgrpo_envs.code.rewards import parse_python
from corrgrpo_envs.tasks import Task
from corrgrpo_sandbox import Limits, Sandbox
from corrgrpo_sandbox.calls import PLAIN_SOURCE, calls_program

__all__ = ["BOUND_STATUS", "CallPlan", "Verdicts", "candidate_program", "judge", "measured_seconds",
           "prompt_classes", "HOST_STATUSES"]

#: The plan program prints its result after this marker (one line of JSON).
_PLAN_MARKER = "#corrgrpo-plan "

#: Output room for a plan (its inputs travel on stdout).
_PLAN_OUTPUT_BYTES = 64 << 20

#: Least wall seconds a plan gets (4x the candidates' timeout when that is more).
_PLAN_MIN_TIMEOUT = 20.0



def prompt_classes(prompt: str) -> tuple[str, ...]:
    """Names of the classes the prompt defines at top level (LeetCode's ``ListNode``...)."""
    try:
        tree = parse_python(prompt)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return ()
    return tuple(node.name for node in tree.body if isinstance(node, ast.ClassDef))


def plan_program(task: Task) -> str:
    """The trusted program that records the check's calls to the reference."""
    call = (task["prompt"] + "\n" + task["reference"] + "\n", check_source(task), task["entry_point"],
            prompt_classes(task["prompt"]), _PLAN_MARKER)
    # the codec, the check's builtins and the plan, then the one line that runs it on this task
    return "\n".join((PLAIN_SOURCE, inside.source("check_env"), inside.source("plan"),
                      f"_corrgrpo_plan(*{call!r})\n"))


def candidate_program(task: Task, code: str, plan: CallPlan) -> str:
    """``prompt + code`` with the directive to call the entry on the planned inputs."""
    return calls_program(f"{task['prompt']}\n{code}\n", task["entry_point"], plan.inputs, plan.classes)


class Verdicts:
    """Plans per problem (made once per process and shared), candidate programs and verdicts.

    Args:
        sandbox: where plans run (the same sandbox as the candidates).
        limits: the candidates' limits (a plan gets more output room).
    """

    _plans: dict[str, CallPlan] = {}
    _locks: dict[str, threading.Lock] = {}
    _guard = threading.Lock()

    def __init__(self, sandbox: Sandbox, limits: Limits):
        self.sandbox = sandbox
        self.limits = limits

    @staticmethod
    def _key(task: Task) -> str:
        parts = (task["prompt"], task["reference"], task["test"], task["entry_point"])
        return hashlib.sha256("\0".join(parts).encode("utf-8", "replace")).hexdigest()

    def plan(self, task: Task) -> CallPlan:
        """The task's plan, made now in the sandbox if this process has none yet."""
        key = self._key(task)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plans[key] = self._make_plan(task)
        return plan

    def _make_plan(self, task: Task) -> CallPlan:
        classes = prompt_classes(task["prompt"])
        # Once per problem, so it may take longer than a candidate: a plan lost to a busy
        # machine would fail every answer to that problem for the rest of the process.
        limits = Limits(**{**self.limits.__dict__, "output_bytes": _PLAN_OUTPUT_BYTES,
                           "timeout": max(_PLAN_MIN_TIMEOUT, 4 * self.limits.timeout)})
        result = self.sandbox.run(plan_program(task), limits)
        line = next((ln for ln in reversed(result.stdout.splitlines()) if ln.startswith(_PLAN_MARKER)), None)
        if line is None:
            return CallPlan((), False, classes, f"the reference's plan did not finish ({result.status})")
        data = json.loads(line[len(_PLAN_MARKER):])
        return CallPlan(tuple(data["inputs"]), bool(data["passed"]), classes)
