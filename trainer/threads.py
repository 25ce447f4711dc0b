"""Torch thread counts chosen against the other work that shares the cores.

OpenMP threads that find their cores taken spin and wait for each other: on 2 cores
with one other busy process, a 2-thread ``compute_advantages`` call on 8192 x 7
rewards takes tens of times longer than a 1-thread call (``bench/threads.py``).
So a trainer process takes the cores it can count on, not all of them:

    threads = min(cores available to this process // trainer processes on this node
                  - reward worker processes,
                  cores available - processes running other work right now),   at least 1

"Running other work right now" is the kernel's count of runnable tasks (``procs_running``
in ``/proc/stat``, the median of a few samples over 0.1 s) less this process's own: a
compile, another training run or a test suite on the same machine takes its cores first.
The count is taken once, when the trainer starts; load that comes later is not seen.

Reward workers in threads of the same process compute while torch does not (a step
generates, then scores), so only process workers count. They are idle during most of
the torch work too, but not always (sandboxed programs that run to their time limit,
AgentDojo checks), and the two costs are lopsided: one thread fewer costs at most a
factor 2 on 2 cores, threads fighting for a taken core cost tens. A user's
``OMP_NUM_THREADS`` (the variable torch, TRL and every OpenMP program honour) overrides the
rule; ``rollout.torch_threads`` (or SFT's ``train.torch_threads``) overrides both. Worker processes get
one OpenMP/MKL thread each through their environment (``worker_env``): numpy or torch
in a worker otherwise starts one thread per core.
"""

from __future__ import annotations

import os
import statistics
import time

__all__ = [
    "available_cores",
    "auto_torch_threads",
    "running_elsewhere",
    "choose_threads",
    "configure_threads",
    "apply_threads",
    "threads_from_environment",
    "worker_env",
    "THREAD_ENV_VARS",
]

#: The thread variables :func:`configure_threads` exported itself (for its worker processes).
_EXPORTED: dict[str, str] = {}

#: Environment variables that size the thread pools of OpenMP, MKL and OpenBLAS.
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def running_elsewhere(samples: int = 5, interval_s: float = 0.02) -> int:
    """Tasks running or waiting for a core besides the caller: the median over ``samples``
    readings of the kernel's ``procs_running`` (``/proc/stat``), less one for the reading
    thread itself; 0 where there is no ``/proc/stat``."""
    readings = []
    for i in range(samples):
        try:
            with open("/proc/stat", "rb") as f:
                line = next((ln for ln in f if ln.startswith(b"procs_running ")), b"")
        except OSError:
            return 0
        if not line:
            return 0
        readings.append(int(line.split()[1]))
        if i + 1 < samples:
            time.sleep(interval_s)
    return max(0, int(statistics.median(readings)) - 1)


def auto_torch_threads(
    reward_workers: int = 0,
    reward_executor: str = "thread",
    *,
    cores: int | None = None,
    local_processes: int | None = None,
    running: int | None = None,
) -> int:
    """Torch threads for one trainer process: its share of the cores minus busy worker processes,
    and no more than the cores that other running work leaves free.

    Args:
        reward_workers: reward workers of this process.
        reward_executor: ``"thread"`` (they do not compete with torch) or ``"process"``.
        cores: cores to share (default: this process's affinity).
        local_processes: trainer processes on this node (default: ``LOCAL_WORLD_SIZE`` or 1).
        running: tasks running besides this one (default: :func:`running_elsewhere`).
    """
    cores = available_cores() if cores is None else cores
    if local_processes is None:
        local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    share = cores // max(1, local_processes)
    busy = reward_workers if reward_executor == "process" else 0
    running = running_elsewhere() if running is None else running
    return max(1, min(share - busy, cores - running))


def threads_from_environment() -> int | None:
    """The thread count ``OMP_NUM_THREADS`` asks for, or None when it is unset or not a positive integer.

    OpenMP also accepts a list (``4,2`` for nested levels); its first entry is the outer count.
    """
    raw = os.environ.get("OMP_NUM_THREADS", "")
    if raw and raw == _EXPORTED.get("OMP_NUM_THREADS"):
        return None  # exported by configure_threads for worker processes, not the user's choice
    value = raw.split(",")[0].strip()
    try:
        threads = int(value)
    except ValueError:
        return None
    return threads if threads >= 1 else None


def worker_env(threads: int = 1) -> dict[str, str]:
    """Thread-count variables for worker processes (OpenMP, MKL, OpenBLAS)."""
    return {var: str(threads) for var in THREAD_ENV_VARS}


def choose_threads(
    requested: int | None,
    reward_workers: int = 0,
    reward_executor: str = "thread",
) -> tuple[int, str]:
    """The torch thread count and where it came from (``config``, ``OMP_NUM_THREADS`` or ``automatic``)."""
    if requested is not None:
        return int(requested), "config"
    from_env = threads_from_environment()
    if from_env is not None:
        return from_env, "OMP_NUM_THREADS"
    return auto_torch_threads(reward_workers, reward_executor), "automatic"


def configure_threads(
    requested: int | None,
    reward_workers: int = 0,
    reward_executor: str = "thread",
) -> int:
    """Set torch's intra-op threads (see :func:`apply_threads`); returns the thread count set."""
    return apply_threads(requested, reward_workers, reward_executor)[0]


def apply_threads(
    requested: int | None,
    reward_workers: int = 0,
    reward_executor: str = "thread",
) -> tuple[int, str]:
    """Set torch's intra-op threads: ``requested``, else ``OMP_NUM_THREADS``, else :func:`auto_torch_threads`.

    Also exports one thread per OpenMP/MKL pool for worker processes started later
    (unless the variables are already set), so reward workers do not oversubscribe the
    cores. Returns the thread count set and where it came from (as :func:`choose_threads`):
    the automatic count reads the machine's load, so asking twice may give two answers.

    Raises:
        ValueError: ``requested`` is below 1.
    """
    import torch

    if requested is not None and requested < 1:
        raise ValueError(f"rollout.torch_threads: must be >= 1, got {requested}")
    threads, source = choose_threads(requested, reward_workers, reward_executor)
    torch.set_num_threads(threads)
    if reward_executor == "process":
        for var, value in worker_env(1).items():
            if var not in os.environ:
                os.environ[var] = _EXPORTED[var] = value
    return threads, source
