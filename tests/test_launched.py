"""Launched runs end: a hung worker reports its stack, a hung session is killed, and the process
group is destroyed only after what holds it (the teardown that could hang for ever)."""

from __future__ import annotations

import os
import re
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.launched import ROOT, run_bounded
from tests.ports import free_port
from tests.waiting import wait_until

HUNG_WORKER = textwrap.dedent("""
    import time
    from tests.launched import arm_hang_report

    def wait_for_a_peer_that_never_comes():
        time.sleep(60)  # the hang under test: far past the 1 s hang report

    arm_hang_report(1)
    wait_for_a_peer_that_never_comes()
""")

# a launcher whose worker outlives it and keeps the output pipe: the session kill must reach both
# (their 60 s sleeps are the hang under test, far past the 2 s deadline)
ORPHANING_LAUNCHER = textwrap.dedent("""
    import subprocess, sys, time
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print("launched", worker.pid, flush=True)
    time.sleep(60)
""")


def test_a_hung_worker_fails_with_its_stack():
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as failure:
        run_bounded([sys.executable, "-c", HUNG_WORKER], env=os.environ, timeout=120)
    message = str(failure.value)
    assert "exited 1" in message  # not "ran past 120 s": the report ended it, not the deadline
    assert "wait_for_a_peer_that_never_comes" in message  # faulthandler's stack of the stuck thread
    # armed at 1 s (about 2 s with the start-up, quiet): well before the worker's own 60 s sleep
    assert time.monotonic() - start < 45


def test_a_hung_session_is_killed_whole_at_the_deadline():
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as failure:
        run_bounded([sys.executable, "-c", ORPHANING_LAUNCHER], env=os.environ, timeout=2)
    message = str(failure.value)
    assert "ran past 2 s" in message
    worker = int(re.search(r"launched (\d+)", message).group(1))
    # a kill that waited for the launcher or the orphan to end (or for the pipe to close) would
    # take their 60 s; at the 2 s deadline it takes about 2 s quiet
    assert time.monotonic() - start < 40
    # the orphan died with the session (its new parent may take a moment to reap it)
    wait_until(lambda: not _alive(worker), timeout=30, message=f"orphaned worker {worker} gone")


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie its new parent has yet to reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_finished_run_returns_its_output():
    assert run_bounded([sys.executable, "-c", "print('done')"], env=os.environ).strip() == "done"


# a DDP model kept alive only by a reference cycle, as a trainer's objects often are: if the
# collector frees it after the group is gone, its reducer drops the group's last reference while
# holding the GIL, and gloo's destructor can wait for ever on a thread that needs the GIL
CYCLE_HELD_MODEL = textwrap.dedent("""
    import os, sys, weakref
    import torch, torch.distributed as dist
    from corrgrpo.trainer.cli import close_process_group

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    model.itself = model
    dist.barrier()
    held = weakref.ref(model)
    del model
    destroy = dist.destroy_process_group

    def destroy_and_report(*args):
        print("model alive when the group went:", held() is not None, flush=True)
        destroy(*args)

    dist.destroy_process_group = destroy_and_report
    close_process_group()
    print("group initialised:", dist.is_initialized())
""")


def test_the_process_group_goes_after_the_objects_that_hold_it():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = run_bounded([sys.executable, "-c", CYCLE_HELD_MODEL, str(free_port())], env=env, cwd=ROOT, timeout=120)
    assert "model alive when the group went: False" in out
    assert "group initialised: False" in out
