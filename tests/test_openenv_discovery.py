"""Reading what OpenEnv servers publish, alone: descriptions (read once per pool, a silent server
left out), components learned from one first episode, and reference answers (against the
scripted servers of tests/openenv_fakes.py, without an env around them)."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("openenv", reason="the openenv extra is not installed (pip install -e '.[openenv]')")

from corrgrpo_envs.integrations.deadline_loop import LoopLease  # noqa: E402
from corrgrpo_envs.integrations.openenv_discovery import PROBE_TEXT, _Discovery  # noqa: E402
from corrgrpo_envs.integrations.openenv_pool import _Connections, _ServerPool  # noqa: E402
from corrgrpo_envs.integrations.openenv_remote import (  # noqa: E402
    RemoteEnvError,
    RemoteReferenceError,
    _RefusedError,
)
from corrgrpo_envs.tasks import Task  # noqa: E402
from tests.openenv_fakes import FakeOpenEnv, free_port, observation  # noqa: E402

pytestmark = pytest.mark.timeout(120)
LOGGER = "corrgrpo_envs.integrations.openenv_client"


@pytest.fixture
def loop():
    lease = LoopLease()
    yield lease.loop
    lease.release()


@pytest.fixture
def fake():
    server = FakeOpenEnv(["a", "b"], env_name="toy", tasks=["t1", "t2"]).start()
    yield server
    server.stop()


@pytest.fixture
def make(loop):
    """``make(urls, headers=None)``: a discovery over its own connections, closed after the test."""
    made: list[_Discovery] = []

    def discovery(urls, headers=None) -> _Discovery:
        conns = _Connections(loop, headers, timeout_s=10.0, connect_timeout_s=5.0, max_observation_bytes=1 << 20)
        made.append(_Discovery(urls, _ServerPool(urls), conns, down_s=3600.0))
        return made[-1]

    yield discovery
    for d in made:
        loop.run(d.conns.aclose, 10)


def test_a_description_is_read_once_per_pool_and_split(make, fake):
    discovery = make([fake.base])
    described = discovery.describe("train")
    assert described == {fake.base: {
        "reward_components": [{"name": n, "low": 0.0, "high": 1.0, "weight": 1.0} for n in ("a", "b")],
        "action": fake.action, "env_name": "toy", "tasks": ["t1", "t2"]}}
    asked = len(fake.headers)
    assert asked == 3  # /schema, /list_environments, /toy/tasks
    assert discovery.describe("train") == described and len(fake.headers) == asked  # from the pool
    discovery.describe("eval")
    assert len(fake.headers) == 2 * asked  # another split is listed afresh


def test_a_server_that_does_not_answer_is_left_out_and_marked_down(make, fake, caplog):
    down = f"http://127.0.0.1:{free_port()}"
    discovery = make([down, fake.base])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        described = discovery.describe("all")
    assert list(described) == [fake.base] and discovery.pool.is_down(down)
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith(f"OpenEnv server {down}: cannot read /schema (")
    assert warning.endswith("(left out for 3600 s)")


def test_no_answering_server_is_one_error_naming_each(make):
    urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    discovery = make(urls)
    with pytest.raises(RemoteEnvError) as caught:
        discovery.describe("all")
    parts = str(caught.value).split("; ")
    assert len(parts) == 2 and all(part.startswith(f"OpenEnv server {u}: cannot read /schema (")
                                   for part, u in zip(parts, urls))
    assert all(discovery.pool.is_down(u) for u in urls)


def test_a_malformed_description_is_a_fault_saying_which_route(make, fake):
    fake.components = [{"low": 0}]  # no name
    discovery = make([fake.base])
    with pytest.raises(RemoteEnvError, match=r"cannot read /schema \(OpenEnv server .* /schema: reward_components "
                                             r"is not a list of \{name, low, high, weight\}\)"):
        discovery.describe("all")


def test_a_server_that_wants_a_token_is_refused_at_once(make, fake):
    fake.token = "secret"
    discovery = make([fake.base])
    with pytest.raises(_RefusedError, match="401: it requires a token and no token was given"):
        discovery.describe("all")
    assert not discovery.pool.is_down(fake.base)  # not a fault: no other server would take this client
    with_token = make([fake.base], headers={"Authorization": "Bearer secret"})
    assert with_token.describe("all")[fake.base]["tasks"] == ["t1", "t2"]


def test_components_are_learned_from_one_first_episode_per_pool(make, fake, caplog):
    steps = []

    def step(data, turn):
        steps.append(data)
        return observation("done", reward=1.0, done=True, reward_components={"x": 0.5, "y": 1.0})

    fake.on_step = step
    discovery = make([fake.base])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        learned = discovery.learn(fake.base, Task("t1", {"reset": {"task_id": "t1"}}), "text", "message", None)
        again = discovery.learn(fake.base, Task("t2", {"reset": {"task_id": "t2"}}), "text", "message", None)
    assert learned == {"names": ["x", "y"], "source": "metadata['reward_components']", "when": "first step",
                       "server": fake.base, "declared": None}
    assert again is learned and fake.sessions == 1  # once: every env of the list waits for the one that asks
    assert steps == [{"message": PROBE_TEXT}]
    assert [r.getMessage() for r in caplog.records] == [
        f"learned reward components ['x', 'y'] from the first step of {fake.base} "
        "(metadata['reward_components']); a later change is an error (set env.reward_names to declare them)"]


def test_a_reference_is_read_from_the_task_route_and_its_absence_says_how_to_serve_it(make, fake):
    discovery = make([fake.base])
    assert discovery.reference("toy", "all", "t2", 1) == ["the answer"]
    fake.reference_status = 403
    with pytest.raises(RemoteReferenceError, match=r"refuses reference answers \(403\): start it with "
                                                    r"--serve-references"):
        discovery.reference("toy", "all", "t2", 1)
    fake.reference_status = 200
    with pytest.raises(RemoteEnvError, match="answered for another task than t2"):
        discovery.reference("toy", "all", "t2", 0)
    with pytest.raises(RemoteReferenceError, match="lists no tasks, so it has no reference answers"):
        discovery.reference(None, "all", "seed-0", 0)
