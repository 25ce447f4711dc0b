"""An env none of corrgrpo's code wrote: the one ``openenv init`` generates, served by its own app.

The generated echo env takes ``{"message": str}``, rewards ``min(0.1 * len(message), 1)``
as one scalar and never ends an episode; the consumer reads the scalar as one
component named ``reward`` and ends each episode after ``rollout.max_turns`` turns.
It trains for a few steps from a config, and passes ``openenv validate``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("openenv", reason="the openenv extra is not installed (pip install -e '.[openenv]')")

import corrgrpo_envs  # noqa: E402
from corrgrpo.trainer.config import config_from_dict  # noqa: E402
from corrgrpo.trainer.run_logger import read_metrics  # noqa: E402
from corrgrpo.trainer.trainer import Trainer  # noqa: E402
from tests.openenv_servers import Server, free_port  # noqa: E402


@pytest.fixture(scope="module")
def echo_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("echo")
    subprocess.run([sys.executable, "-m", "openenv.cli", "init", "echo_env"], cwd=tmp, check=True,
                   capture_output=True)
    app = tmp / "echo_env" / "server" / "app.py"
    # the template serves one session; a batch of P*G episodes needs one session each
    text = app.read_text()
    assert "max_concurrent_envs=1," in text
    app.write_text(text.replace("max_concurrent_envs=1,", "max_concurrent_envs=16,"))
    port = free_port()
    # the generated package's own entry point (python -m server.app), run from its folder
    argv = [sys.executable, "-m", "server.app", "--host", "127.0.0.1", "--port", str(port)]
    server = Server(argv, port, tmp / "echo.log", cwd=tmp / "echo_env").start()
    yield server
    server.stop()


def test_the_generated_env_is_a_one_component_env(echo_server):
    env = corrgrpo_envs.make(echo_server.url, reward_low=[0.0], reward_high=[1.0], num_tasks=8, max_turns=2)
    u = env.unwrapped
    assert u.reward_names == ("reward",) and u.action_field == "message"
    obs, info = env.reset(options={"task_id": "seed-3"})
    assert obs["messages"][0]["role"] == "user" and "ready" in obs["messages"][0]["content"]
    obs, reward, terminated, truncated, info = env.step("hello")
    assert reward.tolist() == [0.5] and not terminated and not truncated
    assert [m["role"] for m in obs["messages"]] == ["user", "assistant", "user"]
    obs, reward, terminated, truncated, info = env.step("hello world!")
    assert reward.tolist() == [1.0] and truncated and not terminated  # max_turns reached
    env.close()


def test_openenv_validate_passes_on_the_generated_server(echo_server):
    out = subprocess.run(
        [sys.executable, "-m", "openenv.cli", "validate", "--url", echo_server.base, "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert json.loads(out.stdout)["passed"] is True, out.stdout[-2000:]


def test_the_generated_env_trains_from_a_config(echo_server, tmp_path):
    cfg = config_from_dict({
        "env": {"id": echo_server.url, "reward_low": [0.0], "reward_high": [1.0], "num_tasks": 16},
        "model": {"name_or_path": "tiny"},
        "algorithm": {"group_size": 4, "prompts_per_step": 2},
        "rollout": {"max_new_tokens": 4, "torch_threads": 1},
        "train": {"steps": 2, "seed": 0, "split": "all", "progress": False, "tensorboard": False,
                  "output_dir": str(tmp_path / "run"), "save_final": False},
    })
    Trainer(cfg).train()
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["episodes"] == 8 and r["reward_names"] == ["reward"] for r in records)
    assert all(0.0 <= r["reward/reward/mean"] <= 1.0 for r in records)


def test_an_mcp_tool_env_takes_tool_calls_written_in_the_text(tmp_path):
    from corrgrpo_envs.integrations.openenv_client import mcp_tool_call
    from tests.openenv_servers import uvicorn_app

    assert mcp_tool_call('<tool_call>\n{"name": "add", "parameters": {"a": 1}}\n</tool_call>') == {
        "type": "call_tool", "tool_name": "add", "arguments": {"a": 1}}
    assert mcp_tool_call("no call here") is None
    server = uvicorn_app("tests.openenv_apps:mcp_adder", tmp=tmp_path).start()
    try:
        env = corrgrpo_envs.make(server.url, action_format="mcp", reward_low=[0], reward_high=[1], num_tasks=8)
        obs, _ = env.reset(options={"task_id": "seed-5"})
        assert obs["messages"] == [{"role": "user", "content": "Use add to make 5."}]
        assert [t["name"] for t in obs["tools"]] == ["add"]  # from the server's list_tools
        assert obs["tools"][0]["parameters"]["required"] == ["a", "b"]
        for text, expected in (
            ('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>', 1.0),
            ('{"name": "add", "arguments": {"a": 2, "b": 2}}', 0.0),
        ):
            env.reset(options={"task_id": "seed-5"})
            _, reward, terminated, _, _ = env.step(text)
            assert reward.tolist() == [expected] and terminated
        env.reset(options={"task_id": "seed-5"})
        _, reward, terminated, _, info = env.step("five")  # no tool call: scored locally, lowest reward
        assert reward.tolist() == [0.0] and terminated and "no tool call" in info["error"]
        env.close()
    finally:
        server.stop()
