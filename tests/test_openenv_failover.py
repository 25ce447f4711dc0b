"""An episode's move to another server, alone: a fault marks its server down and replays the
episode on the next one; an answer is not a fault; the retries end with one error naming every
server tried (a real server pool, the connections a recording stand-in)."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("openenv", reason="the openenv extra is not installed (pip install -e '.[openenv]')")

from corrgrpo_envs.integrations.openenv_failover import _Failover, _is_fault  # noqa: E402
from corrgrpo_envs.integrations.openenv_pool import _ServerPool  # noqa: E402
from corrgrpo_envs.integrations.openenv_remote import (  # noqa: E402
    RemoteEnvError,
    RemoteRewardError,
    _BadAnswer,
)

A, B, C = "http://a:1", "http://b:1", "http://c:1"
LOGGER = "corrgrpo_envs.integrations.openenv_client"


class _Conns:
    """What the failover needs of the connections: the cap (for its messages) and ``drop``."""

    max_observation_bytes = 4096

    def __init__(self) -> None:
        self.dropped: list[str] = []

    def drop(self, url: str) -> None:
        self.dropped.append(url)


def _failover(urls=(A, B, C), retries: int = 2) -> _Failover:
    return _Failover(list(urls), _ServerPool(urls), _Conns(), retries, down_s=3600.0)


def _failing(*down: str, error=ConnectionResetError("reset by peer")):
    calls: list[str] = []

    def fn(url: str) -> str:
        calls.append(url)
        if url in down:
            raise error
        return f"answered by {url}"

    return fn, calls


def test_an_episode_starts_on_its_groups_server_with_its_reset_arguments():
    first, second = _failover(), _failover()
    second.pool = first.pool  # two envs of one list
    assert first.begin("t1", {"task_id": "t1"}) == A and first.reset_args == {"task_id": "t1"}
    assert second.begin("t1", {"task_id": "t1"}) == A  # the G rollouts of a task share a server
    first.history.append(("hello", {"a": 1.0}))
    assert first.begin("t2", {"seed": 2}) == B  # the next episode: t1's slot given back, history cleared
    assert first.history == [] and first.pool.active == {A: 1, B: 1}
    first.release()
    first.release()  # idempotent
    assert first.server is None and first.pool.active[B] == 0


def test_an_episode_starts_even_when_every_server_is_marked_down():
    failover = _failover()
    for url in (A, B, C):
        failover.pool.mark_down(url, 3600.0)
    assert failover.begin("t1", {}) == A  # the marks are cleared: tried again, not failed at once
    assert failover.pool.down_until == {}


def test_a_fault_moves_the_episode_to_the_next_server_and_replays_it_there(caplog):
    failover = _failover()
    failover.begin("t1", {"task_id": "t1"})
    fn, calls = _failing(A)
    replayed: list[str] = []
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert failover.run("step", fn, replayed.append) == f"answered by {B}"
    assert calls == [A, B] and replayed == [B] and failover.server == B
    assert failover.conns.dropped == [A] and failover.pool.is_down(A)
    assert failover.pool.active == {A: 0, B: 1} and failover.pool.task_server == {"t1": B}
    assert [r.getMessage() for r in caplog.records] == [
        f"OpenEnv server {A} failed during step of task t1 (ConnectionResetError: reset by peer); "
        f"replaying the episode on {B}"]


def test_a_reset_is_simply_sent_again_without_a_replay():
    failover = _failover()
    failover.begin("t1", {})
    fn, calls = _failing(A, error=_BadAnswer("an answer that is not JSON"))
    replayed: list[str] = []
    assert failover.run("reset", fn) == f"answered by {B}"
    assert calls == [A, B] and replayed == []


def test_a_failed_replay_counts_as_that_servers_fault():
    failover = _failover()
    failover.begin("t1", {})
    fn, calls = _failing(A)

    def replay(url: str) -> None:
        if url == B:
            raise TimeoutError("no answer within 1 s")

    assert failover.run("step", fn, replay) == f"answered by {C}"
    assert calls == [A, C] and failover.conns.dropped == [A, B]


def test_the_retries_end_with_one_error_naming_every_server_tried():
    failover = _failover(retries=1)
    failover.begin("t1", {})
    fn, calls = _failing(A, B, C)
    with pytest.raises(RemoteEnvError, match=r"^task t1, step: OpenEnv server\(s\) failed: "
                                             r"http://a:1 \(ConnectionResetError: reset by peer\); "
                                             r"http://b:1 \(ConnectionResetError: reset by peer\)$") as caught:
        failover.run("step", fn, lambda url: None)
    assert type(caught.value) is RemoteEnvError and calls == [A, B] and failover.server is None
    assert failover.pool.active == {A: 0, B: 0}


def test_a_server_marked_down_by_another_episode_is_still_tried_before_giving_up():
    failover = _failover(urls=(A, B))
    failover.begin("t1", {})
    failover.pool.mark_down(B, 3600.0)  # another episode's verdict on B
    fn, calls = _failing(A)
    assert failover.run("step", fn, lambda url: None) == f"answered by {B}"


def test_an_answer_from_the_server_is_not_a_fault():
    failover = _failover()
    failover.begin("t1", {})
    fn, calls = _failing(A, error=RemoteEnvError("OpenEnv server http://a:1, task t1, step: unknown task"))
    with pytest.raises(RemoteEnvError, match="unknown task"):
        failover.run("step", fn, lambda url: None)
    assert calls == [A] and failover.conns.dropped == [] and failover.server == A
    fn, calls = _failing(A, error=KeyError("a bug of ours"))
    with pytest.raises(KeyError):
        failover.run("step", fn, lambda url: None)
    assert calls == [A] and failover.server == A


def test_lying_rewards_are_routed_around_and_only_lies_end_as_a_reward_error():
    failover = _failover(retries=2)
    failover.begin("t1", {})
    lie = RemoteRewardError("OpenEnv server x, task t1: component 'a' is nan", "component 'a' is nan")
    fn, calls = _failing(A, error=lie)
    assert failover.run("step", fn, lambda url: None) == f"answered by {B}"
    fn, calls = _failing(A, B, C, error=lie)
    with pytest.raises(RemoteRewardError, match=r"http://b:1 \(component 'a' is nan\); http://c:1 \(component"):
        failover.run("step", fn, lambda url: None)


def test_a_lie_with_nowhere_else_to_go_keeps_its_own_message():
    lie = RemoteRewardError("OpenEnv server x, task t1: component 'a' is nan; set env.reward_names", "nan")
    for failover in (_failover(urls=(A,)), _failover(retries=0)):
        failover.begin("t1", {})
        fn, _ = _failing(A, error=lie)
        with pytest.raises(RemoteRewardError) as caught:
            failover.run("step", fn, lambda url: None)
        assert caught.value is lie and failover.server == A and not failover.pool.is_down(A)


def test_faults_are_transport_failures_and_unparsed_answers_not_answers():
    from websockets.exceptions import ConnectionClosedError

    for fault in (ConnectionResetError(), TimeoutError(), EOFError(), _BadAnswer("x"),
                  ConnectionClosedError(None, None), RuntimeError("the loop is gone")):
        assert _is_fault(fault), fault
    for answer in (RemoteEnvError("unknown task"), KeyError("x"), ValueError("x")):
        assert not _is_fault(answer), answer
