"""The code env's OpenEnv server in a container built offline from corrgrpo/python:bookworm.

Runs where a Docker engine answers and the base image is there (``bash
scripts/docker_engine.sh``), like the docker sandbox tests; skips with the reason
elsewhere. Builds ``docker/openenv/Dockerfile`` with ``docker/openenv/build.sh``, starts
the container, steps it from the host and checks the rewards against the in-process
env, and asks the container which sandbox backends it has.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("openenv", reason="the openenv extra is not installed (pip install -e '.[openenv]')")

import httpx  # noqa: E402

import corrgrpo_envs  # noqa: E402
from tests.openenv_servers import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASE = "corrgrpo/python:bookworm"
TAG = "corrgrpo-openenv-code:test"


def _engine_and_image() -> str | None:
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    try:
        ok = subprocess.run(["docker", "image", "inspect", BASE], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the docker engine does not answer ({exc})"
    return None if ok else f"the image {BASE} is not built (bash scripts/docker_engine.sh)"


@pytest.mark.slow
def test_the_code_env_serves_from_a_container_like_in_process(tmp_path):
    reason = _engine_and_image()
    if reason:
        pytest.skip(f"no Docker run because {reason}")
    subprocess.run(
        ["bash", "docker/openenv/build.sh", "corrgrpo/Code-v0", TAG, "split=all dataset=humaneval efficiency=off"],
        cwd=ROOT, check=True, timeout=900, env={**__import__("os").environ, "PYTHON": sys.executable},
    )
    port = free_port()
    cid = subprocess.run(["docker", "run", "-d", "--rm", "-p", f"127.0.0.1:{port}:8000", TAG],
                         capture_output=True, text=True, check=True).stdout.strip()
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                logs = subprocess.run(["docker", "logs", cid], capture_output=True, text=True).stdout
                pytest.fail(f"the container did not answer /health in 120 s:\n{logs[-2000:]}")
            time.sleep(0.5)
        remote = corrgrpo_envs.make(f"openenv://127.0.0.1:{port}", split="all")
        local = corrgrpo_envs.make("corrgrpo/Code-v0", split="all", efficiency="off")
        assert remote.unwrapped.task_ids == local.unwrapped.task_ids
        wrong = "```python\ndef f(x):\n    return None\n```"
        for task_id in local.unwrapped.task_ids[:6]:
            for action in (local.unwrapped.reference_action(task_id)[0], wrong):
                remote.reset(options={"task_id": task_id})
                local.reset(options={"task_id": task_id})
                np.testing.assert_array_equal(remote.step(action)[1], local.step(action)[1])
        remote.close()
        local.close()
        report = subprocess.run(
            ["docker", "exec", cid, "python3", "-c",
             "import argparse; from corrgrpo_envs.code import commands as c; p = argparse.ArgumentParser(); "
             "c.add_arguments(p); c.run(p.parse_args(['sandboxes']))"],
            capture_output=True, text=True, timeout=120,
        ).stdout
        assert "auto     -> " in report, report  # a backend was chosen; which one the report says
    finally:
        subprocess.run(["docker", "stop", cid], capture_output=True, timeout=60)
