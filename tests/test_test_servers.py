"""The tests' own server helper: a server outlives no test run (a killed pytest worker included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.openenv_servers import ROOT
from tests.waiting import wait_until

_PARENT = """
import sys, time
from pathlib import Path
from tests.openenv_servers import Server
server = Server([sys.executable, "-c", "import time; time.sleep(120)"], 0, Path(sys.argv[1])).launch()
print(server.proc.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie (ended, not yet reaped) is gone too
        return stat.read().split(") ", 1)[1][0] != "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_a_server_ends_when_the_process_that_started_it_is_killed(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(tmp_path / "server.log")], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)  # no handler, no atexit: only the kernel can tell the child
        parent.wait(timeout=30)
        wait_until(lambda: not _alive(child), timeout=30, message="the server ended with its parent")
    finally:
        parent.kill()
