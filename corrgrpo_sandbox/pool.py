"""Run many programs in parallel over one sandbox.

Each program is its own process, so threads that wait on subprocesses are
enough to keep every core busy; the pool only bounds how many run at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from corrgrpo_sandbox.base import Sandbox
from corrgrpo_sandbox.types import Limits, RunResult

__all__ = ["SandboxPool", "default_workers"]


def default_workers() -> int:
    """One program per available CPU."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


class SandboxPool:
    """Runs programs through ``sandbox`` with up to ``workers`` at once.

    Example::

        with SandboxPool(make_sandbox("auto"), workers=8) as pool:
            results = pool.run_many(programs)
    """

    def __init__(self, sandbox: Sandbox, workers: int | None = None):
        workers = default_workers() if workers is None else int(workers)
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.sandbox = sandbox
        self.workers = workers
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox")

    def run_many(self, programs: Sequence[str], limits: Limits | None = None,
                 on_result: Callable[[int, RunResult], None] | None = None) -> list[RunResult]:
        """Run every program; results in input order. ``on_result(i, result)`` as each ends."""
        def one(i: int, program: str) -> RunResult:
            result = self.sandbox.run(program, limits)
            if on_result is not None:
                on_result(i, result)
            return result

        futures = [self._executor.submit(one, i, p) for i, p in enumerate(programs)]
        return [f.result() for f in futures]

    def map(self, fn: Callable, items: Iterable) -> list:
        """Apply ``fn`` to every item on the pool's threads (for callers that wrap ``run``)."""
        return list(self._executor.map(fn, items))

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
