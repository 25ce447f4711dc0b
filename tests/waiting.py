"""Waiting for a condition instead of sleeping for a guessed time.

A test that sleeps "long enough" for another thread, process or server to get somewhere passes
on a quiet machine and fails on a loaded one, where "long enough" is longer. Polling the
condition itself with a generous deadline waits only as long as it has to, and fails with a
message naming what never happened.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.05,
               message: str = "") -> T:
    """``predicate()``'s first truthy result, polled every ``interval`` seconds.

    Raises ``AssertionError`` (a test failure, with ``message`` and the last result) when
    ``timeout`` seconds pass first. The predicate is tried once more at the deadline, so a slow
    poll on a loaded machine cannot fail a condition that became true meanwhile.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            result = predicate()
            if result:
                return result
            what = message or repr(predicate)
            raise AssertionError(f"not true within {timeout:g} s: {what} (last: {result!r})")
        time.sleep(interval)
