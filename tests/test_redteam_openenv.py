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

from corrgrpo_envs.integrations.openenv_probe_harness import (
    P99_BOUND_S,
    P99_BOUND_VARIABLE,
    p99_floor_s,
)
from corrgrpo_envs.redteam import command

ROOT = Path(__file__).resolve().parents[1]
SERVER = ["openenv_server_session_flood", "openenv_server_oversize_body", "openenv_server_request_flood",
          "openenv_server_reference_answers", "openenv_server_token", "openenv_server_websocket_squatters",
          "openenv_server_connection_churn"]
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
    # The p99 floor is raised to 3 s: on a machine whose other work takes the cores, a flood of
    # 200 connections a second starves the server of CPU whatever its limits (a legitimate p99 of
    # 1.2 s measured beside two training runs); what the limits guard is still decided by the
    # refusals, the memory and the log (without the per-client rate, no connection is refused).
    proc = subprocess.run([sys.executable, "-m", "corrgrpo.trainer.cli", "redteam", "--only", *SERVER, *CLIENT],
                          cwd=ROOT, capture_output=True, text=True, timeout=280,
                          env={**os.environ, "PYTHONPATH": str(ROOT), P99_BOUND_VARIABLE: "3000"})
    assert max(map(len, proc.stdout.splitlines())) <= 100, proc.stdout
    out = []  # one record per class: a long detail's indented lines joined to its class's
    for line in proc.stdout.splitlines():
        if line.startswith(" ") and out:
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    if proc.returncode != 0:  # every line whole (an assertion's repr would cut the long ones)
        pytest.fail("\n".join([line for line in out if not line.startswith("held")] + [proc.stderr[-2000:]]))
    assert out[-1] == f"{len(SERVER + CLIENT)} of {len(SERVER + CLIENT)} attack classes held", out
    for name in SERVER:
        (line,) = [ln for ln in out if ln.split()[1:2] == [name]]
        assert line.startswith("held"), line
        p99, bound, rss, logged = re.search(
            r"p99 (\d+) ms over \d+ round trips \(bound (\d+) ms;.*RSS \+(-?[\d.]+) MB.*log \+(\d+) bytes",
            line).groups()
        # the bound is the raised floor, or 4x the same client's p99 just before the attack where
        # other work slows every round trip
        assert int(p99) < int(bound) and int(bound) >= 3000, line
        assert float(rss) < 100 and int(logged) < 4096, line
    for name in CLIENT:
        (line,) = [ln for ln in out if ln.split()[1:2] == [name]]
        assert line.startswith("held") and re.search(r"in \d+\.\d\d s", line), line


def test_the_round_trip_bound_is_calibrated_on_the_calm_window_before_the_attack():
    from collections import Counter

    from corrgrpo_envs.integrations.openenv_probe_harness import _Attack, _verdict

    def attack(p99: float, calm: float) -> _Attack:
        return _Attack(Counter(refused=3), p99, None, 100, 1.0, 0, calm)

    assert attack(0.1, 0.01).p99_bound == 0.5  # a quiet machine: the fixed bound
    assert attack(0.1, 0.3).p99_bound == pytest.approx(1.2)  # a busy one: 4x its calm p99
    assert attack(0.1, float("inf")).p99_bound == 0.5  # no calm trip measured
    assert _verdict(True, "refused", attack(0.9, 0.3))[0]  # slow, but no slower than the load
    held, detail = _verdict(True, "refused", attack(3.0, 0.3))  # a stall the attack caused
    assert not held and "p99 3000 ms over 100 round trips (bound 1200 ms; 300 ms before the attack)" in detail


def test_the_latency_floor_is_only_ever_raised(monkeypatch):
    monkeypatch.delenv(P99_BOUND_VARIABLE, raising=False)
    assert p99_floor_s() == P99_BOUND_S == 0.5
    for raw, floor in [("3000", 3.0), ("100", 0.5), ("nan", 0.5), ("inf", 0.5), ("fast", 0.5), ("", 0.5)]:
        monkeypatch.setenv(P99_BOUND_VARIABLE, raw)
        assert p99_floor_s() == floor, raw
