"""Run a check script under ``accelerate launch`` so that a hang fails with its stack in minutes.

Two bounds, one on each side of the launch:

* each launched process calls :func:`arm_hang_report` first: past ``WORKER_DEADLINE_S`` it
  prints every thread's stack (faulthandler) and exits 1, and the launcher then stops the other
  process, so a stuck collective or teardown shows where it stuck;
* the test runs the launcher through :func:`run_bounded`, in a session of its own, and past a
  later deadline kills the whole session: workers orphaned by a killed launcher would otherwise
  keep the output pipe open and hold the test until pytest's own timeout.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

#: a launched check takes 15-30 s on 2 loaded cores; ten times that is a hang, not slowness
WORKER_DEADLINE_S = 300
#: the launcher's own bound: the workers' reports come first
LAUNCH_DEADLINE_S = WORKER_DEADLINE_S + 60
_TAIL_CHARS = 8000
ROOT = Path(__file__).resolve().parents[1]


def arm_hang_report(seconds: float = WORKER_DEADLINE_S) -> None:
    """In a launched process: past ``seconds``, print every thread's stack and exit 1."""
    faulthandler.dump_traceback_later(seconds, exit=True)


def run_bounded(cmd: Sequence[str], *, env: Mapping[str, str], cwd: Path = ROOT,
                timeout: float = LAUNCH_DEADLINE_S) -> str:
    """Run ``cmd`` (a launcher or a plain python and a check script); return its output, or fail
    the test with its tail.

    The failure names the exit code or the deadline and shows the last lines the launcher and its
    workers printed (a hung worker's stacks among them).
    """
    # the checkout on the path: the launched scripts import this module (and other test helpers)
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))}
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(list(cmd), env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _kill_session(proc)
        log.seek(0)
        output = log.read().decode(errors="replace")
    if code != 0:
        why = f"ran past {timeout:.0f} s (session killed)" if code is None else f"exited {code}"
        pytest.fail(f"{Path(cmd[0]).name} {cmd[1] if len(cmd) > 1 else ''} {why}; the last output:\n"
                    f"{output[-_TAIL_CHARS:]}", pytrace=False)
    return output


def _kill_session(proc: subprocess.Popen) -> None:
    """Kill whatever of the launcher's session is left (a finished run leaves nothing)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
