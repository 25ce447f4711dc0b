"""The trainer's torch thread rule: its share of the cores minus busy worker processes."""

from __future__ import annotations

import os

import pytest
import torch

from corrgrpo.trainer.threads import (
    THREAD_ENV_VARS,
    auto_torch_threads,
    configure_threads,
    running_elsewhere,
    worker_env,
)
from tests.waiting import wait_until


@pytest.mark.parametrize(
    "cores,local,workers,executor,want",
    [
        (2, 1, 1, "thread", 2),   # reward threads run while torch does not
        (2, 1, 1, "process", 1),  # one worker process: one core left
        (2, 1, 4, "process", 1),  # never below 1
        (16, 2, 3, "process", 5),  # 8 cores per trainer process, 3 busy workers
        (16, 8, 0, "thread", 2),
        (1, 4, 0, "thread", 1),
    ],
)
def test_auto_threads(cores, local, workers, executor, want):
    assert auto_torch_threads(workers, executor, cores=cores, local_processes=local, running=0) == want


@pytest.mark.parametrize("cores, running, want", [(2, 0, 2), (2, 1, 1), (2, 9, 1), (16, 3, 13), (16, 12, 4)])
def test_auto_threads_leave_the_cores_other_running_work_holds(cores, running, want):
    assert auto_torch_threads(cores=cores, local_processes=1, running=running) == want


def test_running_elsewhere_counts_a_busy_neighbour():
    import subprocess
    import sys

    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat here")
    quiet = running_elsewhere()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        # in their loops, not still starting (a start-up may wait on the disk, not runnable):
        # each has spent more CPU than an interpreter's start-up, however long that took here
        wait_until(lambda: all(_cpu_seconds(p.pid) >= 0.15 for p in spinners), timeout=60,
                   message="both spinners running their loops")
        busy = running_elsewhere(samples=9)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    # two spinning processes are runnable at every reading, whatever else the machine runs
    assert busy >= 2, (quiet, busy)


def _cpu_seconds(pid: int) -> float:
    """A process's user and system CPU time, from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_configure_threads_sets_torch_and_worker_env(monkeypatch):
    before = torch.get_num_threads()
    # a copy of the environment without the thread variables (restored after the test)
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in THREAD_ENV_VARS})
    try:
        assert configure_threads(1, reward_workers=2, reward_executor="process") == 1
        assert torch.get_num_threads() == 1
        assert {v: os.environ[v] for v in THREAD_ENV_VARS} == worker_env(1)
        with pytest.raises(ValueError, match="rollout.torch_threads"):
            configure_threads(0)
    finally:
        torch.set_num_threads(before)



def test_omp_num_threads_is_the_users_choice_unless_the_config_gives_one(monkeypatch):
    from corrgrpo.trainer.threads import choose_threads, threads_from_environment

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads_from_environment() == 3
    assert choose_threads(None) == (3, "OMP_NUM_THREADS")
    assert choose_threads(2) == (2, "config")
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")  # OpenMP's nested form: the outer count
    assert choose_threads(None) == (4, "OMP_NUM_THREADS")
    monkeypatch.setattr("corrgrpo.trainer.threads.running_elsewhere", lambda: 0)  # the same load for both calls
    for unusable in ("", "0", "many"):
        monkeypatch.setenv("OMP_NUM_THREADS", unusable)
        assert choose_threads(None) == (auto_torch_threads(), "automatic"), unusable
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert choose_threads(None, 1, "process") == (auto_torch_threads(1, "process"), "automatic")


def test_the_variable_exported_for_worker_processes_is_not_read_back_as_the_users(monkeypatch):
    from corrgrpo.trainer.threads import choose_threads

    before = torch.get_num_threads()
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in THREAD_ENV_VARS})
    try:
        configure_threads(None, reward_workers=1, reward_executor="process")
        assert os.environ["OMP_NUM_THREADS"] == "1"  # for the worker processes
        assert choose_threads(None)[1] == "automatic"
    finally:
        torch.set_num_threads(before)
