"""The OpenEnv client's connections and server pool, alone: an episode's server placement, the
pool's lifetime, and the deadline and size cap of every exchange (no server: fakes in-process)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("openenv", reason="the openenv extra is not installed (pip install -e '.[openenv]')")

import httpx  # noqa: E402

from corrgrpo_envs.integrations.deadline_loop import GRACE_S, LoopLease  # noqa: E402
from corrgrpo_envs.integrations.openenv_pool import (  # noqa: E402
    _POOLS,
    _Connections,
    _PoolLease,
    _ServerPool,
)
from corrgrpo_envs.integrations.openenv_remote import TOKEN_ENV, RemoteEnvError, _BadAnswer  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

A, B, C = "http://a:1", "http://b:1", "http://c:1"
#: Beyond a configured deadline, how long a test waits for the call to end (a loaded machine).
SLACK_S = 15.0


# ------------------------------------------------------------------ _ServerPool
def test_a_group_shares_its_server_and_new_groups_go_to_the_least_busy():
    pool = _ServerPool([A, B, C])
    assert [pool.acquire("t1") for _ in range(3)] == [A, A, A]  # the G rollouts of a task
    assert pool.acquire("t2") == B and pool.acquire("t3") == C  # groups spread
    assert pool.acquire("t4") == B  # B and C hold one each, A three: the first of the least busy
    assert pool.active == {A: 3, B: 2, C: 1}


def test_a_released_group_forgets_its_server():
    pool = _ServerPool([A, B])
    pool.acquire("t")
    pool.acquire("t")
    pool.release(A, "t")
    assert pool.task_server == {"t": A} and pool.task_count["t"] == 1
    pool.release(A, "t")
    assert pool.task_server == {} and "t" not in pool.task_count and pool.active[A] == 0


def test_servers_marked_down_are_left_out_until_their_time_is_up():
    pool = _ServerPool([A, B])
    pool.mark_down(A, 3600.0)
    assert pool.is_down(A) and not pool.is_down(B)
    assert pool.acquire("t") == B
    assert pool.acquire("u", exclude=[B]) is None  # only A is left, and it is down
    assert pool.acquire("u", exclude=[B], include_down=True) == A
    pool.mark_down(A, 0.0)  # its time is up at once
    assert not pool.is_down(A)


def test_a_groups_server_that_went_down_is_replaced():
    pool = _ServerPool([A, B])
    assert pool.acquire("t") == A
    pool.mark_down(A, 3600.0)
    assert pool.acquire("t") == B and pool.task_server["t"] == B


# ------------------------------------------------------------------ _PoolLease
def test_envs_of_one_server_list_share_a_pool_until_the_last_lets_go():
    urls = ["http://lease-test:1", "http://lease-test:2"]
    first, second = _PoolLease(urls), _PoolLease(urls)
    assert first.pool is second.pool and first.pool.users == 2
    assert _PoolLease(urls[:1]).pool is not first.pool  # another list, another pool
    first.release()
    first.release()  # idempotent: the other env's use is not given up twice
    assert _POOLS[tuple(urls)] is second.pool and second.pool.users == 1
    second.pool.described[(urls[0], "all")] = {"env_name": "old"}
    second.release()
    assert tuple(urls) not in _POOLS
    third = _PoolLease(urls)  # a later server on the same address is described afresh
    assert third.pool.described == {}
    third.release()


# ------------------------------------------------------------------ _Connections
@pytest.fixture
def loop():
    lease = LoopLease()
    yield lease.loop
    lease.release()


def _conns(loop, **kwargs) -> _Connections:
    settings = dict(headers=None, timeout_s=5.0, connect_timeout_s=2.0, max_observation_bytes=4096)
    settings.update(kwargs)
    return _Connections(loop, **settings)


def _fetch(conns: _Connections, handler, method: str = "GET", body=None):
    """``conns.fetch`` against an in-process HTTP handler (``httpx.MockTransport``)."""

    async def run():
        conns.http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        try:
            return await conns.fetch(method, "http://server/route", body)
        finally:
            await conns.http.aclose()

    return asyncio.run(run())


def test_fetch_reads_json_and_gives_an_error_status_its_text(loop):
    conns = _conns(loop)
    assert _fetch(conns, lambda r: httpx.Response(200, json={"tasks": [1]})) == (200, {"tasks": [1]})
    assert _fetch(conns, lambda r: httpx.Response(404, text="no such route " * 40)) == (
        404, ("no such route " * 40)[:200])
    with pytest.raises(_BadAnswer, match="an answer that is not JSON"):
        _fetch(conns, lambda r: httpx.Response(200, text="<html>"))


def test_fetch_refuses_an_answer_over_the_cap_declared_or_streamed(loop):
    conns = _conns(loop, max_observation_bytes=4096)
    declared = lambda r: httpx.Response(200, content=b"x" * 5000)  # noqa: E731 - Content-Length: 5000
    with pytest.raises(_BadAnswer, match=r"an answer of 5000 bytes, over env.max_observation_bytes \(4096\)"):
        _fetch(conns, declared)
    sent = []

    async def endless():
        while True:
            sent.append(1)
            yield b"x" * 1024

    streamed = lambda r: httpx.Response(200, content=endless())  # noqa: E731 - no length declared
    with pytest.raises(_BadAnswer, match=r"larger than env.max_observation_bytes \(4096 bytes\)"):
        _fetch(conns, streamed)
    assert len(sent) == 5  # read no further than the first chunk past the cap


def test_the_http_client_sends_the_token_and_asks_for_no_compression(loop):
    conns = _conns(loop, headers={"Authorization": "Bearer t"})

    async def headers():
        client = conns.http_client()
        try:
            return dict(client.headers), client.timeout.read
        finally:
            await client.aclose()

    sent, per_read = asyncio.run(headers())
    assert sent["authorization"] == "Bearer t" and sent["accept-encoding"] == "identity"
    assert per_read == 5.0  # a backstop, the larger of the two deadlines


class _Session:
    """A stand-in for OpenEnv's ``GenericEnvClient``: records its settings, connects and closes."""

    made: list[_Session] = []

    def __init__(self, **settings):
        self.settings, self.closed = settings, False
        _Session.made.append(self)

    async def connect(self):
        pass

    async def close(self):
        self.closed = True


@pytest.fixture
def sessions(monkeypatch):
    import openenv.core

    _Session.made = []
    monkeypatch.setattr(openenv.core, "GenericEnvClient", _Session)
    return _Session.made


def test_a_session_has_the_envs_deadlines_cap_and_token_and_is_opened_once(loop, sessions):
    conns = _conns(loop, headers={"Authorization": "Bearer t"}, max_observation_bytes=3 << 20)
    first = conns.session(A)
    assert conns.session(A) is first and len(sessions) == 1
    assert first.settings == {
        "base_url": A, "connect_timeout_s": 2.0, "message_timeout_s": 5.0 + GRACE_S,
        "max_message_size_mb": 3.0, "headers": {"Authorization": "Bearer t"},
    }


def test_a_refused_handshake_is_an_error_about_the_token(loop, sessions, monkeypatch):
    async def refused(self):
        cause = RuntimeError("handshake")
        cause.response = SimpleNamespace(status_code=401)
        raise ConnectionError("could not connect") from cause

    monkeypatch.setattr(_Session, "connect", refused)
    with pytest.raises(RemoteEnvError, match=f"refused the request .401: it requires a token and no token "
                                             f"was given.; set {TOKEN_ENV}"):
        _conns(loop).session(A)


def _result(observation=None, done=False):
    return SimpleNamespace(observation={"text": "hi"} if observation is None else observation,
                           metadata=None, done=done, reward=None)


def test_a_call_that_outlives_its_deadline_raises_in_time(loop):
    conns = _conns(loop, timeout_s=0.2)
    conns.clients[A] = _Session()

    async def never(session):
        await asyncio.Event().wait()  # a server that never answers

    start = time.monotonic()
    with pytest.raises(TimeoutError):
        conns.call(A, "step", never, "t1")
    assert time.monotonic() - start < 0.2 + GRACE_S + SLACK_S


def test_a_call_tells_server_errors_from_malformed_answers(loop):
    conns = _conns(loop)
    conns.clients[A] = _Session()

    def raising(exc):
        async def op(session):
            raise exc
        return op

    async def answer(session):
        return _result()

    assert conns.call(A, "step", answer, "t1").observation == {"text": "hi"}
    with pytest.raises(RemoteEnvError, match=r"^OpenEnv server http://a:1, task t1, step: Server error: unknown task$"):
        conns.call(A, "step", raising(RuntimeError("Server error: unknown task")), "t1")
    with pytest.raises(RemoteEnvError, match="raise the server's --sessions-per-client"):
        conns.call(A, "reset", raising(RuntimeError("Server error: CAPACITY_REACHED quota of 2")), "t1")
    with pytest.raises(RemoteEnvError, match="raise the server's max_concurrent_envs"):
        conns.call(A, "reset", raising(RuntimeError("Server error: CAPACITY_REACHED 8/8")), "t1")
    with pytest.raises(_BadAnswer, match=r"a malformed answer \(KeyError: 'data'\)"):
        conns.call(A, "step", raising(KeyError("data")), "t1")
    with pytest.raises(RuntimeError, match="^loop gone$"):  # not the server's: left to the caller
        conns.call(A, "step", raising(RuntimeError("loop gone")), "t1")

    async def not_an_object(session):
        return _result(observation=["text"])

    with pytest.raises(_BadAnswer, match="an observation that is not an object"):
        conns.call(A, "step", not_an_object, "t1")


def test_a_dropped_session_is_forgotten_and_closed_in_the_background(loop, sessions):
    conns = _conns(loop)
    session = conns.session(A)  # opened on the loop, as every session is
    conns.drop(A)
    assert A not in conns.clients
    wait_until(lambda: session.closed, timeout=SLACK_S, message="the dropped session was closed")
    conns.drop(A)  # nothing left to drop


def test_closing_closes_every_session_and_the_http_client(loop):
    conns = _conns(loop)
    kept = [_Session(), _Session()]
    conns.clients = {A: kept[0], B: kept[1]}

    async def close():
        conns.http_client()
        http = conns.http
        await conns.aclose()
        return http.is_closed

    assert loop.run(close, SLACK_S) is True
    assert all(s.closed for s in kept) and conns.clients == {} and conns.http is None


def test_a_reset_crossing_the_servers_going_away_close_is_sent_once_more_on_a_new_session(loop, sessions):
    """A server closes an old or idle session between episodes (code 1001, 'open a new one');
    a reset sent as that close is on the wire meets it. The reset has no state to lose: it is
    sent again on a new session to the same server, once; a step, another close code or a
    second close is the fault it was."""
    from websockets.exceptions import ConnectionClosed
    from websockets.frames import Close

    from corrgrpo_envs.integrations.openenv_quotas import GOING_AWAY

    def closes(code: int, times: int):
        seen = []

        async def op(session):
            seen.append(session)
            if len(seen) <= times:
                raise ConnectionClosed(Close(code, "session older than 4 s: closed (open a new one)"), None)
            return _result()
        return op, seen

    conns = _conns(loop)
    op, seen = closes(GOING_AWAY, 1)
    assert conns.call(A, "reset", op, "t1").observation == {"text": "hi"}
    assert len(seen) == 2 and seen[0] is not seen[1] and conns.clients[A] is seen[1]  # a new session
    wait_until(lambda: seen[0].closed, timeout=SLACK_S, message="the closed session was let go")

    for what, code, times in (("step", GOING_AWAY, 1), ("reset", 1006, 1), ("reset", GOING_AWAY, 2)):
        op, seen = closes(code, times)
        with pytest.raises(ConnectionClosed):
            conns.call(A, what, op, "t1")
        assert len(seen) == (2 if (what, code) == ("reset", GOING_AWAY) else 1), (what, code, times)
