"""The session policy of ``corrgrpo serve``, in process: envs built on the first reset and a
bounded number at a time, the session quota and the connection rate per client, what counts
as activity, the sessions' maximum age, and who gives their slot up at a full server.

The app is :func:`build_app`'s, under Starlette's test client (one thread, no sockets). The
measured attacks on a real server are in tests/test_openenv_server_limits.py.
"""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("openenv", reason="the openenv extra is not installed")

from starlette.testclient import TestClient  # noqa: E402
from starlette.websockets import WebSocketDisconnect  # noqa: E402

from corrgrpo_envs.integrations.openenv_admission import (  # noqa: E402
    MAX_TRACKED_CLIENTS,
    ConnectionRate,
    SessionsByClient,
    client_key,
)
from corrgrpo_envs.integrations.openenv_deferred_env import BuildGate  # noqa: E402
from corrgrpo_envs.integrations.openenv_limits import (  # noqa: E402
    AGE_QUIET_S,
    ServerLimits,
    WebSocketConnection,
)
from corrgrpo_envs.integrations.openenv_server import build_app  # noqa: E402

ENV = "corrgrpo/ScaleDominance-v0"  # built in milliseconds; one step ends its episode
RESET = {"type": "reset", "data": {}}
STEP = {"type": "step", "data": {"message": "0.5"}}
FAST = 1000.0  # connections a second: no rate limit in the tests of other limits


def _app(max_sessions: int = 8, **limits) -> tuple[TestClient, object]:
    app = build_app(ENV, {"split": "all"}, max_sessions=max_sessions, limits=ServerLimits(**limits))
    return TestClient(app), app.state.env_server


def _ask(ws, message: dict) -> dict:
    ws.send_json(message)
    return ws.receive_json()


def _closed(ws) -> WebSocketDisconnect:
    """The server's close of ``ws`` (what the client reads next must be it)."""
    with pytest.raises(WebSocketDisconnect) as closed:
        ws.receive_json()
    return closed.value


# ------------------------------------------------------------------ env builds
def test_a_session_builds_its_env_on_its_first_reset_never_on_connect():
    client, server = _app(connections_per_s=FAST)
    with client:
        for _ in range(6):  # connect, ask for state, leave: nothing to build
            with client.websocket_connect("/ws") as ws:
                state = _ask(ws, {"type": "state"})
                assert state["type"] == "state" and state["data"]["task_id"] is None
        assert server.builds.built == 0
        with client.websocket_connect("/ws") as ws:
            first = _ask(ws, RESET)
            assert first["type"] == "observation" and first["data"]["done"] is False
            assert _ask(ws, STEP)["data"]["done"] is True
            second = _ask(ws, RESET)
            assert _ask(ws, {"type": "state"})["data"]["task_id"] == second["data"]["observation"]["task_id"]
        assert server.builds.built == 1
        with client.websocket_connect("/ws") as ws:  # a step before any reset builds nothing either
            refused = _ask(ws, STEP)
            assert refused["type"] == "error" and "reset before stepping" in refused["data"]["message"]
        assert server.builds.built == 1


def test_builds_run_at_most_the_gates_number_at_once():
    gate = BuildGate(concurrent=2)
    inside, most, release = [0], [0], threading.Event()
    count = threading.Lock()

    def factory() -> object:
        with count:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        release.wait(30)
        with count:
            inside[0] -= 1
        return object()

    threads = [threading.Thread(target=gate.build, args=(factory,)) for _ in range(5)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while not (inside[0] == 2 and gate.waiting == 3):  # two building, three waiting their turn
        assert time.monotonic() < deadline, (inside, gate.waiting)
        time.sleep(0.01)
    release.set()
    for thread in threads:
        thread.join(30)
    assert most[0] == 2 and gate.built == 5 and gate.waiting == 0
    with pytest.raises(ValueError, match="at least 1"):
        BuildGate(concurrent=0)


# ------------------------------------------------------------- who a client is
def test_a_client_is_its_token_where_there_is_one_else_its_address():
    scope = {"client": ("10.0.0.7", 53122)}
    assert client_key(scope) == "10.0.0.7"
    assert client_key(scope, token_index=1) == "token #2"  # the position, never the token
    assert client_key({}) == "unknown"


def test_the_connection_rate_is_a_burst_then_a_steady_rate_per_client():
    rate = ConnectionRate(per_s=2.0, burst=3)
    assert [rate.admit("a", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rate.admit("a", 0.0) == pytest.approx(0.5)  # the fourth waits for half a second's allowance
    assert rate.admit("b", 0.0) == 0.0  # another client has its own
    assert rate.admit("a", 0.25) == pytest.approx(0.25)  # a refused attempt costs nothing
    assert rate.admit("a", 0.5) == 0.0
    assert rate.admit("a", 0.6) > 0
    assert [rate.admit("a", 10.0) for _ in range(4)][:3] == [0.0, 0.0, 0.0]  # refilled to the burst, no more
    for i in range(MAX_TRACKED_CLIENTS + 10):  # clients seen once are forgotten, not kept for ever
        rate.admit(f"10.1.{i // 256}.{i % 256}", 20.0)
    assert len(rate._clients) <= MAX_TRACKED_CLIENTS


def test_the_session_quota_counts_sessions_being_made_and_forgets_ended_ones():
    sessions = SessionsByClient(quota=2)
    assert sessions.reserve("a") and sessions.reserve("a")
    assert not sessions.reserve("a") and sessions.held("a") == 2  # two being made: no third
    sessions.add("a", "s1")
    sessions.cancel("a")  # the second failed
    assert sessions.held("a") == 1 and sessions.reserve("a")
    sessions.add("a", "s2")
    assert not sessions.reserve("a") and sessions.reserve("b")
    sessions.retain({"s2"})  # s1 ended without a word
    assert sessions.held("a") == 1
    sessions.discard("s2")
    sessions.discard("no-such")
    assert sessions.held("a") == 0


# ------------------------------------------------------------ quota and rate
def test_each_token_is_one_client_with_its_own_session_quota():
    client, server = _app(tokens=("alpha", "beta"), sessions_per_client=1, connections_per_s=FAST)
    alpha = {"Authorization": "Bearer alpha"}
    with client:
        with client.websocket_connect("/ws", headers=alpha) as first:
            assert _ask(first, RESET)["type"] == "observation"
            with client.websocket_connect("/ws", headers=alpha) as second:
                refused = second.receive_json()
                assert refused["data"]["code"] == "CAPACITY_REACHED", refused
                assert "client token #1 holds 1 sessions, at most 1 per client" in refused["data"]["message"]
                assert "--sessions-per-client" in refused["data"]["message"]
                closed = _closed(second)
                assert closed.code == 1013 and closed.reason.startswith("session quota: token #1 holds 1")
            with client.websocket_connect("/ws", headers={"Authorization": "Bearer beta"}) as other:
                assert _ask(other, RESET)["type"] == "observation"
            assert _ask(first, STEP)["data"]["done"] is True  # the first session never noticed
        with client.websocket_connect("/ws", headers=alpha) as again:  # its slot came back with its close
            assert _ask(again, RESET)["type"] == "observation"
        assert server.by_client.held("token #1") == 0


def test_new_connections_past_the_clients_rate_are_refused_with_code_1013():
    client, _ = _app(max_sessions=4, connections_per_s=0.01)  # burst: the quota, 2
    with client:
        for _ in range(2):
            with client.websocket_connect("/ws") as ws:
                assert _ask(ws, {"type": "state"})["type"] == "state"
        with client.websocket_connect("/ws") as ws:
            closed = _closed(ws)  # the close, with nothing before it
            assert closed.code == 1013
            assert closed.reason.startswith("too many new connections from testclient: at most 0.01 a second "
                                            "after a burst of 2; retry in ")


# ------------------------------------------------------------ activity and age
def test_state_requests_do_not_keep_a_session_alive_resets_and_steps_do():
    client, _ = _app(session_idle_s=0.5, connections_per_s=FAST)
    with client:
        with client.websocket_connect("/ws") as ws:
            assert _ask(ws, RESET)["type"] == "observation"
            start = time.monotonic()
            with pytest.raises(WebSocketDisconnect) as closed:
                while time.monotonic() - start < 30:  # state after state, with no pause: still idle
                    assert _ask(ws, {"type": "state"})["type"] == "state"
            assert 0.45 <= time.monotonic() - start < 30
            assert closed.value.code == 1001 and closed.value.reason == "no reset or step for 0.5 s: session closed"
        with client.websocket_connect("/ws") as ws:  # resets for longer than the idle time: kept
            start = time.monotonic()
            while time.monotonic() - start < 1.5:
                assert _ask(ws, RESET)["type"] == "observation"
                assert _ask(ws, STEP)["type"] == "observation"


def test_an_old_session_is_closed_once_its_client_pauses_between_episodes():
    client, _ = _app(session_max_age_s=0.3, connections_per_s=FAST)
    with client:
        with client.websocket_connect("/ws") as ws:
            start = time.monotonic()
            while time.monotonic() - start < 1.0:  # past its age, but never quiet: kept
                assert _ask(ws, RESET)["type"] == "observation"
                assert _ask(ws, STEP)["data"]["done"] is True
            paused = time.monotonic()
            closed = _closed(ws)
            assert AGE_QUIET_S * 0.9 <= time.monotonic() - paused < AGE_QUIET_S + 10
            assert closed.code == 1001 and closed.reason == "session older than 0.3 s: closed (open a new one)"


class _Session:
    """What a connection reads of its session's env."""

    def __init__(self, created_at: float, last_active: float, in_episode: bool):
        self.created_at, self.last_active, self.in_episode = created_at, last_active, in_episode


def test_when_a_connection_is_due_to_close():
    connection = WebSocketConnection("c", idle_s=600.0, max_age_s=3600.0)
    born = connection.opened_at
    assert connection.due()[0] == pytest.approx(born + 600.0)  # no session yet: idle from the connect
    connection.session = _Session(born, born + 3500.0, in_episode=False)
    when, code, reason = connection.due()  # between episodes: at its age, or a quiet moment after it
    assert when == pytest.approx(born + 3600.0) and code == 1001 and "older than 3600 s" in reason
    connection.session = _Session(born, born + 3599.5, in_episode=False)
    assert connection.due()[0] == pytest.approx(born + 3599.5 + AGE_QUIET_S)
    connection.session = _Session(born, born + 3700.0, in_episode=True)  # mid-episode: idle time later
    assert connection.due()[0] == pytest.approx(born + 3600.0 + 600.0)
    connection.session = _Session(born, born + 3000.0, in_episode=True)
    when, code, reason = connection.due()
    assert when == pytest.approx(born + 3600.0) and "no reset or step for 600 s" in reason
    connection.session = _Session(born, born + 4199.0, in_episode=False)  # never quiet: capped all the same
    assert connection.due()[0] == pytest.approx(born + 3600.0 + 600.0)


# ---------------------------------------------------------------- a full server
def test_a_full_server_takes_the_slot_of_a_quiet_session_between_episodes_not_of_one_mid_episode():
    client, server = _app(max_sessions=2, sessions_per_client=3, detached_s=0.2, connections_per_s=FAST)
    with client:
        with client.websocket_connect("/ws") as between, client.websocket_connect("/ws") as playing:
            assert _ask(between, RESET)["type"] == "observation"
            assert _ask(between, STEP)["data"]["done"] is True  # its episode is over
            assert _ask(playing, RESET)["data"]["done"] is False  # its episode goes on
            deadline = time.monotonic() + 30
            while True:  # refused until `between` has been quiet for detached_s
                with client.websocket_connect("/ws") as newcomer:
                    answer = _ask(newcomer, {"type": "state"})
                    if answer["type"] == "state":
                        break
                    assert answer["data"]["code"] == "CAPACITY_REACHED", answer
                assert time.monotonic() < deadline, "no slot was given up"
            closed = _closed(between)
            assert closed.code == 1001 and closed.reason.startswith("closed to make room for another client")
            assert _ask(playing, STEP)["data"]["done"] is True
        assert server.by_client.held("testclient") == 0
