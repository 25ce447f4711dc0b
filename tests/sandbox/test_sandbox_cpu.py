"""CPU time a program cannot hide: it comes from the control group every process of the program
is born in (cgroup v2 ``cpu.stat``, v1 ``cpuacct.usage``), so work moved into a child the kernel
never accounts to its parent (SIGCHLD ignored), a double-forked daemon or a thread pool counts
the same; where no group can count it, efficiency is reported as unavailable."""

from __future__ import annotations

import json
import textwrap

import pytest

from corrgrpo_envs.code.env import CodeEnv
from corrgrpo_envs.code.metrics import code_metrics
from corrgrpo_envs.redteam.code_domain import HIDDEN_WORK_PLACES, WORK
from corrgrpo_sandbox import Limits, cgroups, make_sandbox
from tests.sandbox.backends import backend_params, open_sandbox

LIMITS = Limits(timeout=10.0, memory_mb=256)

# the same work, done where each program puts it (the red team's hidden-CPU-time attack)
PLACES = HIDDEN_WORK_PLACES


def _program(place: str, n: int, seconds: float) -> str:
    return WORK + f"N, T = {n}, {seconds}\n" + textwrap.dedent(PLACES[place])


@pytest.fixture(params=backend_params())
def sandbox(request):
    yield from open_sandbox(request.param, LIMITS)


def test_hiding_work_in_children_daemons_or_threads_never_lowers_cpu_time(sandbox):
    main = sandbox.run(_program("main", 1_500_000, 0.0))
    assert main.status == "ok", main.stderr
    if main.cpu_seconds is None:  # no group counts it here: then no way of doing it gets a number
        assert sandbox.name == "docker" or cgroups.cpu_unavailable_reason()
        for place in PLACES:
            assert sandbox.run(_program(place, 1_500_000, 0.6)).cpu_seconds is None
        return
    assert main.cpu_seconds >= 0.05
    # Hidden work counted about 5 % of the honest time where it could be hidden; half of it
    # leaves room for the noise of a loaded machine.
    for place in PLACES:
        hidden = sandbox.run(_program(place, 1_500_000, main.cpu_seconds * 4 + 0.2))
        assert hidden.status == "ok", (place, hidden.stderr)
        assert hidden.cpu_seconds is not None and hidden.cpu_seconds >= 0.5 * main.cpu_seconds, (
            place, hidden.cpu_seconds, main.cpu_seconds)


def test_the_program_cannot_reach_its_control_group(sandbox):
    probe = '''
import os, glob
found = [p for p in glob.glob("/sys/fs/cgroup/**/cgroup.procs", recursive=True)]
# (through the server's root, pid 1's: it is not dumpable, so its /proc files stay closed)
found += [p for p in glob.glob("/proc/*/root/sys/fs/cgroup/**/cgroup.procs", recursive=True)]
moved = []
for path in found:
    try:
        with open(path, "w") as f:
            f.write("0")
        moved.append(path)
    except OSError:
        pass
print("found", found, "moved", moved)
'''
    result = sandbox.run(probe)
    assert result.status == "ok", result.stderr
    assert "moved []" in result.stdout, result.stdout
    if sandbox.name != "docker":
        assert "found []" in result.stdout, result.stdout


@pytest.mark.parametrize("reuse", ["fork", "fresh"])
def test_cgroup_v1_cpuacct_counts_too(monkeypatch, reuse):
    """The same accounting from the v1 ``cpuacct`` hierarchy, where there is one."""
    monkeypatch.setattr(cgroups, "CPU_HIERARCHIES", ("v1",))
    monkeypatch.setattr(cgroups, "_STATE", {})
    if cgroups.cpu_accounting() != "cgroup-v1":
        pytest.skip(f"no usable cgroup v1 cpuacct hierarchy here: {cgroups.cpu_unavailable_reason()}")
    with make_sandbox("process", LIMITS, reuse=reuse) as box:
        main = box.run(_program("main", 1_500_000, 0.0))
        hidden = box.run(_program("auto_reaped_child", 1_500_000, 1.0))
    assert main.status == hidden.status == "ok", (main.stderr, hidden.stderr)
    assert main.cpu_seconds is not None and main.cpu_seconds >= 0.05
    assert hidden.cpu_seconds is not None and hidden.cpu_seconds >= 0.5 * main.cpu_seconds


def test_cgroup_v2_is_what_counts_on_this_machine():
    if not cgroups.cpu_accounting():
        pytest.skip(f"no control group can count CPU time here: {cgroups.cpu_unavailable_reason()}")
    assert cgroups.cpu_accounting() == "cgroup-v2" or "v2" not in "".join(cgroups.CPU_HIERARCHIES)


# ------------------------------------------------------------------ the code env's reward
def _task_file(folder) -> str:
    reference = "def heavy(n):\n" + textwrap.indent(WORK.strip() + "\nreturn work(n)\n", "    ")
    row = {"task_id": "heavy", "prompt": "", "entry_point": "heavy", "solution": reference,
           "test": "def check(candidate):\n    assert candidate(1500000) == heavy_ref(1500000)\n\n"
                   + reference.replace("def heavy", "def heavy_ref")}
    path = folder / "heavy.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return str(path)


HIDDEN_ANSWER = '''```python
import os, signal, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)

def heavy(n):
''' + textwrap.indent(WORK.strip(), "    ") + '''
    r, w = os.pipe()
    if os.fork() == 0:
        os.write(w, str(work(n)).encode())
        os._exit(0)
    os.close(w)
    return int(os.read(r, 100))
```'''


def test_an_answer_that_hides_its_work_in_a_child_gets_no_efficiency(tmp_path):
    env = CodeEnv(dataset=_task_file(tmp_path), backend="process", timeout=10.0,
                  reference_cache_dir=tmp_path / "refs", reference_runs=1)
    try:
        honest = env.reference_action("heavy")[0]
        (r_honest, i_honest), (r_hidden, i_hidden) = env.score_many(
            ["heavy", "heavy"], [honest, HIDDEN_ANSWER], workers=1)
    finally:
        env.close()
    assert r_honest["correct"] == r_hidden["correct"] == 1.0, (i_honest, i_hidden)
    if cgroups.cpu_accounting():
        # (the same answer scored 0.88-0.98 when a rusage timed it; noise stays well below)
        assert r_hidden["efficiency"] <= r_honest["efficiency"] + 0.4, (i_honest, i_hidden)
        assert r_hidden["efficiency"] < 0.5, i_hidden
    else:
        assert i_hidden["efficiency"].startswith("unavailable"), i_hidden


def test_without_a_cpu_group_efficiency_is_unavailable_not_a_number(tmp_path, monkeypatch):
    monkeypatch.setattr(cgroups, "_STATE", {"cpu": ("", None, "no hierarchy (a test)")})
    if cgroups._probe()[0] == "v2":
        pytest.skip("the memory and pids group is a v2 group here, and it counts CPU time too")
    env = CodeEnv(dataset=_task_file(tmp_path), backend="process", timeout=10.0,
                  reference_cache_dir=tmp_path / "refs", reference_runs=1)
    try:
        rewards, info = env.score("heavy", HIDDEN_ANSWER)
    finally:
        env.close()
    assert rewards["correct"] == 1.0 and rewards["efficiency"] == 0.0, info
    assert info["efficiency"] == "unavailable: no hierarchy (a test)", info
    assert info["exec_seconds"] is None and "faster_than_reference" not in info
    metrics = code_metrics([{"task_id": "heavy", "reward_components": rewards, "info": info}])
    assert metrics["efficiency_timed"] == 0.0 and metrics["efficiency_share"] == 0.0
