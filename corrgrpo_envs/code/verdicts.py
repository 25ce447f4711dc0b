"""Verdicts of the code domain, decided where the judged program cannot reach.

A candidate never runs next to its tests. Per problem, once:

1. **Plan** (sandbox, trusted code only): the reference solution runs under the
   data set's own ``check`` with a recorder in place of the candidate; the
   recorder keeps the arguments of every call as plain data
   (:mod:`corrgrpo_envs.sandbox.calls`). That list of inputs is the plan.

Per answer:

2. **Calls** (sandbox, the candidate): ``prompt + code`` runs, then the runner
   calls the entry point on each planned input and reports what each call
   returned, as plain data. No expected output, no test code and no reference
   is in that sandbox.
3. **Verdict** (host): the data set's ``check`` runs here, in a fresh namespace,
   against a *replay* function: call ``k`` must have the planned arguments and
   gets the candidate's recorded value ``k`` back (decoded from data; a value
   that is not plain data, a missing one or a raised exception fails). Checks
   that test properties (``find_zero``, ``decode_cyclic``) or use tolerances
   work unchanged, and a value's ``__eq__`` is never the candidate's.

``random`` is private and seeded (``Random(0)``) inside every check namespace,
in the plan and in the verdict, so checks that draw random inputs draw the same
ones. Timing is the CPU time the kernel counted for the candidate's processes
(:attr:`~corrgrpo_envs.sandbox.RunResult.cpu_seconds`), or the host's wall time
where a backend cannot see it.
"""

from __future__ import annotations

import ast
import hashlib
import json
import threading
from dataclasses import dataclass
from typing import Any

from corrgrpo_envs.code.references import measured_seconds
from corrgrpo_envs.code.rewards import parse_python
from corrgrpo_envs.sandbox import Limits, RunResult, Sandbox
from corrgrpo_envs.sandbox.calls import (
    PLAIN_SOURCE,
    CallRecord,
    NotPlain,
    calls_program,
    decode,
    encode,
    parse_channel,
)
from corrgrpo_envs.tasks import Task

__all__ = ["CallPlan", "Verdicts", "candidate_program", "judge", "measured_seconds",
           "prompt_classes", "HOST_STATUSES"]

#: Statuses the host decides from outside the program: a run with one of them never passes.
HOST_STATUSES = ("timeout", "output_limit", "sandbox_error")

#: The plan program prints its result after this marker (one line of JSON).
_PLAN_MARKER = "#corrgrpo-plan "

#: Output room for a plan (its inputs travel on stdout).
_PLAN_OUTPUT_BYTES = 64 << 20

#: Least wall seconds a plan gets (4x the candidates' timeout when that is more).
_PLAN_MIN_TIMEOUT = 20.0

# Builtins for a check's namespace: the same as usual, except that ``import random``
# gives a private module whose functions draw from ``Random(0)``. Used in the plan
# program (sandbox) and for verdicts (host), so both draw the same inputs.
CHECK_ENV_SOURCE = r'''
def _corrgrpo_check_builtins():
    import builtins, random as real, types
    private = types.ModuleType("random")
    private.__dict__.update(vars(real))
    rng = real.Random(0)
    for name in list(vars(real)):
        if not name.startswith("_") and hasattr(rng, name):
            setattr(private, name, getattr(rng, name))
    real_import = builtins.__import__
    def checked_import(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "random" and level == 0:
            return private
        return real_import(name, globals, locals, fromlist, level)
    table = dict(vars(builtins))
    table["__import__"] = checked_import
    return table
'''

_HOST_ENV: dict[str, Any] = {"__name__": "corrgrpo_envs.code.verdicts.check_env"}
exec(compile(CHECK_ENV_SOURCE, "<check env>", "exec"), _HOST_ENV)

_PLAN_TEMPLATE = r'''
import io, json, sys
{plain}
{check_env}
_out = sys.stdout
sys.stdout = io.StringIO()
_reference = {{"__name__": "__main__"}}
exec(compile({reference!r}, "<reference>", "exec"), _reference)
_check = {{"__name__": "__main__", "__builtins__": _corrgrpo_check_builtins()}}
exec(compile({check!r}, "<check>", "exec"), _check)
_entry = eval({entry!r}, _reference)
_inputs = []
def _recorder(*args, **kwargs):
    _inputs.append(json.dumps(_plain_encode((args, kwargs), {classes!r}), separators=(",", ":")))
    return _entry(*args, **kwargs)
if {entry!r}.isidentifier():
    _check[{entry!r}] = _recorder  # a check that calls the entry by name calls the candidate
_passed = True
try:
    _check["check"](_recorder)
except AssertionError:
    _passed = False
sys.stdout = _out
print({marker!r} + json.dumps({{"inputs": _inputs, "passed": _passed}}))
'''


@dataclass(frozen=True)
class CallPlan:
    """A problem's planned calls: ``inputs`` (JSON of plain ``(args, kwargs)``), in order.

    ``passed``: the reference passed its own check; ``error``: why no plan could be
    made (the reference crashed, or the check passes something that is not plain data).
    """

    inputs: tuple[str, ...]
    passed: bool
    classes: tuple[str, ...]
    error: str = ""


def prompt_classes(prompt: str) -> tuple[str, ...]:
    """Names of the classes the prompt defines at top level (LeetCode's ``ListNode``...)."""
    try:
        tree = parse_python(prompt)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return ()
    return tuple(node.name for node in tree.body if isinstance(node, ast.ClassDef))


def _check_source(task: Task) -> str:
    return f"{task['prompt']}\n{task['test']}\n"


def plan_program(task: Task) -> str:
    """The trusted program that records the check's calls to the reference."""
    return _PLAN_TEMPLATE.format(
        plain=PLAIN_SOURCE, check_env=CHECK_ENV_SOURCE,
        reference=f"{task['prompt']}\n{task['reference']}\n",
        check=_check_source(task), entry=task["entry_point"], classes=prompt_classes(task["prompt"]),
        marker=_PLAN_MARKER,
    )


def candidate_program(task: Task, code: str, plan: CallPlan) -> str:
    """``prompt + code`` with the directive to call the entry on the planned inputs."""
    return calls_program(f"{task['prompt']}\n{code}\n", task["entry_point"], plan.inputs, plan.classes)


class _Failure(Exception):
    """A replayed call that cannot return a value; ``status`` is the verdict."""

    def __init__(self, status: str):
        super().__init__(status)
        self.status = status


class _Replay:
    """Stands in for the candidate inside the trusted check: returns its recorded values."""

    def __init__(self, plan: CallPlan, records: dict[int, CallRecord], classes: dict[str, type]):
        self._plan = plan
        self._records = records
        self._classes = classes
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        k = self.calls
        self.calls += 1
        if k >= len(self._plan.inputs) or not self._planned(k, args, kwargs):
            raise _Failure("error:UnplannedCall")
        record = self._records.get(k)
        if record is None:
            raise _Failure("error:NoOutput")
        if record.kind == "X":
            if record.detail == "AssertionError":
                raise AssertionError("raised by the candidate")
            if record.detail == "MemoryError":
                raise _Failure("memory")
            raise _Failure("error:" + _exception_name(record.detail))
        if record.kind != "R":
            raise _Failure("error:NotPlain")
        try:
            return decode(json.loads(record.detail), self._classes)
        except (NotPlain, ValueError, RecursionError, MemoryError):
            raise _Failure("error:NotPlain") from None

    def _planned(self, k: int, args: tuple, kwargs: dict) -> bool:
        planned = self._plan.inputs[k]
        try:
            mine = json.dumps(encode((args, kwargs), self._plan.classes), separators=(",", ":"))
        except NotPlain:
            return False
        if mine == planned:
            return True
        try:  # the same value, laid out differently (a set of strings under another hash seed)
            return bool(decode(json.loads(planned), self._classes) == (args, kwargs))
        except Exception:
            return False


def judge(task: Task, plan: CallPlan, result: RunResult) -> str:
    """The verdict on one candidate run: ``ok``, ``assertion``, ``error:<Name>``, ``memory``,
    ``timeout``, ``output_limit``, ``killed[:SIGNAL]`` or ``sandbox_error``.

    Decided here: from the run, only the host's own observations (timeout, output
    cap, how the process ended) and the recorded values are used.
    """
    if result.status in HOST_STATUSES or result.status.startswith("killed"):
        return result.status
    runner_status, _, records = parse_channel(result.channel)
    if records is None:
        return "error:DuplicateRecord"
    namespace: dict[str, Any] = {"__name__": "__main__",
                                 "__builtins__": _HOST_ENV["_corrgrpo_check_builtins"]()}
    try:
        exec(_compiled_check(task), namespace)
        check = namespace["check"]
    except Exception as exc:  # the data set's own check does not load here
        return "sandbox_error:" + type(exc).__name__
    prompt_types = {n: namespace[n] for n in plan.classes if isinstance(namespace.get(n), type)}
    replay = _Replay(plan, records, prompt_types)
    if task["entry_point"].isidentifier():
        namespace[task["entry_point"]] = replay  # as in the plan: the name is the candidate
    try:
        check(replay)
    except AssertionError:
        return "assertion"
    except _Failure as failure:
        if failure.status == "error:NoOutput" and runner_status is not None:
            # The program stopped before that call and said why: shown if it names an error
            # (what it says is not trusted, so it can only ever read as a failure).
            if runner_status == "memory":
                return "memory"
            if runner_status.startswith("error:"):
                return "error:" + _exception_name(runner_status[6:])
        return failure.status
    except MemoryError:
        return "memory"
    except Exception as exc:  # the check choked on a returned value (None < 1...)
        return "error:" + type(exc).__name__
    return "ok"


def _exception_name(text: str) -> str:
    """``text`` if it can be an exception's name, else ``Exception`` (it came from the program)."""
    return text if text.isidentifier() and len(text) <= 80 else "Exception"


_COMPILED: dict[str, Any] = {}


def _compiled_check(task: Task):
    source = _check_source(task)
    key = hashlib.sha256(source.encode("utf-8", "replace")).hexdigest()
    code = _COMPILED.get(key)
    if code is None:
        code = _COMPILED[key] = compile(source, f"<check {task.id}>", "exec")
    return code


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
