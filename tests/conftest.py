"""Suite-wide settings: hypothesis draws the same examples on every run.

A property test that found a new counterexample on each CI run would make the suite's
verdict depend on chance; ``derandomize`` seeds each test's draws from the test itself.
To search afresh while working on the math: ``HYPOTHESIS_PROFILE=explore pytest ...``.
Neither profile has a per-example deadline (hypothesis's default is 200 ms of wall time,
which a loaded 2-core machine breaks); the per-test timeout catches a hang instead.

Under pytest-xdist each worker takes its share of the cores (one each for two workers on
two cores), for torch in the worker and, through ``OMP_NUM_THREADS``, for the programs
its tests start; the collection starts with the files that took longest
(tests/file_costs.py), so no long file is left for one worker at the end. Torch's default, a thread per core in every process, makes OpenMP threads
wait for cores the other worker holds: a 2-task greedy evaluation of SmolLM2 took 118 s
instead of 12 beside one busy process.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from tests.file_costs import load, longest_first

THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _share_cores_between_workers() -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 2:
        return
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    share = str(max(1, cores // workers))
    for var in THREAD_ENV_VARS:
        os.environ.setdefault(var, share)  # a user's own setting wins
    import torch

    first = os.environ["OMP_NUM_THREADS"].split(",")[0].strip()
    torch.set_num_threads(int(first) if first.isdigit() and int(first) > 0 else int(share))


_share_cores_between_workers()

settings.register_profile("deterministic", derandomize=True, database=None, deadline=None)
settings.register_profile("explore", derandomize=False, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


def pytest_collection_modifyitems(config, items) -> None:
    """Longest files first (tests/file_costs.json); each file's own order kept."""
    order = longest_first([item.nodeid for item in items], load())
    items[:] = [items[i] for i in order]


@pytest.fixture
def probe_budget(monkeypatch) -> float:
    """The judge probes' budget of host CPU per step, made of the judge worker's CPU deadline
    (a behaviour: overshooting it by the deadline itself is generous) and this process's share
    counted in units measured now. The probes' own budget (1 s, what the red team reports) is
    absolute; the worker alone may take half of it, so a loaded machine could break it (a
    docker step measured 1.07 s on a busy CI machine)."""
    from cpu_budget import CpuBudget
    from step_checks import VERDICT_HOST_UNITS

    from corrgrpo_envs.code import judge_probes
    from corrgrpo_envs.code.judge_pool import JUDGE_CPU_SECONDS

    host = CpuBudget(VERDICT_HOST_UNITS, "a probe's step, this process's share")
    seconds = 2 * JUDGE_CPU_SECONDS + host.seconds
    monkeypatch.setattr(judge_probes, "HOST_CPU_BUDGET", seconds)
    return seconds
