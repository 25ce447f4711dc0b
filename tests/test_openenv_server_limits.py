"""``corrgrpo serve`` under attack: each limit holds while another client keeps working.

Each attack runs in its own process (``tests/openenv_attacks.py``) against a real
``python -m corrgrpo_envs.serve`` process, while a legitimate client (OpenEnv's own,
in a process of its own) plays episodes over a WebSocket and times every message. The
test measures that client's round trips before and during the attack, and the server's
resident memory (``VmRSS``) throughout: the client must see no error, its p99 round trip
under attack must stay within max(0.25 s, 10 x its idle p99) (a bound a loaded two-core
machine keeps; the figures themselves are printed, ``pytest -s`` shows them), and the
server's memory must stay within 100 MB of idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openenv", reason="the openenv extra is not installed")
httpx = pytest.importorskip("httpx")

from corrgrpo_envs.integrations.openenv_limits import TOKEN_VARIABLE, is_loopback  # noqa: E402
from corrgrpo_envs.integrations.openenv_probe_harness import P99_BOUND_VARIABLE, p99_floor_s  # noqa: E402
from tests.openenv_attacks import SQUATTERS, reset_from_the_attackers_address  # noqa: E402
from tests.openenv_servers import ROOT, Server, free_port  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

ENV = "corrgrpo/ToolCall-v0"  # 1000 tasks, ~0.15 s to build: listings and env builds cost the server
NAME = "ToolCall-v0"
MAX_SESSIONS = 16
QUOTA = MAX_SESSIONS // 2  # --sessions-per-client's default: half of --max-sessions
DETACHED_S = 3.0
MEMORY_MB = 100
TOKEN = "s3cret-token-for-tests"


def _serve(tmp: Path, *options: str, env: dict[str, str | None] | None = None) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "corrgrpo_envs.serve", ENV, "split=all", "--port", str(port), *options]
    return Server(argv, port, tmp / f"serve-{port}.log", env={TOKEN_VARIABLE: None, **(env or {})})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = _serve(tmp_path_factory.mktemp("limits"), "--max-sessions", str(MAX_SESSIONS),
               "--session-detached-s", str(DETACHED_S))
    try:
        yield s.start()
    finally:
        s.stop()


@pytest.fixture(scope="module")
def token_server(tmp_path_factory):
    s = _serve(tmp_path_factory.mktemp("token"), "--max-sessions", str(MAX_SESSIONS), env={TOKEN_VARIABLE: TOKEN})
    try:
        yield s.start()
    finally:
        s.stop()


# ------------------------------------------------------------------ measuring
def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


class _PeakMemory(threading.Thread):
    """The server's largest resident memory while running (sampled every 20 ms)."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self._stop_event = pid, 0.0, threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak = max(self.peak, _rss_mb(self.pid))
            time.sleep(0.02)

    def stop(self) -> float:
        self._stop_event.set()
        self.join(timeout=5)
        return max(self.peak, _rss_mb(self.pid))


def _helper(*args: str) -> list[str]:
    return [sys.executable, "-m", "tests.openenv_attacks", *args]


def _helper_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _probe(server: Server, seconds: float, token: str | None = None) -> dict:
    argv = _helper("probe", server.base, str(seconds)) + (["--token", token] if token else [])
    done = subprocess.run(argv, cwd=ROOT, env=_helper_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["errors"] == [], f"the legitimate client failed: {result['errors']}"
    assert len(result["round_trips"]) >= 20, "the legitimate client barely got through"
    return result


def _percentiles(trips: list[float]) -> tuple[float, float]:
    return float(np.percentile(trips, 50)), float(np.percentile(trips, 99))


def _under_attack(server: Server, kind: str, seconds: float = 4.0, token: str | None = None) -> tuple[dict, dict]:
    """(figures, the attacker's counts): the probe idle, then during the attack, and the server's memory."""
    assert server.proc is not None
    pid = server.proc.pid
    idle = _probe(server, 2.0, token)
    rss_idle = _rss_mb(pid)
    peak = _PeakMemory(pid)
    attacker = subprocess.Popen(_helper(kind, server.base, "120"), cwd=ROOT, env=_helper_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        peak.start()
        assert attacker.stderr is not None
        line = attacker.stderr.readline()  # "attacking": under way
        assert line.strip() == "attacking", f"the {kind} attack did not start: {line}{attacker.stderr.read()[-2000:]}"
        attacked = _probe(server, seconds, token)
    finally:
        attacker.terminate()
        out, err = attacker.communicate(timeout=60)
        rss_peak = peak.stop()
    assert attacker.returncode == 0, err[-2000:]
    counts = json.loads(out.splitlines()[-1])
    idle_p50, idle_p99 = _percentiles(idle["round_trips"])
    p50, p99 = _percentiles(attacked["round_trips"])
    figures = {
        "attack": kind,
        "idle_p50_ms": round(idle_p50 * 1e3, 2), "idle_p99_ms": round(idle_p99 * 1e3, 2),
        "attack_p50_ms": round(p50 * 1e3, 2), "attack_p99_ms": round(p99 * 1e3, 2),
        "round_trips": len(attacked["round_trips"]),
        "rss_idle_mb": round(rss_idle, 1), "rss_peak_mb": round(rss_peak, 1),
    }
    shown = counts
    if "attempts" in counts:  # one row per body sent: say how many, and how they ended
        attempts = counts["attempts"]
        shown = {"bodies": len(attempts), "statuses": sorted({a["status"] for a in attempts}),
                 "most_sent_mb": max(a["sent_mb"] for a in attempts)}
    print(f"\nFIGURES {json.dumps(figures)}\nATTACKER {json.dumps(shown)[:600]}")
    # a machine whose other work starves the server during the attack itself may raise the floor
    # as the red-team probes do (CORRGRPO_REDTEAM_P99_BOUND_MS); the counts and memory still decide
    floor = p99_floor_s() if P99_BOUND_VARIABLE in os.environ else 0.25
    assert p99 <= max(floor, 10 * idle_p99), f"the legitimate client stalled under the {kind} attack: {figures}"
    assert rss_peak - rss_idle <= MEMORY_MB, f"the server's memory grew under the {kind} attack: {figures}"
    return figures, counts


# ---------------------------------------------------------------- the attacks
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_flood_of_http_sessions_neither_locks_out_nor_stalls_websocket_clients(server):
    _, counts = _under_attack(server, "sessions")
    # Sessions made over HTTP hold at most an eighth of the slots, and end DETACHED_S after their
    # last request (checked every DETACHED_S / 4): the attacker got a few, and was refused the rest.
    held = MAX_SESSIONS // 8
    most = held * (1 + counts["seconds"] / DETACHED_S)
    assert 1 <= counts.get("created", 0) <= most and counts.get("refused 200", 0) > 100, counts


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_256_mb_body_is_refused_with_413_before_it_is_read(server):
    _, counts = _under_attack(server, "body")
    attempts = counts["attempts"]
    assert {a["declared"] for a in attempts} == {True, False}, attempts
    for attempt in attempts:
        # 413 read, or the connection closed on the rest of the body; either way long before 256 MB
        assert attempt["status"] in ("413", "ConnectionResetError", "BrokenPipeError"), attempt
        assert attempt["sent_mb"] <= 8, attempt
    assert sum(a["status"] == "413" for a in attempts) >= len(attempts) // 2, attempts
    cap = httpx.post(f"{server.base}/reset", content=b"x" * (3 << 20), timeout=30)
    assert cap.status_code == 413 and "cap of" in cap.json()["detail"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_flood_of_task_listings_and_stateless_requests_does_not_stall_sessions(server):
    _, counts = _under_attack(server, "flood")
    served = sum(n for key, n in counts.items() if key.endswith((" 200", " 400")))
    assert served >= 100, counts
    assert not [key for key in counts if key.endswith(" 500")], counts
    assert all(key.endswith((" 200", " 400", " 503")) for key in counts), counts
    # What the stand-in answers is what a fresh env answers.
    listed = httpx.post(f"{server.base}/{NAME}/tasks", json={"split": "eval"}, timeout=30).json()["tasks"]
    assert len(listed) == httpx.post(f"{server.base}/{NAME}/num_tasks", json={"split": "eval"},
                                     timeout=30).json()["num_tasks"] > 0
    reset = httpx.post(f"{server.base}/reset", json={"task_id": listed[0]["id"]}, timeout=30).json()
    assert reset["observation"]["task_id"] == listed[0]["id"]
    assert httpx.get(f"{server.base}/state", timeout=30).json()["task_id"] is None  # a fresh env's state
    step = httpx.post(f"{server.base}/step", json={"action": {"message": "hi"}}, timeout=30)
    assert step.status_code == 400 and "/ws" in step.json()["detail"]
    unknown = httpx.post(f"{server.base}/reset", json={"task_id": "no/such"}, timeout=30)
    assert unknown.status_code == 400 and "no/such" in unknown.json()["detail"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_reference_answers_are_refused_without_serve_references(server):
    _, counts = _under_attack(server, "references")
    assert set(counts) == {f"POST /{NAME}/task 403"}, counts
    refused = httpx.post(f"{server.base}/{NAME}/task", json={"split": "all", "index": 0}, timeout=30)
    assert refused.status_code == 403 and "--serve-references" in refused.json()["detail"]
    assert "\n" not in refused.json()["detail"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_without_the_token_every_path_but_health_is_refused(token_server):
    base = token_server.base
    logged = token_server.log.stat().st_size
    _, counts = _under_attack(token_server, "token", token=TOKEN)
    assert counts.get("ws 401", 0) > 0 and "ws opened" not in counts, counts
    # refusals write nothing at the default level: one line each once stalled the server on a full pipe
    written = token_server.log.read_bytes()[logged:].decode(errors="replace")
    assert "handshake" not in written and len(written) < 4096, written[-2000:]
    assert all(key.endswith(" 401") for key in counts), counts
    assert httpx.get(f"{base}/health", timeout=30).status_code == 200
    for method, path in (("GET", "/schema"), ("GET", "/docs"), ("GET", "/openapi.json"),
                         ("POST", f"/{NAME}/tasks"), ("POST", "/reset"), ("POST", "/mcp")):
        refused = httpx.request(method, f"{base}{path}", json={"split": "all"}, timeout=30)
        assert refused.status_code == 401, (path, refused.status_code)
        assert "Authorization: Bearer" in refused.json()["detail"]
        assert refused.headers["www-authenticate"] == "Bearer"
    near = httpx.get(f"{base}/schema", headers={"Authorization": f"Bearer {TOKEN[:-1]}"}, timeout=30)
    assert near.status_code == 401
    good = httpx.get(f"{base}/schema", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert good.status_code == 200 and "reward_components" in good.json()["observation"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_websocket_squatters_hold_their_quota_and_no_more_while_other_clients_keep_working(server):
    _, counts = _under_attack(server, "squat")
    # 64 sockets from one address asking for state every 3 s: the quota's sessions, no more;
    # the others were refused (CAPACITY_REACHED for the quota, close code 1013 for the reconnects)
    # and the legitimate client, from another address, opened its session and played.
    assert counts["most_held_at_once"] == QUOTA, counts
    refused = sum(n for key, n in counts.items() if key.startswith(("refused ", "closed 1013")))
    assert refused >= SQUATTERS - QUOTA, counts


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_connect_close_churn_is_rate_limited_and_does_not_stall_sessions(server):
    _, counts = _under_attack(server, "churn")
    assert counts.get("opened and closed", 0) > 0 and counts.get("reset answered", 0) > 0, counts
    assert counts.get("reset: closed 1013", 0) > 0, counts  # refused for the rate: closed before the reset
    assert not [key for key in counts if "Timeout" in key], counts
    # A connection admitted while the quota's sessions are still closing is refused
    # CAPACITY_REACHED (the quota at work: a busy CI machine saw 1 in 800 resets). What must not
    # happen is a slot that stays taken: once the churn stops, the attacker's address plays again.
    wait_until(lambda: asyncio.run(reset_from_the_attackers_address(server.base)) == "reset answered",
               timeout=30, interval=0.5, message="a reset from the churning address after the churn")



def test_uvicorns_handshake_error_is_dropped_only_after_our_own_refusal():
    import logging

    from corrgrpo_envs.integrations import openenv_middleware

    record = logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1,
                               openenv_middleware._RefusalLogFilter.MESSAGE, None, None)
    other = logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, "Exception in ASGI application", None, None)
    log_filter = openenv_middleware._RefusalLogFilter()
    assert log_filter.filter(record)  # an app that forgot its handshake still shows
    token = openenv_middleware._REFUSED_HANDSHAKE.set(True)
    try:
        assert not log_filter.filter(record) and log_filter.filter(other)
    finally:
        openenv_middleware._REFUSED_HANDSHAKE.reset(token)


# ------------------------------------------------------------- sessions, CLI
CHEAP = "corrgrpo/ScaleDominance-v0"  # built in milliseconds: many sessions open at once


@pytest.fixture(scope="module")
def policy_server(tmp_path_factory):
    port = free_port()
    argv = [sys.executable, "-m", "corrgrpo_envs.serve", CHEAP, "--port", str(port), "--max-sessions", "8",
            "--sessions-per-client", "16", "--session-detached-s", "2", "--session-idle-s", "1.5"]
    s = Server(argv, port, tmp_path_factory.mktemp("policy") / "serve.log", env={TOKEN_VARIABLE: None})
    try:
        yield s.start()
    finally:
        s.stop()


def _mcp(base: str, method: str, **params: str) -> dict:
    request = {"jsonrpc": "2.0", "method": method, "params": params, "id": 1}
    return httpx.post(f"{base}/mcp", json=request, timeout=30).json()


def _alive(base: str, session_id: str) -> bool:
    answer = _mcp(base, "tools/list", session_id=session_id)
    return "Unknown session_id" not in json.dumps(answer)


@pytest.mark.timeout(120)
def test_sessions_without_a_websocket_give_way_to_websocket_clients_and_expire(policy_server):
    from openenv.core import GenericEnvClient

    base = policy_server.base
    made = _mcp(base, "openenv/session/create")
    detached = made["result"]["session_id"]
    refused = _mcp(base, "openenv/session/create")  # 8 slots: one for sessions made over HTTP
    assert "sessions made over HTTP: 1/1" in refused["error"]["message"], refused
    assert _alive(base, detached)
    clients = []
    try:
        for _ in range(8):  # the eighth takes the detached session's slot
            client = GenericEnvClient(base_url=base, message_timeout_s=30.0).sync()
            clients.append(client)
            client.reset()
        assert not _alive(base, detached)
    finally:
        for client in clients:
            client.close()
    again = _mcp(base, "openenv/session/create")["result"]["session_id"]
    touched = time.monotonic()  # asking about a session is activity: its 2 s start again here
    assert _alive(base, again)
    # --session-detached-s 2: poll with creates, which are refused while `again` holds the one
    # slot for sessions made over HTTP and do not touch it (asking about it would keep it alive)
    wait_until(lambda: "result" in _mcp(base, "openenv/session/create"), timeout=60,
               message="the quiet detached session expired and its slot was given to a new one")
    assert time.monotonic() - touched >= 2.0  # not before its time
    assert not _alive(base, again)


@pytest.mark.timeout(120)
def test_a_quiet_websocket_session_is_closed_and_its_slot_freed(policy_server):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    ws_url = f"ws://127.0.0.1:{policy_server.port}/ws"
    with connect(ws_url, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "reset", "data": {}}))
        assert json.loads(ws.recv(timeout=30))["type"] == "observation"
        start = time.monotonic()
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
        quiet = time.monotonic() - start
    assert 1.4 <= quiet <= 20, quiet  # closed at 1.5 s (the reaper's rounds and a loaded machine add)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
    assert closed.value.rcvd.reason == "no reset or step for 1.5 s: session closed"
    with connect(ws_url, open_timeout=30) as ws:  # a busy client is not idle: a step resets the clock
        for _ in range(8):  # 2.4 s in all, past the 1.5 s idle limit
            ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(ws.recv(timeout=30))["type"] == "observation"
            # the behaviour under test: a client pausing between episodes, far enough under
            # the 1.5 s idle limit that a slow answer on a loaded machine stays under it too
            time.sleep(0.3)


def _wait_until_its_one_session_is_gone(port: int) -> None:
    """Poll, with a connection that only asks for state, until a client whose quota is one
    session may open another: the server has closed (and destroyed) the one it held."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    deadline = time.monotonic() + 30
    while True:
        with connect(f"ws://127.0.0.1:{port}/ws", open_timeout=30) as ws:
            with contextlib.suppress(ConnectionClosed):  # a refusal may close before the request goes out
                ws.send(json.dumps({"type": "state"}))
            answer = json.loads(ws.recv(timeout=30))  # the refusal's error frame came before its close
        # (a refused connection held no session; one that was answered is destroyed before
        # the server acknowledges its close, so the quota is free again once `with` ends)
        if answer["type"] == "state":
            return
        assert answer["data"]["code"] == "CAPACITY_REACHED", answer
        assert time.monotonic() < deadline, "the old session was never closed"
        time.sleep(0.2)


@pytest.mark.timeout(180)
def test_the_trainers_client_plays_on_across_the_closes_of_its_old_sessions(tmp_path):
    from corrgrpo_envs.integrations.openenv_client import OpenEnvEnv

    port = free_port()
    # an age that an episode (a reset, which builds the env, and a step) outlasts only on a stalled
    # machine: a session is closed between episodes, never in the middle of one
    argv = [sys.executable, "-m", "corrgrpo_envs.serve", CHEAP, "--port", str(port), "--session-max-age-s", "4",
            "--sessions-per-client", "1", "--connections-per-s", "1000"]
    server = Server(argv, port, tmp_path / "serve.log", env={TOKEN_VARIABLE: None}).start()
    try:
        env = OpenEnvEnv(server.url, retries=0, timeout_s=30.0)
        try:
            rewards = []
            for seed in range(3):
                env.reset(seed=seed)
                rewards.append(env.step("0.5")[1].tolist())
                # between episodes, past its age: the server closes the session; the next reset
                # opens a new one (OpenEnv's client reopens a socket the server closed)
                _wait_until_its_one_session_is_gone(port)
        finally:
            env.close()
    finally:
        server.stop()
    assert rewards[0] == rewards[1] == rewards[2] and len(rewards[0]) == 3, rewards


def _serve_once(*args: str, env: dict[str, str] | None = None, cli: bool = False) -> subprocess.CompletedProcess:
    """One ``python -m corrgrpo_envs.serve`` (``corrgrpo serve`` with ``cli``) that is expected to stop."""
    run_env = {k: v for k, v in _helper_env().items() if k != TOKEN_VARIABLE}
    command = ["corrgrpo.trainer.cli", "serve"] if cli else ["corrgrpo_envs.serve"]
    return subprocess.run([sys.executable, "-m", *command, *args], cwd=ROOT, env={**run_env, **(env or {})},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "args, says",
    [
        (["corrgrpo/NoSuch-v0"], "unknown env id 'corrgrpo/NoSuch-v0'"),
        ([ENV, "bogus=1"], "unknown key 'bogus'; allowed keys:"),
        ([ENV, "split=nosuch"], "split: 'nosuch' is not allowed; allowed values: one of 'train', 'eval', 'all'"),
        ([ENV, "split"], "'split' is not key=value"),
        ([ENV, "--session-idle-s", "0"], "session_idle_s must be a positive number"),
        ([ENV, "--token", ""], "--token is empty"),
        ([ENV, "--sessions-per-client", "0"], "sessions_per_client must be a whole number of at least 1"),
        ([ENV, "--connections-per-s", "0"], "connections_per_s must be a positive number"),
        ([ENV, "--concurrent-builds", "0"], "concurrent_builds must be a whole number of at least 1"),
    ],
)
def test_a_bad_env_or_argument_is_one_error_line_before_anything_is_announced(args, says):
    done = _serve_once(*args, "--port", str(free_port()))
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2, done
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines


@pytest.mark.timeout(120)
def test_corrgrpo_serve_says_the_same_one_line():
    done = _serve_once("corrgrpo/NoSuch-v0", "--port", str(free_port()), cli=True)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: cannot build corrgrpo/NoSuch-v0") and "unknown env id" in lines[0]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_non_loopback_address_without_a_token_is_warned_about():
    # An env that cannot be built stops the command before it binds anything.
    bare = _serve_once("corrgrpo/NoSuch-v0", "--host", "0.0.0.0", "--port", str(free_port()))
    lines = bare.stdout.strip().splitlines()
    assert lines[0].startswith("warning: serving on 0.0.0.0 without a token") and "--token" in lines[0], lines
    assert lines[1].startswith("error: ") and bare.returncode == 2
    for extra, env in ((["--token", "t"], None), ([], {TOKEN_VARIABLE: "t"})):
        guarded = _serve_once("corrgrpo/NoSuch-v0", "--host", "0.0.0.0", "--port", "1", *extra, env=env)
        assert "warning" not in guarded.stdout and guarded.returncode == 2, guarded.stdout
    # (on 127.0.0.1 the bad-env tests above see exactly one line: no warning)


def test_loopback_addresses():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost", "LOCALHOST"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "example.org", "192.168.1.2"))
