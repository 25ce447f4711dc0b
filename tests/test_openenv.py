"""corrgrpo envs served over OpenEnv and consumed back: real servers on localhost.

``corrgrpo serve`` runs the ``openenv`` package's own server; ``env.id: openenv://``
runs its WebSocket client. In-process and remote envs must give identical
observations and reward vectors for the same task and action, and every failure
over the wire must be an error that says what went wrong, with the server still up.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("openenv", reason="the openenv extra is not installed (pip install -e '.[openenv]')")

import httpx  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402

import corrgrpo_envs  # noqa: E402
from corrgrpo_envs.integrations.openenv_client import RemoteEnvError, parse_urls  # noqa: E402
from corrgrpo_envs.integrations.openenv_server import (  # noqa: E402
    MultiRewardOpenEnv,
    TextAction,
    max_message_bytes,
)
from corrgrpo_envs.vector import GroupedVectorEnv  # noqa: E402
from tests.openenv_servers import corrgrpo_serve  # noqa: E402

TOY = "corrgrpo/ScaleDominance-v0"
HAS_AGENTDOJO = importlib.util.find_spec("agentdojo") is not None

#: per domain: the env kwargs both sides use (efficiency off: it times the program, so it varies run to run)
DOMAINS = {
    TOY: {"split": "all", "num_tasks": 16},
    "corrgrpo/ToolCall-v0": {"split": "all"},
    "corrgrpo/Code-v0": {"split": "all", "efficiency": "off"},
    "corrgrpo/AgentDojo-v0": {"split": "all"},
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("openenv")
    started = {}
    try:
        for env_id, kwargs in DOMAINS.items():
            if env_id == "corrgrpo/AgentDojo-v0" and not HAS_AGENTDOJO:
                continue
            args = [f"{k}={v}" for k, v in kwargs.items()]
            # the task listing and sft tests read reference answers, which are off by default
            started[env_id] = corrgrpo_serve(env_id, *args, tmp=tmp, options=("--serve-references",)).launch()
        for server in started.values():  # started together, waited for in turn
            server.start()
        yield started
    finally:
        for s in started.values():
            s.stop()


def _lines(obs: dict) -> list:
    """A conversation with each message's lines sorted.

    AgentDojo's tool results list some sets (an event's participants) in string-hash
    order, which differs between two Python processes (PYTHONHASHSEED); the same
    process always agrees with itself, and the rewards never depend on it.
    """
    return [(m["role"], sorted(str(m["content"]).splitlines())) for m in obs["messages"]]


def _same_observation(remote: dict, local: dict, env_id: str) -> bool:
    if env_id == "corrgrpo/AgentDojo-v0":
        return _lines(remote) == _lines(local) and remote["tools"] == local["tools"]
    return remote == local


def _actions(env, task_id: str, k: int) -> list[str]:
    """The k-th action plan for a task: the reference, or a reference with a wrong turn."""
    try:
        ref = list(env.reference_action(task_id))
    except NotImplementedError:
        ref = ["hello 123"]
    if k % 3 == 0:
        return ref
    if k % 3 == 1:
        return ref[:-1] + ["I will not do that."]
    return [ref[0][: len(ref[0]) // 2] or "x", *ref[1:]]


@pytest.mark.slow
@pytest.mark.parametrize("env_id", list(DOMAINS))
def test_in_process_and_remote_give_identical_rewards_on_200_steps(servers, env_id):
    if env_id not in servers:
        pytest.skip(f"{env_id} is not served here because agentdojo is not installed")
    kwargs = DOMAINS[env_id]
    local = corrgrpo_envs.make(env_id, **kwargs)
    remote = corrgrpo_envs.make(servers[env_id].url, split="all")  # the rest is the server's
    lu, ru = local.unwrapped, remote.unwrapped
    assert ru.reward_names == lu.reward_names
    np.testing.assert_array_equal(ru.reward_space.low, lu.reward_space.low)
    np.testing.assert_array_equal(ru.reward_space.high, lu.reward_space.high)
    np.testing.assert_array_equal(ru.reward_weights, lu.reward_weights)
    assert ru.task_ids == lu.task_ids
    rng = np.random.default_rng(0)
    steps, episode, nonzero = 0, 0, 0
    try:
        while steps < 200:
            task_id = lu.task_ids[int(rng.integers(len(lu.task_ids)))]
            obs_l, info_l = local.reset(seed=episode, options={"task_id": task_id})
            obs_r, info_r = remote.reset(seed=episode, options={"task_id": task_id})
            assert _same_observation(obs_r, obs_l, env_id) and info_r["task_id"] == info_l["task_id"] == task_id
            for action in _actions(lu, task_id, episode):
                out_l = local.step(action)
                out_r = remote.step(action)
                steps += 1
                np.testing.assert_array_equal(out_r[1], out_l[1], err_msg=f"{task_id}: {action[:60]!r}")
                assert out_r[1].dtype == np.float32
                assert _same_observation(out_r[0], out_l[0], env_id) and out_r[2:4] == out_l[2:4]
                assert out_r[4]["reward_components"] == out_l[4]["reward_components"]
                assert out_r[4].get("error") == out_l[4].get("error")
                nonzero += bool(np.any(out_l[1] != 0))
                if out_l[2] or out_l[3]:
                    break
            episode += 1
    finally:
        local.close()
        remote.close()
    assert nonzero > 20  # the comparison covered rewarded steps, not only zeros


@pytest.mark.slow
def test_openenv_validate_passes_on_every_served_env(servers):
    procs = {  # the validations run side by side
        env_id: subprocess.Popen(
            [sys.executable, "-m", "openenv.cli", "validate", "--url", server.base, "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for env_id, server in servers.items()
    }
    for env_id, proc in procs.items():
        out, _ = proc.communicate(timeout=180)
        report = json.loads(out)
        assert report["passed"] is True, (env_id, report["summary"])


def test_reward_names_bounds_and_weights_are_readable_before_the_first_step(servers):
    base = servers["corrgrpo/ToolCall-v0"].base
    schema = httpx.get(f"{base}/schema").json()
    table = corrgrpo_envs.make("corrgrpo/ToolCall-v0").unwrapped.reward_table()
    assert schema["observation"]["reward_components"] == table
    assert schema["action"]["required"] == ["message"]
    meta = httpx.get(f"{base}/metadata").json()
    assert meta["name"] == "corrgrpo/ToolCall-v0" and "`values` | -1.5 | 1.5 | 1" in meta["readme_content"]


def test_reward_is_the_weighted_total_and_components_ride_in_metadata(servers):
    weights = np.array([0.5, 1.0, 2.0])
    env = MultiRewardOpenEnv(TOY, {"num_tasks": 4, "reward_weights": weights.tolist()})
    obs = env.reset(task_id="prompt-0001")
    assert obs.metadata["reward_spec"][2] == {"name": "word_with_a", "low": 0.0, "high": 1.0, "weight": 2.0}
    obs = env.step(TextAction(message="banana 12345"))
    assert obs.metadata["reward_components"] == {"digits": 5.0, "has_a": 1.0, "word_with_a": 1.0}
    assert obs.reward == pytest.approx(0.5 * 5 + 1 + 2)
    named = dict(env.rubric.named_rubrics())
    assert list(named) == ["digits", "has_a", "word_with_a"]
    assert [r.last_score for r in named.values()] == [5.0, 1.0, 1.0]
    assert obs.done and env.state.done and env.state.step_count == 1
    env.close()


def test_task_listing_follows_the_env_splits(servers):
    base = servers[TOY].base
    assert httpx.get(f"{base}/list_environments").json() == ["ScaleDominance-v0"]
    env = corrgrpo_envs.make(TOY, **DOMAINS[TOY]).unwrapped
    for split in ("all", "train", "eval"):
        expected = env.tasks.split(split).ids if split != "all" else env.task_ids
        listed = httpx.post(f"{base}/ScaleDominance-v0/tasks", json={"split": split}).json()["tasks"]
        assert [t["id"] for t in listed] == expected
        assert httpx.post(f"{base}/ScaleDominance-v0/num_tasks", json={"split": split}).json() == {
            "num_tasks": len(expected)
        }
    task = httpx.post(f"{base}/ScaleDominance-v0/task", json={"split": "eval", "index": 1}).json()["task"]
    assert task["id"] == env.tasks.split("eval").ids[1] and task["reference"] == env.reference_action(task["id"])
    bad = httpx.post(f"{base}/ScaleDominance-v0/tasks", json={"split": "dev"})
    assert bad.status_code == 400 and "unknown split 'dev'" in bad.text
    # reset by OpenEnv's split + index lands on that task
    with GenericEnvClient(base_url=base).sync() as client:
        result = client.reset(split="eval", index=1)
        assert result.observation["task_id"] == task["id"]
    remote = corrgrpo_envs.make(servers[TOY].url, split="eval").unwrapped
    assert remote.task_ids == env.tasks.split("eval").ids
    assert remote.reference_action(task["id"]) == task["reference"]
    remote.close()


def test_errors_over_the_wire_are_clear_and_the_server_survives(servers):
    base = servers[TOY].base
    with GenericEnvClient(base_url=base).sync() as client:
        with pytest.raises(RuntimeError, match="reset before stepping"):
            client.step({"message": "hello"})
        with pytest.raises(RuntimeError, match=r"unknown task id 'prompt-9999'.*VALIDATION|unknown task id 'prompt-9999'"):
            client.reset(task_id="prompt-9999")
        with pytest.raises(RuntimeError, match="unknown reset arguments \\['colour'\\]"):
            client.reset(colour="red")
        client.reset(task_id="prompt-0001")
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            client.step({"text": "hello"})  # malformed: no 'message', unknown 'text'
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            client.step({"message": 42})
        assert client.step({"message": "abc 12"}).done  # the session still works
        with pytest.raises(RuntimeError, match="episode on task 'prompt-0001' has ended"):
            client.step({"message": "again"})
    # an action longer than the env accepts is scored as in-process (lowest reward, error)
    with GenericEnvClient(base_url=base).sync() as client:
        client.reset(task_id="prompt-0001")
        long = client.step({"message": "a" * 200_001})
        assert long.metadata["reward_components"] == {"digits": 0.0, "has_a": 0.0, "word_with_a": 0.0}
        assert "too long" in long.observation["info"]["error"]
    # a message beyond what the server reads closes that connection with 1009, nothing else
    client = GenericEnvClient(base_url=base, message_timeout_s=10).sync()
    client.reset(task_id="prompt-0001")
    with pytest.raises(Exception, match="1009|too big") as err:
        client.step({"message": "a" * (max_message_bytes() + 10)})
    assert not isinstance(err.value, TimeoutError)
    client.close()
    assert httpx.get(f"{base}/health").json()["status"] == "healthy"
    with GenericEnvClient(base_url=base).sync() as client:
        assert client.reset(task_id="prompt-0002").observation["task_id"] == "prompt-0002"


def test_sessions_are_isolated(servers):
    base = servers[TOY].base
    with GenericEnvClient(base_url=base).sync() as a, GenericEnvClient(base_url=base).sync() as b:
        ra = a.reset(task_id="prompt-0001")
        rb = b.reset(task_id="prompt-0002")
        assert ra.observation["messages"] != rb.observation["messages"]
        assert a.state()["task_id"] == "prompt-0001" and b.state()["task_id"] == "prompt-0002"
        a.step({"message": "a 1"})
        assert a.state()["done"] and not b.state()["done"]
        assert b.step({"message": "b 22"}).metadata["reward_components"]["digits"] == 2.0


def test_remote_env_errors_name_the_server_and_task(servers):
    remote = corrgrpo_envs.make(servers[TOY].url, split="all")
    remote.reset(options={"task_id": "prompt-0003"})
    remote.step("x 1")
    with pytest.raises(RuntimeError, match="episode has ended"):
        remote.step("again")  # refused locally, as in-process
    with pytest.raises(KeyError):
        remote.reset(options={"task_id": "nope"})
    remote.close()
    with pytest.raises(RemoteEnvError, match=r"publishes rewards \['digits', 'has_a', 'word_with_a'\], the config says \['a', 'b', 'c'\]"):
        corrgrpo_envs.make(servers[TOY].url, reward_names=["a", "b", "c"])
    with pytest.raises(RemoteEnvError, match="OpenEnv server http://127.0.0.1:9: cannot read /schema"):
        corrgrpo_envs.make("openenv://127.0.0.1:9")


def test_grouped_vector_env_over_a_server_matches_in_process(servers):
    url = servers[TOY].url
    task_ids = ["prompt-0001", "prompt-0002", "prompt-0003"]
    actions = ["a 1", "bb 22", "cat 333", "a", "12", "banana 1"]
    results = []
    for spec, kwargs in ((TOY, DOMAINS[TOY]), (url, {"split": "all"})):
        with GroupedVectorEnv(spec, num_groups=3, group_size=2, workers=2, **kwargs) as venv:
            venv.reset(task_ids=task_ids)
            _, rewards, terminated, _, infos = venv.step(actions)
            results.append(rewards)
            assert terminated.all()
    np.testing.assert_array_equal(results[1], results[0])


def test_urls_parse_to_http_bases():
    assert parse_urls("openenv://a:1,openenv://b:2") == ["http://a:1", "http://b:2"]
    assert parse_urls(["openenv://a:1", "openenv://b:2/"]) == ["http://a:1", "http://b:2"]
    with pytest.raises(ValueError, match="not an OpenEnv server address"):
        parse_urls("openenv://https://a")
    assert json.loads(json.dumps(parse_urls("openenv://h:8000"))) == ["http://h:8000"]


def test_eval_with_the_reference_policy_over_a_server_matches_in_process(servers, tmp_path):
    from corrgrpo.trainer.cli import main

    scores = {}
    for name, env_id in (("local", TOY), ("remote", servers[TOY].url)):
        cfg = tmp_path / f"{name}.yaml"
        extra = "  num_tasks: 16\n" if env_id == TOY else ""
        cfg.write_text(f"env:\n  id: {env_id}\n{extra}model:\n  name_or_path: tiny\n")
        out = tmp_path / f"{name}.json"
        assert main(["eval", str(cfg), "--policy", "reference", "--split", "eval", "--limit", "6",
                     "--out", str(out)]) == 0
        scores[name] = json.loads(out.read_text())["metrics"]
    assert scores["remote"] == scores["local"] and scores["local"]["digits"] > 0


def test_sft_reads_the_references_from_a_server(servers, tmp_path):
    from corrgrpo.trainer.cli import main

    cfg = tmp_path / "sft.yaml"
    cfg.write_text(
        f"env:\n  id: {servers[TOY].url}\nmodel:\n  name_or_path: tiny\n"
        "data:\n  source: env\n  train_split: train\n  eval_split: eval\n  max_eval_examples: 4\n  max_length: 512\n"
        f"train:\n  steps: 2\n  batch_size: 4\n  eval_every: 2\n  save_every: 0\n  seed: 0\n"
        f"  output_dir: {tmp_path / 'run'}\n"
    )
    assert main(["sft", str(cfg)]) == 0
    assert (tmp_path / "run" / "model" / "config.json").exists()
