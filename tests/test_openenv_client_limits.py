"""The OpenEnv client against servers that trickle, flood, overflow and lie (small fakes on localhost).

Every exchange has one overall deadline and a size cap; values, bounds and weights are
checked in the float32 the env stores; components a server does not declare are learned
from a first episode, and a later change is an error naming ``env.reward_names``; the
shared token rides on every request and handshake; reference answers a server refuses
are an error that says how to turn them on. Measured figures are printed (``-s``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("openenv", reason="the openenv extra is not installed (pip install -e '.[openenv]')")

import corrgrpo_envs  # noqa: E402
from corrgrpo_envs.integrations.deadline_loop import CLOSE_S, GRACE_S, DeadlineLoop  # noqa: E402
from corrgrpo_envs.integrations.openenv_client import (  # noqa: E402
    DEFAULT_MAX_OBSERVATION_BYTES,
    TOKEN_ENV,
    OpenEnvEnv,
    RemoteEnvError,
    RemoteReferenceError,
    RemoteRewardError,
)
from corrgrpo_envs.vector import GroupedVectorEnv  # noqa: E402
from corrgrpo_registry.settings import ConfigError  # noqa: E402
from tests.openenv_fakes import FakeOpenEnv, TrickleProxy, free_port, observation  # noqa: E402
from tests.openenv_servers import ROOT  # noqa: E402

pytestmark = pytest.mark.timeout(120)
LOGGER = "corrgrpo_envs.integrations.openenv_client"
#: Beyond a call's configured deadline, how long a test waits for it to end: generous for a
#: 2-core machine beside two busy processes and a benchmark (a hang or a per-read timeout
#: would take minutes, a trickled answer hours); every bound on a duration here is a
#: configured deadline plus this, never a speed.
SLACK_S = 15.0
#: The longest an env's close may take by its own deadlines: the servers' acknowledgement
#: (``CLOSE_S``), then the loop thread's join.
CLOSE_DEADLINE_S = CLOSE_S + 2 * GRACE_S


@pytest.fixture
def fake():
    server = FakeOpenEnv().start()
    yield server
    server.stop()


def _make(fake: FakeOpenEnv, **kwargs):
    kwargs.setdefault("num_tasks", 4)
    return corrgrpo_envs.make(fake.url, **kwargs).unwrapped


def _step(env, action: str = "hello"):
    env.reset(options={"task_id": env.task_ids[0]})
    return env.step(action)


def _rss_peak_during(fn):
    """``fn()``'s result (or exception) and how far this process's RSS rose above where it started."""
    import psutil

    proc = psutil.Process()
    base = proc.memory_info().rss
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        return fn(), None, (peak[0] - base) / 2**20
    except Exception as exc:  # noqa: BLE001 - the caller asserts on it
        return None, exc, (peak[0] - base) / 2**20
    finally:
        done.set()
        sampler.join()


# ------------------------------------------------------------------ deadlines
def test_a_server_trickling_its_description_fails_construction_at_its_deadline(fake):
    with TrickleProxy(fake.port, interval_s=2.0) as proxy:
        start = time.monotonic()
        with pytest.raises(RemoteEnvError) as err:
            corrgrpo_envs.make(proxy.url, num_tasks=4, connect_timeout_s=3)
        elapsed = time.monotonic() - start
    print(f"trickled /schema (a byte every 2 s): construction failed after {elapsed:.2f} s, connect_timeout_s 3 s")
    message = str(err.value)
    assert f"OpenEnv server http://127.0.0.1:{proxy.port}: cannot read /schema" in message
    assert "within connect_timeout_s = 3 s" in message and "\n" not in message
    assert elapsed < 3 + SLACK_S


def test_a_trickled_step_ends_at_timeout_s_and_names_the_server(fake):
    fake.components = [{"name": "a", "low": 0, "high": 1}]
    with TrickleProxy(fake.port, interval_s=2.0, trickle=False) as proxy:
        env = corrgrpo_envs.make(proxy.url, num_tasks=4, timeout_s=3).unwrapped
        env.reset(options={"task_id": "seed-0"})
        proxy.trickle = True
        start = time.monotonic()
        with pytest.raises(RemoteEnvError, match=r"step: OpenEnv server\(s\) failed: .*no answer within 3 s"):
            env.step("hello")
        elapsed = time.monotonic() - start
        start = time.monotonic()
        env.close()
        closed = time.monotonic() - start
    print(f"trickled step answer: failed after {elapsed:.2f} s (timeout_s 3 s); close took {closed:.3f} s")
    assert elapsed < 3 + SLACK_S and closed < CLOSE_DEADLINE_S + SLACK_S


def test_a_call_that_ignores_cancellation_still_returns_at_its_deadline():
    loop = DeadlineLoop("corrgrpo-test-loop")

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue  # a coroutine that will not be cancelled (as a close handshake may)

    start = time.monotonic()
    with pytest.raises(TimeoutError, match="no answer within 0.5 s"):
        loop.run(stubborn, 0.5)
    returned = time.monotonic() - start
    start = time.monotonic()
    loop.shutdown()
    stopped = time.monotonic() - start
    print(f"a call ignoring cancellation returned after {returned:.2f} s (deadline 0.5 s); shutdown {stopped:.2f} s")
    assert returned < 0.5 + GRACE_S + SLACK_S and stopped < CLOSE_S + 2 * GRACE_S + SLACK_S
    loop.shutdown()  # idempotent


def test_a_server_that_is_down_is_one_line_naming_it():
    port = free_port()
    start = time.monotonic()
    with pytest.raises(RemoteEnvError) as err:
        corrgrpo_envs.make(f"openenv://127.0.0.1:{port}", num_tasks=4, connect_timeout_s=3)
    elapsed = time.monotonic() - start
    print(f"a server that is down: refused after {elapsed:.2f} s (connect_timeout_s 3 s)")
    message = str(err.value)
    assert message.startswith(f"OpenEnv server http://127.0.0.1:{port}: cannot read /schema (ConnectError")
    assert "\n" not in message and elapsed < 3 + SLACK_S


# ------------------------------------------------------------------ size caps
def test_an_endless_http_answer_is_cut_at_the_size_cap(fake):
    fake.schema_bytes = 1 << 30
    start = time.monotonic()
    _, exc, grew_mib = _rss_peak_during(lambda: _make(fake))
    elapsed = time.monotonic() - start
    print(f"endless /schema: refused after {elapsed:.2f} s, RSS +{grew_mib:.0f} MiB "
          f"(cap {DEFAULT_MAX_OBSERVATION_BYTES >> 20} MiB; server in this process)")
    assert isinstance(exc, RemoteEnvError)
    assert f"larger than env.max_observation_bytes ({DEFAULT_MAX_OBSERVATION_BYTES} bytes)" in str(exc)
    assert grew_mib < 200


_CLIENT = """
import json, sys, threading, time
sys.path.insert(0, {root!r})
import psutil
import openenv.core  # imported by the first reset: not part of what the observation costs
import corrgrpo_envs
env = corrgrpo_envs.make({url!r}, num_tasks=4, reward_names=["a"], max_observation_bytes={cap})
proc = psutil.Process()
base = peak = proc.memory_info().rss
done = False
def sample():
    global peak
    while not done:
        peak = max(peak, proc.memory_info().rss)
        time.sleep(0.002)
sampler = threading.Thread(target=sample)
sampler.start()
start = time.monotonic()
try:
    obs, _ = env.reset(options={{"task_id": "seed-0"}})
    error, size = None, len(obs["messages"][0]["content"])
except Exception as exc:
    error, size = str(exc), 0
elapsed = time.monotonic() - start
done = True
sampler.join()
env.close()
print(json.dumps({{"error": error, "size": size, "grew_mib": (peak - base) / 2**20, "seconds": elapsed}}))
"""


def _client_in_a_process(url: str, cap: int) -> dict:
    """Reset an env in a fresh process (its own memory) and report what it cost."""
    code = _CLIENT.format(root=str(ROOT), url=url, cap=cap)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_oversize_observation_is_refused_before_it_is_read(fake):
    big = os.urandom(45 << 20).hex()  # 90 MB that no compression shrinks
    fake.on_reset = lambda data, turn: observation(big)
    refused = _client_in_a_process(fake.url, DEFAULT_MAX_OBSERVATION_BYTES)
    accepted = _client_in_a_process(fake.url, 256 << 20)
    print(f"90 MB observation: refused in {refused['seconds']:.2f} s (the server's encoding included), the "
          f"client's peak RSS +{refused['grew_mib']:.0f} MiB; accepted (cap 256 MiB) it cost "
          f"+{accepted['grew_mib']:.0f} MiB in {accepted['seconds']:.2f} s")
    assert refused["error"] and "larger than env.max_observation_bytes (8388608 bytes)" in refused["error"]
    assert accepted["error"] is None and accepted["size"] == len(big)
    assert refused["grew_mib"] < 32 < 90 < accepted["grew_mib"]


def test_max_observation_bytes_is_checked():
    with pytest.raises(ConfigError, match=r"^max_observation_bytes: 10 is out of range; allowed: >= 1024$"):
        OpenEnvEnv("openenv://127.0.0.1:9", max_observation_bytes=10)
    with pytest.raises(ConfigError, match=r"^timeout_s: 0.0 is out of range; allowed: > 0$"):
        OpenEnvEnv("openenv://127.0.0.1:9", timeout_s=0)
    with pytest.raises(ConfigError, match=r"^connect_timeout_s: inf is out of range; allowed: > 0$"):
        OpenEnvEnv("openenv://127.0.0.1:9", connect_timeout_s=float("inf"))


def test_the_client_reads_a_settings_object_or_its_fields_alike(fake):
    from corrgrpo_envs.integrations.openenv_settings import OpenEnvSettings
    from corrgrpo_envs.registry import read_env_section

    fake.components = [{"name": "a", "low": 0, "high": 1}, {"name": "b", "low": 0, "high": 1}]
    given = {"num_tasks": 3, "timeout_s": 5, "max_turns": 2}
    builds = [
        lambda: OpenEnvEnv(fake.url, **given),
        lambda: OpenEnvEnv([fake.url], **given),
        lambda: OpenEnvEnv(OpenEnvSettings(url=fake.url, num_tasks=3, timeout_s=5.0, max_turns=2)),
        lambda: OpenEnvEnv(OpenEnvSettings(url=fake.url, num_tasks=8), **given),  # keywords go over it
        lambda: OpenEnvEnv(url=fake.url, **given),
        lambda: corrgrpo_envs.make(read_env_section({"id": fake.url, **given})).unwrapped,
    ]
    for build in builds:
        env = build()
        try:
            assert env.task_ids == ["seed-0", "seed-1", "seed-2"] and env.reward_names == ("a", "b")
            assert (env.timeout_s, env.max_turns, env.urls) == (5.0, 2, [f"http://127.0.0.1:{fake.port}"])
        finally:
            env.close()


# ------------------------------------------------------------------ lies
@pytest.mark.parametrize(
    ("value", "message"),
    [
        (float("nan"), "component 'a' is nan"),
        (float("inf"), "component 'a' is inf"),
        (1e300, r"component 'a' = 1e\+300 is beyond float32's range"),
        (1e39, r"component 'a' = 1e\+39 is beyond float32's range"),
        (10**400, "component 'a' = an integer of 1329 bits is beyond float32's range"),
        ("0.5", "component 'a' is '0.5', not a number"),
        (True, "component 'a' is True, not a number"),
    ],
)
def test_a_reward_float32_cannot_hold_is_refused(fake, value, message):
    fake.on_step = lambda data, turn: (
        '{"type": "observation", "data": {"observation": {"text": "x"}, "reward": 1, "done": true, '
        '"metadata": {"reward_components": {"a": %s}}}}' % (json.dumps(value) if not isinstance(value, int)
                                                           or isinstance(value, bool) else str(value))
    )
    env = _make(fake, reward_names=["a"])
    with pytest.raises(RemoteRewardError, match=f"OpenEnv server {fake.base}, task seed-0: {message}"):
        _step(env)
    env.close()


def test_a_lying_server_is_routed_around_and_only_lies_everywhere_stop_the_step(caplog):
    with FakeOpenEnv(["a"]) as liar, FakeOpenEnv(["a"]) as honest:
        liar.on_step = lambda data, turn: observation(reward=1.0, done=True, reward_components={"a": math.nan})
        honest.on_step = lambda data, turn: observation(reward=1.0, done=True, reward_components={"a": 0.25})
        env = corrgrpo_envs.make(f"{liar.url},{honest.url}", num_tasks=4, down_s=60).unwrapped
        env.reset(options={"task_id": "seed-0"})  # the least busy server: the first, the liar
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            _, reward, terminated, _, info = env.step("hello")
        assert reward.tolist() == [0.25] and terminated and info["server"] == honest.base
        assert any(f"OpenEnv server {liar.base} failed during step of task seed-0 (component 'a' is nan); "
                   f"replaying the episode on {honest.base}" in r.message for r in caplog.records)
        env.close()
        honest.on_step = liar.on_step  # every server lies: the step fails naming each
        env = corrgrpo_envs.make(f"{honest.url},{liar.url}", num_tasks=4).unwrapped
        env.reset(options={"task_id": "seed-0"})
        with pytest.raises(RemoteRewardError, match=rf"task seed-0, step: OpenEnv server\(s\) failed: "
                                                    rf"{honest.base} \(component 'a' is nan\); {liar.base} "):
            env.step("hello")
        env.close()


@pytest.mark.parametrize(
    ("component", "message"),
    [
        ({"name": "a", "low": 0, "high": 1e39}, r"reward_high of 'a' = 1e\+39 is beyond float32's range"),
        ({"name": "a", "low": -1e300, "high": 1}, r"reward_low of 'a' = -1e\+300 is beyond float32's range"),
        ({"name": "a", "low": 0, "high": 1, "weight": 1e39}, r"the weight of 'a' = 1e\+39 is beyond float32"),
        ({"name": "a", "low": 2, "high": 1}, "component 'a' has reward_low 2 above reward_high 1"),
        ({"name": "a", "low": 0, "high": "one"}, "reward_high of 'a' is 'one', not a number"),
    ],
)
def test_bounds_and_weights_a_server_declares_are_checked_in_float32(fake, component, message):
    fake.components = [component]
    with pytest.raises(RemoteEnvError, match=message):
        _make(fake)


def test_bounds_and_weights_in_the_config_are_checked_in_float32(fake):
    with pytest.raises(RemoteEnvError, match=r"env: reward_high of 'a' = 1e\+39 is beyond float32's range"):
        _make(fake, reward_names=["a"], reward_low=[0], reward_high=[1e39])
    with pytest.raises(RemoteEnvError, match=r"env.reward_weights: the weight of 'a' = 1e\+39"):
        _make(fake, reward_names=["a"], reward_weights=[1e39])
    with pytest.raises(RemoteEnvError, match=r"env: reward_low has 2 values for the 1 components \['a'\]"):
        _make(fake, reward_names=["a"], reward_low=[0, 0])
    env = _make(fake, reward_names=["a"], reward_low=[-math.inf], reward_high=[math.inf])  # unbounded is fine
    assert env.reward_space.high.tolist() == [math.inf]
    env.close()


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        ("this is not json", "malformed answer"),
        ("[1, 2, 3]", "malformed answer"),
        ('{"type": "observation", "data": {"observation": [1], "done": true}}', "an observation that is not an object"),
        ('{"type": "observation", "data": {"observation": {}, "done": "yes"}}', "done = 'yes', not a boolean"),
        ('{"type": "observation", "data": {"observation": {}, "done": true, "metadata": 7}}',
         "metadata that is not an object"),
        ('{"type": "observation", "data": {"observation": {"messages": "hi"}, "done": true}}',
         "messages that are not a conversation"),
    ],
)
def test_garbage_answers_are_faults_that_name_the_server(fake, frame, reason):
    fake.on_step = lambda data, turn: frame
    env = _make(fake, reward_names=["a"])
    with pytest.raises(RemoteEnvError, match=rf"step: OpenEnv server\(s\) failed: {fake.base} \(.*{reason}"):
        _step(env)
    env.close()


# ------------------------------------------------------------------ learning the components
def test_components_no_one_declares_are_learned_once_from_the_first_step(fake, caplog):
    fake.on_step = lambda data, turn: observation(reward=1.5, done=True, reward_components={"x": 0.5, "y": 1.0})
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        venv = GroupedVectorEnv(fake.url, num_groups=2, group_size=2, num_tasks=4)
    learned = [r.message for r in caplog.records if "learned reward components" in r.message]
    assert learned == [
        f"learned reward components ['x', 'y'] from the first step of {fake.base} "
        "(metadata['reward_components']); a later change is an error (set env.reward_names to declare them)"
    ]
    assert fake.sessions == 1  # one probe episode for the four members
    assert venv.reward_names == ("x", "y")
    assert venv.reward_space.low.tolist() == [-math.inf] * 2 and venv.reward_space.high.tolist() == [math.inf] * 2
    venv.reset(task_ids=["seed-0", "seed-1"])
    _, rewards, terminated, _, _ = venv.step(["a", "b", "c", "d"])
    assert rewards.tolist() == [[0.5, 1.0]] * 4 and terminated.all()
    # the server renames a component: an error naming the fix
    fake.on_step = lambda data, turn: observation(reward=1.5, done=True, reward_components={"x": 0.5, "z": 1.0})
    venv.reset(task_ids=["seed-0", "seed-1"])
    with pytest.raises(RemoteRewardError) as err:
        venv.step(["a", "b", "c", "d"])
    message = str(err.value)
    assert "is missing component(s) ['y'] / has unknown ['z']" in message
    assert f"learned from the first step of {fake.base}" in message and "set env.reward_names" in message
    venv.close()


@pytest.mark.parametrize(
    ("reset", "step", "names", "when", "source"),
    [
        (observation("hi"), observation(reward=0.3, done=True, rubric_scores={"style": 0.3}),
         ["style"], "first step", "metadata['rubric_scores']"),
        (observation("hi"), observation(reward=0.3, done=True), ["reward"], "first step", "reward"),
        (observation("hi", reward_components={"p": 0.0, "q": 0.0}),
         observation(reward=1.0, done=True, reward_components={"p": 1.0, "q": 0.0}), ["p", "q"], "first reset",
         "metadata['reward_components']"),
    ],
)
def test_components_are_learned_from_rubric_scores_the_scalar_or_the_reset(fake, caplog, reset, step, names, when,
                                                                          source):
    fake.on_reset = lambda data, turn: reset
    fake.on_step = lambda data, turn: step
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        env = _make(fake)
    assert list(env.reward_names) == names
    assert any(f"from the {when} of {fake.base} ({source}" in r.message for r in caplog.records)
    _, reward, *_ = _step(env)
    assert reward.shape == (len(names),)
    env.close()


def test_a_learned_scalar_that_turns_into_components_is_an_error(fake):
    fake.on_step = lambda data, turn: observation(reward=0.3, done=True)
    env = _make(fake)
    assert env.reward_names == ("reward",)
    fake.on_step = lambda data, turn: observation(reward=0.3, done=True, reward_components={"a": 0.3})
    with pytest.raises(RemoteRewardError, match=r"the step's rewards are in metadata\['reward_components'\], "
                                                r"but they were in reward .*set env.reward_names"):
        _step(env)
    env.close()


def test_learned_components_take_bounds_from_the_config_else_the_reset(fake):
    fake.on_reset = lambda data, turn: observation(
        "hi", reward_spec=[{"name": "a", "low": 0, "high": 2, "weight": 0.5}])
    fake.on_step = lambda data, turn: observation(reward=1.0, done=True, reward_components={"a": 1.0})
    env = _make(fake)
    assert env.reward_space.low.tolist() == [0] and env.reward_space.high.tolist() == [2]
    assert env.reward_weights.tolist() == [0.5]
    env.close()
    env = _make(fake, reward_low=[-1], reward_high=[1])
    assert env.reward_space.low.tolist() == [-1] and env.reward_space.high.tolist() == [1]
    fake.on_step = lambda data, turn: observation(reward=1.0, done=True, reward_components={"a": 1.5})
    with pytest.raises(RemoteRewardError, match=r"component 'a' = 1.5 is outside its bounds \[-1, 1\]"):
        _step(env)
    env.close()


def test_names_in_the_config_need_no_first_episode(fake):
    env = _make(fake, reward_names=["a"], reward_low=[0], reward_high=[1])
    assert fake.sessions == 0
    env.close()


def test_a_first_episode_that_fails_names_the_fix(fake):
    fake.on_step = lambda data, turn: {"type": "error", "data": {"message": "no such action", "code": "E"}}
    with pytest.raises(RemoteEnvError, match=r"names no reward components and a first episode to learn them "
                                             r"failed .*no such action.*set env.reward_names"):
        _make(fake)


# ------------------------------------------------------------------ token
def test_the_shared_token_rides_on_every_request_and_handshake(fake, monkeypatch):
    fake.token = "s3cret"
    fake.components = [{"name": "a", "low": 0, "high": 1}]
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    env = _make(fake)
    _step(env)
    env.close()
    assert len(fake.headers) >= 3 and set(fake.headers) == {"Bearer s3cret"}  # /schema, listing, handshake
    monkeypatch.delenv(TOKEN_ENV)
    with FakeOpenEnv(token="abc") as other:  # the env kwarg does the same
        env = _make(other, token="abc")
        env.close()
        assert set(other.headers) == {"Bearer abc"}


def test_a_server_that_wants_a_token_is_one_line_naming_the_variable(fake, monkeypatch):
    fake.token = "s3cret"
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(RemoteEnvError) as err:
        _make(fake)
    message = str(err.value)
    assert message == (f"OpenEnv server {fake.base} refused the request (401: it requires a token and no token "
                       f"was given); set {TOKEN_ENV} to the token it was started with")
    monkeypatch.setenv(TOKEN_ENV, "wrong")
    with pytest.raises(RemoteEnvError, match="the token given was refused"):
        _make(fake)


def test_a_refused_websocket_handshake_is_the_token_error_not_a_failover(fake, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    fake.components = [{"name": "a", "low": 0, "high": 1}]
    env = _make(fake)
    fake.token = "rotated"  # the session's handshake is refused (403)
    with pytest.raises(RemoteEnvError, match=rf"OpenEnv server {fake.base} refused the request \(403: .*{TOKEN_ENV}"):
        env.reset(options={"task_id": "seed-0"})
    env.close()


# ------------------------------------------------------------------ references
def test_references_a_server_does_not_serve_say_how_to_turn_them_on(fake):
    fake.components = [{"name": "a", "low": 0, "high": 1}]
    fake.env_name, fake.tasks = "demo", ["t1", "t2"]
    env = _make(fake)
    assert env.reference_action("t2") == ["the answer"]
    fake.reference = None  # the served env leaves it out
    with pytest.raises(RemoteReferenceError, match="sent no reference answer for task t2: start it with "
                                                   "--serve-references"):
        env.reference_action("t2")
    fake.reference_status = 403
    with pytest.raises(NotImplementedError, match=r"refuses reference answers \(403\): start it with "
                                                  "--serve-references"):
        env.reference_action("t1")
    with pytest.raises(KeyError):
        env.reference_action("nope")
    env.close()


# ------------------------------------------------------------------ closing
def test_close_is_idempotent_and_quick_and_stops_the_loop_thread(fake):
    fake.components = [{"name": "a", "low": 0, "high": 1}]
    env = _make(fake)
    _step(env)
    names = {t.name for t in threading.enumerate()}
    assert any(n.startswith("corrgrpo-openenv-") for n in names)
    start = time.monotonic()
    env.close()
    env.close()
    closed = time.monotonic() - start
    print(f"two closes took {closed:.3f} s (each within {CLOSE_DEADLINE_S:g} s by its deadlines)")
    assert closed < 2 * CLOSE_DEADLINE_S + SLACK_S
    alive = [t for t in threading.enumerate() if t.name == env._loop.name]
    assert alive == []


def test_envs_of_a_process_share_one_loop_thread_which_stops_with_the_last(fake):
    fake.components = [{"name": "a", "low": 0, "high": 1}]
    envs = [_make(fake) for _ in range(6)]
    for env in envs:
        _step(env)
    loops = [t for t in threading.enumerate() if t.name.startswith("corrgrpo-openenv-")]
    assert len(loops) == 1 and len({id(e._loop) for e in envs}) == 1
    assert fake.open_sessions == 6  # one session each, on the one loop
    for env in envs[:-1]:
        env.close()
    assert [t for t in threading.enumerate() if t.name.startswith("corrgrpo-openenv-")] == loops
    reward = _step(envs[-1])[1]  # the others' closing left the last one's session working
    assert reward.shape == (1,)
    envs[-1].close()
    loops[0].join(CLOSE_DEADLINE_S + SLACK_S)
    assert not loops[0].is_alive()
    assert not [t for t in threading.enumerate() if t.name.startswith("corrgrpo-openenv-")]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.timeout(120)
def test_a_forked_child_gets_a_loop_of_its_own(fake):
    fake.components = [{"name": "a", "low": 0, "high": 1}]
    parent = _make(fake)
    _step(parent)  # the parent's loop thread runs; a fork copies none of its threads
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a new env must work, on a loop of its own
        code = 1
        try:
            child = _make(fake)
            _step(child)
            child.close()
            code = 0
        finally:
            os.write(write, bytes([code]))
            os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.read(read, 1) == b"\x00" and os.waitstatus_to_exitcode(status) == 0
    os.close(read)
    _step(parent)
    parent.close()


def test_a_vector_env_that_fails_to_build_closes_the_members_it_built(fake):
    fake.components = [{"name": "a", "low": 0, "high": 1}]
    built = []

    def member(**kwargs):
        if len(built) == 2:
            raise RuntimeError("the third member cannot be built")
        env = OpenEnvEnv(fake.url, **kwargs)
        env.reset(options={"task_id": "seed-0"})  # holds a session and a loop thread
        built.append(env)
        return env

    with pytest.raises(RuntimeError, match="third member"):
        GroupedVectorEnv(member, num_groups=2, group_size=2, num_tasks=4)
    names = {t.name for t in threading.enumerate()}
    assert not any(e._loop.name in names for e in built)
    assert all(e._conns.clients == {} for e in built)
    deadline = time.monotonic() + CLOSE_DEADLINE_S + SLACK_S
    while fake.open_sessions:  # the server saw both sessions end
        assert time.monotonic() < deadline, fake.open_sessions
        time.sleep(0.05)
    assert fake.sessions == 2
