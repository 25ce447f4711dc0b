"""tests.waiting.wait_until: returns the condition's value once true, fails naming it when not."""

from __future__ import annotations

import threading

import pytest

from tests.waiting import wait_until


def test_returns_the_first_truthy_value_without_waiting_more():
    calls = []

    def third_time() -> int:
        calls.append(1)
        return 7 if len(calls) == 3 else 0

    assert wait_until(third_time, timeout=30, interval=0) == 7
    assert len(calls) == 3


def test_waits_for_another_thread():
    done = threading.Event()
    threading.Timer(0.05, done.set).start()
    assert wait_until(done.is_set, timeout=30, interval=0.01) is True


def test_fails_at_the_deadline_with_the_message_and_the_last_value():
    with pytest.raises(AssertionError, match=r"not true within 0.01 s: the door opened \(last: \[\]\)"):
        wait_until(list, timeout=0.01, interval=0.001, message="the door opened")


def test_a_condition_that_turns_true_during_the_last_interval_is_seen():
    # the interval outlasts the deadline: the check at the deadline still sees the flip
    flips = iter([False, True])
    assert wait_until(lambda: next(flips), timeout=0.01, interval=0.05) is True
