"""The host-side judge of the code domain: a candidate's recorded values under the data
set's own check (see :mod:`corrgrpo_envs.code.verdicts` for the whole design).

The check runs here, in a fresh namespace, against a *replay* function: call ``k``
must have the planned arguments and gets the candidate's recorded value ``k`` back,
decoded from data by :func:`corrgrpo_sandbox.calls.decode` under its bounds
(a record whose value is over them is ``judge:bound``). Everything here is linear
in the record's text except what the check itself does with the values; the
training process runs it in a worker under a CPU-time deadline
(:mod:`corrgrpo_envs.code.judge_pool`).

This module imports only the standard library and the plain-data codec, so that
a judge worker starts in milliseconds.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corrgrpo_envs.code.inside.check_env import _corrgrpo_check_builtins
from corrgrpo_sandbox.calls import (
    CallRecord,
    NotPlain,
    OverBound,
    decode,
    encode,
    parse_channel,
)

if TYPE_CHECKING:
    from corrgrpo_envs.tasks import Task
    from corrgrpo_sandbox import RunResult

__all__ = ["BOUND_STATUS", "HOST_STATUSES", "CallPlan", "judge"]

#: Statuses the host decides from outside the program: a run with one of them never passes.
HOST_STATUSES = ("timeout", "output_limit", "sandbox_error")

#: The verdict on a record over the judge's bounds: the decode's (its value would cost too
#: much to build or use) or the worker's CPU-time deadline. Never passes.
BOUND_STATUS = "judge:bound"


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


def check_source(task: Task) -> str:
    """The check's program: ``prompt + test`` (the prompt defines the classes tests use)."""
    return f"{task['prompt']}\n{task['test']}\n"


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
        except (OverBound, MemoryError):
            raise _Failure(BOUND_STATUS) from None
        except (NotPlain, ValueError, RecursionError):
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
            return bool(decode(json.loads(planned), self._classes, bounded=False) == (args, kwargs))
        except Exception:
            return False


def judge(task: Task, plan: CallPlan, result: RunResult) -> str:
    """The verdict on one candidate run: ``ok``, ``assertion``, ``error:<Name>``, ``memory``,
    ``judge:bound`` (a returned value over the decode's bounds), ``timeout``,
    ``output_limit``, ``killed[:SIGNAL]`` or ``sandbox_error``.

    Decided here: from the run, only the host's own observations (timeout, output
    cap, how the process ended) and the recorded values are used.
    """
    if result.status in HOST_STATUSES or result.status.startswith("killed"):
        return result.status
    runner_status, _, records = parse_channel(result.channel)
    if records is None:
        return "error:DuplicateRecord"
    namespace: dict[str, Any] = {"__name__": "__main__",
                                 "__builtins__": _corrgrpo_check_builtins()}
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
    except MemoryError:  # the check choked on the size of a returned value
        return BOUND_STATUS
    except Exception as exc:  # the check choked on a returned value (None < 1...)
        return "error:" + type(exc).__name__
    return "ok"


def _exception_name(text: str) -> str:
    """``text`` if it can be an exception's name, else ``Exception`` (it came from the program)."""
    return text if text.isidentifier() and len(text) <= 80 else "Exception"


_COMPILED: dict[str, Any] = {}


def _compiled_check(task: Task):
    source = check_source(task)
    key = hashlib.sha256(source.encode("utf-8", "replace")).hexdigest()
    code = _COMPILED.get(key)
    if code is None:
        code = _COMPILED[key] = compile(source, f"<check {task.id}>", "exec")
    return code

