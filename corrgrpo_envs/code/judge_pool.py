"""The host-side judge in worker processes, under a CPU-time deadline.

:func:`corrgrpo_envs.code.judge.judge` runs the data set's check on decoded
values. The decode is bounded (:func:`corrgrpo_sandbox.calls.decode`), but a
check is arbitrary code: ``set()`` of a list of integers that all hash alike, or a
``repr`` of a big value, is one C-level loop that holds the GIL, so no thread of
the training process could interrupt it. Here the judge runs in a small pool of
persistent worker processes instead; the training process only sends the record
and waits, and a worker that spends more than ``cpu_seconds`` of CPU time on one
verdict (read from ``/proc/<pid>/stat`` while waiting; the wall clock where that
is unreadable) is killed and the verdict is ``judge:bound``. The kernel backs
this up: each worker sets its own ``RLIMIT_CPU`` before each verdict, so a
worker whose parent died still stops.

A worker imports only the standard library and the judge (its packages'
``__init__`` files are skipped), so one starts in tens of milliseconds; it
keeps each problem's plan and compiled check after the first verdict, so a
verdict costs the record's transfer plus the check. Workers are shared by
every env of a process (:func:`shared_pool`).

The ``compile`` reward runs here too (:meth:`JudgePool.compiles`): CPython's compiler folds
constant expressions and builds nested code objects in more than linear time (a 20,000-character
answer adding 2,000 strings of 4,096 characters takes 24 s to compile, 2,800 nested lambdas 1 s),
and it is one C call no thread could interrupt either.

Wire format, both ways: a 4-byte big-endian length, then that many bytes of
JSON (``ensure_ascii``, so lone surrogates in a channel survive). Requests are
``{"load": key, "task": ..., "plan": ...}`` (no deadline: trusted data),
``{"judge": key, "status": ..., "channel": ...}`` and ``{"compile": program}``; replies
``{"status": ...}``, ``{"need": key}`` (load that problem first), ``{"loaded": key}`` or
``{"compiles": bool}``.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import math
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corrgrpo_envs.code.judge import BOUND_STATUS, CallPlan

if TYPE_CHECKING:
    from corrgrpo_envs.tasks import Task
    from corrgrpo_sandbox import RunResult

__all__ = ["COMPILE_CPU_SECONDS", "JUDGE_CPU_SECONDS", "JudgePool", "shared_pool"]

#: CPU seconds one verdict may take in a worker. An honest verdict takes milliseconds
#: (the slowest LeetCodeDataset check on its reference's values ~0.1 s, see docs/code.md).
JUDGE_CPU_SECONDS = 0.5

#: CPU seconds compiling one judged program may take in a worker (:meth:`JudgePool.compiles`).
#: The slowest program of the shipped data sets (prompt, reference and test) compiles in 0.035 s.
COMPILE_CPU_SECONDS = 0.25

#: Wall seconds one verdict may take whatever the CPU clock says (a worker starved of CPU).
JUDGE_WALL_SECONDS = 30.0

#: Address space of a worker (a check that builds something huge gets MemoryError).
JUDGE_MEMORY_BYTES = 4 << 30

#: Problems a worker keeps (plan and compiled check), least recently used first out.
WORKER_PROBLEMS = 256

_HEADER = struct.Struct(">I")
_POLL_SECONDS = 0.01
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# ------------------------------------------------------------------------------ the wire
def _write(fd: int, message: dict) -> None:
    data = json.dumps(message, separators=(",", ":")).encode("ascii")
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, n: int) -> bytes:
    parts, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("judge worker closed its pipe")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _read(fd: int) -> dict:
    (n,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    return json.loads(_read_exact(fd, n))


# ---------------------------------------------------------------------------- the worker
def serve() -> None:
    """A worker's loop: read requests on stdin, answer on stdout, until stdin closes."""
    import resource

    from corrgrpo_envs.code.judge import judge
    from corrgrpo_envs.code.rewards import compiles
    from corrgrpo_envs.tasks import Task
    from corrgrpo_sandbox.calls import NotPlain

    # The protocol keeps its own copies of fds 0 and 1; a check that prints or reads gets
    # /dev/null instead of the pipes.
    wire_in, wire_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (JUDGE_MEMORY_BYTES, JUDGE_MEMORY_BYTES))
    except (ValueError, OSError):
        pass
    problems: OrderedDict[str, tuple[Task, CallPlan]] = OrderedDict()
    while True:
        try:
            request = _read(wire_in)
        except (EOFError, OSError):
            return
        if "load" in request:
            key, task, plan = request["load"], request["task"], request["plan"]
            problems[key] = (Task(task["id"], task), CallPlan(tuple(plan["inputs"]), plan["passed"],
                                                                 tuple(plan["classes"]), plan["error"]))
            while len(problems) > WORKER_PROBLEMS:
                problems.popitem(last=False)
            _write(wire_out, {"loaded": key})
            continue
        if "compile" in request:
            _limit_cpu(resource, request.get("cpu_seconds", 1.0))
            try:
                verdict = compiles(request["compile"])
            except Exception:  # anything the compiler raises past the usual errors: not compiled
                verdict = False
            _write(wire_out, {"compiles": verdict})
            continue
        key = request["judge"]
        if key not in problems:
            _write(wire_out, {"need": key})
            continue
        problems.move_to_end(key)
        _limit_cpu(resource, request.get("cpu_seconds", 1.0))
        task, plan = problems[key]
        try:
            status = judge(task, plan, _Run(request["status"], request["channel"]))
        except (NotPlain, MemoryError, RecursionError):
            status = BOUND_STATUS
        except Exception as exc:  # the judge itself failed: never a pass
            status = "sandbox_error:" + type(exc).__name__
        _write(wire_out, {"status": status})


def _limit_cpu(resource: Any, seconds: float) -> None:
    """The kernel's deadline for the next request, in whole seconds: at least twice the host's,
    so the host's (finer) one fires first; it stops this worker even when no host is left to."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(used.ru_utime + used.ru_stime + 2 * seconds) + 1
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
    except (ValueError, OSError):
        pass


class _Run:
    """What the judge reads of a run: its status and its channel."""

    __slots__ = ("status", "channel")

    def __init__(self, status: str, channel: str):
        self.status = status
        self.channel = channel


# ---------------------------------------------------------------------------- the host
def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a live process, from ``/proc/<pid>/stat`` (None if unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime: fields 14, 15
    except (OSError, IndexError, ValueError):
        return None


class _Worker:
    def __init__(self):
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONHASHSEED="random")  # string hashes the program cannot predict
        boot = str(Path(__file__).with_name("judge_worker.py"))  # see there why a script
        self.proc = subprocess.Popen([sys.executable, boot, root, json.dumps(sys.path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        self.to_worker = self.proc.stdin.fileno()
        self.from_worker = self.proc.stdout.fileno()
        self.loaded: set[str] = set()
        self.cpu_used: float | None = None

    def request(self, message: dict, cpu_seconds: float | None, wall_seconds: float) -> dict | None:
        """The reply, or None when the worker went past a deadline or died (it is then dead).

        ``cpu_used`` is then the worker's CPU seconds on this request (None where unreadable).
        """
        start_cpu = _cpu_seconds(self.proc.pid)
        start = time.monotonic()
        reply = None
        try:
            _write(self.to_worker, message)
            waiter = select.poll()  # not select(): a training process may hold fds past 1024
            waiter.register(self.from_worker, select.POLLIN | select.POLLHUP | select.POLLERR)
            while True:
                if waiter.poll(_POLL_SECONDS * 1000):
                    reply = _read(self.from_worker)
                    break
                elapsed = time.monotonic() - start
                if elapsed > wall_seconds:
                    break
                if cpu_seconds is not None:
                    now = _cpu_seconds(self.proc.pid)
                    if now is None or start_cpu is None:
                        if elapsed > cpu_seconds:  # no CPU clock: the wall clock bounds it
                            break
                    elif now - start_cpu > cpu_seconds:
                        break
        except (OSError, EOFError, ValueError):
            pass
        end_cpu = _cpu_seconds(self.proc.pid)
        self.cpu_used = None if start_cpu is None or end_cpu is None else end_cpu - start_cpu
        if reply is None:
            self.kill()
        return reply

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGKILL)
            except OSError:
                pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.proc.wait()


class JudgePool:
    """Judge workers, at most ``size`` at once; each verdict under a CPU-time deadline.

    Args:
        size: most workers (default: the CPUs, at most 4); a verdict waits for a free one.
        cpu_seconds: CPU seconds a worker may spend on one verdict (default
            :data:`JUDGE_CPU_SECONDS`); past that it is killed and the verdict is ``judge:bound``.
        wall_seconds: wall seconds, whatever the CPU clock says.
    """

    def __init__(self, size: int | None = None, cpu_seconds: float = JUDGE_CPU_SECONDS,
                 wall_seconds: float = JUDGE_WALL_SECONDS):
        if cpu_seconds <= 0 or wall_seconds <= 0:
            raise ValueError(f"cpu_seconds and wall_seconds must be positive, got {cpu_seconds}, {wall_seconds}")
        self.size = size or max(1, min(4, os.cpu_count() or 1))
        self.cpu_seconds = cpu_seconds
        self.wall_seconds = wall_seconds
        self._idle: list[_Worker] = []
        self._count = 0
        self._closed = False
        self._cond = threading.Condition()
        self._keys: dict[tuple[int, int], tuple[Any, Any, str, dict]] = {}
        #: workers killed at a deadline or found dead (for tests and reports)
        self.killed = 0

    # -------------------------------------------------------------- workers
    def _take(self) -> _Worker:
        with self._cond:
            while not self._idle and self._count >= self.size:
                self._cond.wait()
            if self._closed:
                raise RuntimeError("JudgePool is closed")
            if self._idle:
                return self._idle.pop()
            self._count += 1
        try:
            return _Worker()
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def _give(self, worker: _Worker) -> None:
        with self._cond:
            if worker.alive and not self._closed:
                self._idle.append(worker)
            else:
                if worker.alive:
                    worker.kill()
                self._count -= 1
            self._cond.notify()

    def _problem(self, task: Task, plan: CallPlan) -> tuple[str, dict]:
        """A key for (task, plan), and the load request, made once per pair of objects."""
        entry = self._keys.get((id(task), id(plan)))
        if entry is None or entry[0] is not task or entry[1] is not plan:
            fields = {"id": task.id, "prompt": task["prompt"], "test": task["test"],
                      "entry_point": task["entry_point"]}
            plan_fields = {"inputs": list(plan.inputs), "passed": plan.passed,
                           "classes": list(plan.classes), "error": plan.error}
            digest = hashlib.sha256(json.dumps([fields, plan_fields]).encode("utf-8", "replace"))
            key = digest.hexdigest()
            entry = (task, plan, key, {"load": key, "task": fields, "plan": plan_fields})
            with self._cond:  # holds both objects, so their ids are not reused
                self._keys[(id(task), id(plan))] = entry
        return entry[2], entry[3]

    # -------------------------------------------------------------- verdicts
    def judge(self, task: Task, plan: CallPlan, result: RunResult) -> str:
        """:func:`corrgrpo_envs.code.judge.judge` in a worker; ``judge:bound`` past the deadline."""
        return self.judge_with_cost(task, plan, result)[0]

    def judge_with_cost(self, task: Task, plan: CallPlan, result: RunResult) -> tuple[str, float | None]:
        """``(status, worker CPU seconds)`` of one verdict (the seconds None where unreadable)."""
        key, load = self._problem(task, plan)
        request = {"judge": key, "status": result.status, "channel": result.channel,
                   "cpu_seconds": self.cpu_seconds}
        worker = self._take()
        cost: float | None = 0.0
        try:
            for _ in range(2):
                if key not in worker.loaded:
                    reply = worker.request(load, None, self.wall_seconds)
                    if reply is None:
                        break
                    worker.loaded.add(key)
                reply = worker.request(request, self.cpu_seconds, self.wall_seconds)
                cost = None if cost is None or worker.cpu_used is None else cost + worker.cpu_used
                if reply is None:
                    break
                if "need" in reply:  # the worker dropped the problem to make room
                    worker.loaded.discard(key)
                    continue
                return str(reply.get("status", BOUND_STATUS)), cost
            with self._cond:
                self.killed += 1
            return BOUND_STATUS, cost
        finally:
            self._give(worker)

    def compiles(self, program: str, cpu_seconds: float = COMPILE_CPU_SECONDS) -> tuple[bool | None, float | None]:
        """``(compiles, worker CPU seconds)``: :func:`corrgrpo_envs.code.rewards.compiles` of
        ``program`` in a worker; ``None`` in place of the verdict when compiling went past
        ``cpu_seconds`` of CPU (or the worker died), the seconds ``None`` where unreadable."""
        worker = self._take()
        try:
            reply = worker.request({"compile": program, "cpu_seconds": cpu_seconds}, cpu_seconds,
                                   self.wall_seconds)
            if reply is None:
                with self._cond:
                    self.killed += 1
                return None, worker.cpu_used
            return bool(reply.get("compiles")), worker.cpu_used
        finally:
            self._give(worker)

    def close(self) -> None:
        """Stop every idle worker (busy ones stop when their verdict returns)."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            self._cond.notify_all()
        for worker in idle:
            worker.kill()

    def __enter__(self) -> JudgePool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_SHARED_LOCK = threading.Lock()
_SHARED: dict[tuple[int, float], JudgePool] = {}


def shared_pool(cpu_seconds: float = JUDGE_CPU_SECONDS) -> JudgePool:
    """This process's pool for ``cpu_seconds`` (made on first use; closed at exit)."""
    key = (os.getpid(), float(cpu_seconds))
    with _SHARED_LOCK:
        pool = _SHARED.get(key)
        if pool is None:
            pool = _SHARED[key] = JudgePool(cpu_seconds=cpu_seconds)
        return pool


@atexit.register
def _close_shared() -> None:
    for pool in list(_SHARED.values()):
        pool.close()
