"""CPU-cost bounds counted in a unit of reference work measured in the same process.

A test that guards against an attack ("a hostile action must not cost the host more than a
step's worth of CPU") needs a bound, but an absolute one in seconds holds only on the
machine it was tuned on: a slower CPU, or a busy 2-core CI machine whose other jobs thrash
the caches and share the cores' pipelines, makes the same work cost more. The unit here is
the least CPU time of a fixed piece of pure-Python work (building, joining, splitting and
sorting strings, much like a parser's), measured in this process just before the check, so
what slows the work under test slows the unit too, and a bound of ``units`` holds on any
machine. A real attack (quadratic or exponential work on a 200,000-character action) costs
hundreds to millions of units, far past any bound here.

``python tests/cpu_budget.py`` prints this machine's unit.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: Strings built, joined, split and sorted by one run of the reference work (about 11 ms
#: of CPU on a 2-core x86-64 machine, idle or busy).
REFERENCE_ITEMS = 20_000


def _reference_work() -> None:
    words = [f"w{i * 7919 % REFERENCE_ITEMS}" for i in range(REFERENCE_ITEMS)]
    text = " ".join(words)
    sorted(text.split())


def least_cpu_seconds(prepare: Callable[[], Any], call: Callable[[], T], tries: int = 3,
                      enough: float = 0.0) -> tuple[T, float]:
    """``call()``'s result and its least CPU time over up to ``tries`` runs (``prepare()`` before each).

    CPU time of this process (``time.process_time``): time spent waiting for a core on a busy
    machine is not counted. The garbage collector is off inside the window (as ``timeit``
    does): a full collection of the test process's heap, left pending by earlier tests, costs
    up to a second and is not the cost of the call timed. Collecting before each try instead
    cost the suite minutes, since a test worker's heap holds millions of objects. Stops early
    once a try takes at most ``enough`` seconds.
    """
    best = float("inf")
    out: Any = None
    for _ in range(tries):
        prepare()
        out, seconds = cpu_seconds(call)
        best = min(best, seconds)
        if best <= enough:
            break
    return out, best


def cpu_seconds(call: Callable[[], T]) -> tuple[T, float]:
    """``call()``'s result and the CPU seconds it took in this process, with the collector off."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.process_time()
        out = call()
        return out, time.process_time() - start
    finally:
        if was_enabled:
            gc.enable()


def unit_seconds(tries: int = 5) -> float:
    """The least CPU time of the reference work over ``tries`` runs, in seconds (never 0)."""
    _, best = least_cpu_seconds(lambda: None, _reference_work, tries=tries)
    return max(best, 1e-4)


class CpuBudget:
    """At most ``units`` units of reference work, the unit measured when this is made.

    Make one in the test, just before the work it bounds (or once per module for a property
    test that checks many examples), and compare with :meth:`allows` or :meth:`check`.
    """

    def __init__(self, units: float, what: str = "") -> None:
        self.units = float(units)
        self.what = what
        self.unit_s = unit_seconds()

    @property
    def seconds(self) -> float:
        """The budget in seconds on this machine now."""
        return self.units * self.unit_s

    def allows(self, seconds: float) -> bool:
        """Whether ``seconds`` of CPU is within the budget."""
        return seconds <= self.seconds

    def in_units(self, seconds: float) -> float:
        """``seconds`` of CPU counted in units of reference work."""
        return seconds / self.unit_s

    def describe(self, seconds: float) -> str:
        """``seconds`` and the budget, in seconds and in units, for an assertion message."""
        return (f"{self.what}: {seconds:.4f} s of CPU = {self.in_units(seconds):.1f} units, budget "
                f"{self.units:g} units = {self.seconds:.4f} s (unit {self.unit_s * 1000:.2f} ms)")

    def check(self, seconds: float) -> None:
        """Fail the test when ``seconds`` of CPU is over the budget."""
        assert self.allows(seconds), self.describe(seconds)


if __name__ == "__main__":
    print(f"unit of reference work: {unit_seconds(tries=20) * 1000:.2f} ms of CPU")
