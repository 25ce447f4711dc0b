"""Busy neighbour processes for the benchmarks that measure under contention."""

from __future__ import annotations

import subprocess
import sys
import time

__all__ = ["BusyProcesses"]


class BusyProcesses:
    """``count`` busy processes for the length of a ``with`` block: a pure-Python spin loop each,
    what a reward worker running a program (or another job) looks like to the scheduler.

    ``settle_s``: how long to wait on entry for them to take their cores (none when ``count`` is 0).
    """

    def __init__(self, count: int, settle_s: float = 0.0):
        self.count = count
        self.settle_s = settle_s
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> BusyProcesses:
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.count)]
        if self.count:
            time.sleep(self.settle_s)
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
