"""``corrgrpo redteam``: the OpenEnv boundary's attack classes (a served env under attack, the
client against hostile servers) hold, each with its measured figures, and the top-level
command lists every domain's classes."""

from __future__ import annotations

import argparse
import re

import pytest

from trainer.commands import redteam as command

SERVER = ["openenv_server_session_flood", "openenv_server_oversize_body", "openenv_server_request_flood",
          "openenv_server_reference_answers", "openenv_server_token"]
CLIENT = ["openenv_client_trickle", "openenv_client_huge_observation", "openenv_client_lying_rewards"]


def test_list_names_every_domain(capsys):
    assert command.run(argparse.Namespace(backend="process", only=None, list=True)) == 0
    names = {line.split()[0] for line in capsys.readouterr().out.splitlines() if line}
    assert {"fork_bomb", "file_watches", "judge_deadline", "agentdojo_pasted_in_disguise"} <= names
    try:
        import openenv.core  # noqa: F401
    except ImportError:
        assert "OpenEnv" in names  # the one line that says why they are absent
    else:
        assert set(SERVER + CLIENT) <= names


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_openenv_classes_hold(capsys):
    pytest.importorskip("openenv", reason="the openenv extra is not installed")
    code = command.run(argparse.Namespace(backend="process", only=SERVER + CLIENT, list=False))
    out = capsys.readouterr().out.splitlines()
    assert code == 0, out
    assert out[-1] == f"{len(SERVER + CLIENT)} of {len(SERVER + CLIENT)} attack classes held", out
    for name in SERVER:
        (line,) = [ln for ln in out if ln.split()[1:2] == [name]]
        assert line.startswith("held"), line
        p99, rss = re.search(r"p99 (\d+) ms.*RSS \+(-?[\d.]+) MB", line).groups()
        assert int(p99) < 500 and float(rss) < 100, line
    for name in CLIENT:
        (line,) = [ln for ln in out if ln.split()[1:2] == [name]]
        assert line.startswith("held") and re.search(r"in \d+\.\d\d s", line), line
