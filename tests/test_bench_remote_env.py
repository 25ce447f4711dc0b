"""bench.remote_env's CPU accounting: what the machine and the client spend per member step."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import corrgrpo_envs
from bench.remote_env import _machine_busy_s, _own_cpu_s, _processes_cpu_s, rounds_per_second


def test_the_machine_count_includes_this_process_busy_time():
    machine, own = _machine_busy_s(), _own_cpu_s()
    end = time.process_time() + 0.5
    while time.process_time() < end:  # 0.5 s of this process's CPU
        pass
    spent = _own_cpu_s() - own
    assert spent >= 0.49
    # other processes can only add to the machine's count; it is sampled a 10 ms tick at a time
    # per core, so 0.1 s of slack (a count that left this process out would miss 0.5 s)
    assert _machine_busy_s() - machine >= spent - 0.1


def test_rounds_report_the_rate_and_its_cpu_per_member_step():
    env_id = "corrgrpo/ScaleDominance-v0"
    probe = corrgrpo_envs.make(env_id, split="all").unwrapped
    task_ids = list(probe.task_ids)[:4]
    references = {t: probe.reference_action(t)[0] for t in task_ids}
    probe.close()
    # 8000 member steps, about 0.3 s of client CPU quiet: 20 rounds took ~10 ms, a single tick
    # of the machine's count, which then said nothing about the client's share of it
    steps = 1000 * 2 * 4
    measured = rounds_per_second(env_id, {}, groups=2, group_size=4, rounds=1000, threads=2,
                                 references=references, task_ids=task_ids)
    assert measured.steps_per_s > 0
    assert measured.client_cpu_ms > 0
    assert measured.server_cpu_ms == 0  # no server in-process
    # the client's CPU is part of the machine's. The machine's is sampled per tick and core
    # (threads that run between ticks can be missed), so half the client's, less a tick per
    # core at each end; a count that left the client out reads about nothing on a quiet machine
    ticks_ms = 2 * (os.cpu_count() or 1) * 1000 / os.sysconf("SC_CLK_TCK")
    assert measured.machine_cpu_ms >= 0.5 * measured.client_cpu_ms - ticks_ms / steps, measured
    assert 0 <= measured.cores_busy


def test_a_server_process_cpu_is_read_from_its_stat_file():
    assert abs(_processes_cpu_s((os.getpid(),)) - _own_cpu_s()) < 0.05
    spin = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\ninput()"
    child = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while _processes_cpu_s((child.pid,)) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 0.3 <= _processes_cpu_s((child.pid,)) < 5  # its spin, start-up and the wait
    finally:
        child.communicate(b"\n", timeout=30)
    assert _processes_cpu_s(()) == 0
