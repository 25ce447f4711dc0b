"""``corrgrpo redteam``: the OpenEnv boundary's attack classes (a served env under attack, the
client against hostile servers) hold, each with its measured figures, and the top-level
command lists every domain's classes."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from corrgrpo_envs.redteam import command

ROOT = Path(__file__).resolve().parents[1]
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
def test_the_openenv_classes_hold():
    pytest.importorskip("openenv", reason="the openenv extra is not installed")
    # In a process of its own, as a user runs it: the probes time a client in their own process,
    # and threads left by earlier tests in the test process would count against its round trips.
    proc = subprocess.run([sys.executable, "-m", "trainer.cli", "redteam", "--only", *SERVER, *CLIENT],
                          cwd=ROOT, capture_output=True, text=True, timeout=280,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = proc.stdout.splitlines()
    assert proc.returncode == 0, [line for line in out if not line.startswith("held")] + [proc.stderr[-2000:]]
    assert out[-1] == f"{len(SERVER + CLIENT)} of {len(SERVER + CLIENT)} attack classes held", out
    for name in SERVER:
        (line,) = [ln for ln in out if ln.split()[1:2] == [name]]
        assert line.startswith("held"), line
        p99, rss, logged = re.search(r"p99 (\d+) ms.*RSS \+(-?[\d.]+) MB.*log \+(\d+) bytes", line).groups()
        assert int(p99) < 500 and float(rss) < 100 and int(logged) < 4096, line
    for name in CLIENT:
        (line,) = [ln for ln in out if ln.split()[1:2] == [name]]
        assert line.startswith("held") and re.search(r"in \d+\.\d\d s", line), line
