"""Fork servers: no state passes from one program to the next, odd endings and attacks on the
server give the right status and the next program still runs, timeouts are per program."""

from __future__ import annotations

import dataclasses
import os
import pickle
import time

import pytest

from corrgrpo_sandbox import Limits, SandboxPool, carryover, make_sandbox
from corrgrpo_sandbox.bwrap import bwrap_unavailable_reason
from corrgrpo_sandbox.docker import docker_available
from corrgrpo_sandbox.process import ProcessSandbox

LIMITS = Limits(timeout=2.0, memory_mb=256, file_size_mb=4, processes=32, output_bytes=1 << 16)


def _backends() -> list:
    skips = {"process": "", "bwrap": bwrap_unavailable_reason(), "docker": docker_available()[1]}
    return [pytest.param(name, id=name, marks=pytest.mark.skipif(bool(why), reason=why or "ok"))
            for name, why in skips.items()]


@pytest.fixture(params=_backends())
def sandbox(request):
    box = make_sandbox(request.param, LIMITS, reuse="fork")
    if isinstance(box, ProcessSandbox) and box.isolation != "namespaces":
        pytest.skip("unshare namespaces unavailable: no fork servers for the process backend")
    yield box
    box.close()


def _server_pids(box) -> list[int]:
    return [s.proc.pid for s in box._forks.servers()] if box._forks else []


def _run_ok(box, program: str) -> str:
    result = box.run(program)
    assert result.status == "ok", (result.status, result.stderr)
    assert result.extra["reuse"] == "fork"
    return result.stdout


WRITE_STATE = """
import builtins, math, os, sys, json
builtins.LEAKED = 1
math.LEAKED = 1
json.dumps = None
sys.modules["leaked_module"] = math
sys.path.append("/leaked")
os.environ["LEAKED"] = "1"
for path in ("/tmp/leaked", "/tmp/work/leaked", "/var/tmp/leaked", "/dev/shm/leaked",
             "leaked", os.path.expanduser("~/leaked")):
    open(path, "w").write("secret")
os.makedirs("/tmp/deep/a/b", exist_ok=True)
os.chmod("/tmp/deep/a", 0)
os.chdir("/var/tmp")
"""

READ_STATE = """
import builtins, math, os, sys, json
seen = [hasattr(builtins, "LEAKED"), hasattr(math, "LEAKED"), json.dumps is None,
        "leaked_module" in sys.modules, "/leaked" in sys.path, "LEAKED" in os.environ,
        os.getcwd() != "/tmp/work", sorted(os.listdir(".")) != []]
for folder in ("/tmp", "/var/tmp", "/dev/shm", os.path.expanduser("~")):
    seen.append(any("leak" in name or name == "deep" for name in os.listdir(folder)))
print(seen)
"""


def test_state_does_not_leak_between_programs_of_one_server(sandbox):
    _run_ok(sandbox, "pass")
    (server,) = _server_pids(sandbox)
    _run_ok(sandbox, WRITE_STATE)
    assert _run_ok(sandbox, READ_STATE).strip() == str([False] * 12)
    assert _server_pids(sandbox) == [server]  # the same server ran all three


FOLDERS = "('/tmp', '/tmp/work', '/var/tmp', '/dev/shm')"

#: What a program could leave on the writable folders besides files: modes, extended
#: attributes, modification times; and IPC objects: System V shared memory, POSIX queues.
MARK_FOLDERS = f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for folder in {FOLDERS}:
    for change in (lambda: os.setxattr(folder, "user.leak", b"1"), lambda: os.utime(folder, (1, 1)),
                   lambda: os.chmod(folder, 0o701)):
        try:
            change()
        except OSError:
            pass
assert libc.shmget(0, 4096, 0o1000 | 0o600) >= 0  # IPC_PRIVATE, IPC_CREAT
libc.mq_open.restype = ctypes.c_int
assert libc.mq_open(b"/corrgrpo-leak", os.O_CREAT | os.O_RDWR, 0o600, None) >= 0
"""

SEE_FOLDERS = f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mq_open.restype = ctypes.c_int
state = []
for folder in {FOLDERS}:
    st = os.stat(folder)
    state.append((folder, oct(st.st_mode), st.st_mtime > 1, os.listxattr(folder)))
state.append(len(open("/proc/sysvipc/shm").read().splitlines()))
state.append(libc.mq_open(b"/corrgrpo-leak", os.O_RDONLY, 0, None) >= 0)
print(state)
"""


def test_folder_metadata_and_ipc_objects_do_not_reach_the_next_program(sandbox):
    before = _run_ok(sandbox, SEE_FOLDERS)
    assert before.strip().endswith("1, False]"), before
    _run_ok(sandbox, MARK_FOLDERS)
    assert _run_ok(sandbox, SEE_FOLDERS) == before
    if sandbox.name != "docker":  # own mount and IPC namespaces per program: the server is untouched
        assert len(_server_pids(sandbox)) == 1


#: Changes a program could make to its fork server, which every later child would inherit, and
#: what the server does where the kernel lets them through (docker: the server has the programs'
#: uid and no capability; process and bwrap refuse most): ``restored`` (it sets them back on
#: itself, no capability needed) or ``replaced`` (it cannot: it quits, a new server follows).
SERVER_ATTACKS = {
    "os.sched_setaffinity(os.getppid(), {min(os.sched_getaffinity(0))})": "restored",
    "os.sched_setscheduler(os.getppid(), os.SCHED_BATCH, os.sched_param(0))": "restored",
    "call('ioprio_set', 1, os.getppid(), 3 << 13)": "restored",  # IOPRIO_WHO_PROCESS, idle
    "call('ioprio_set', 2, os.getpgid(os.getppid()), 3 << 13)": "restored",  # its group
    "call('ioprio_set', 3, os.getuid(), 3 << 13)": "restored",  # every process of the uid
    "resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, "
    "(16, resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE)[1]))": "restored",  # soft
    "os.setpriority(os.PRIO_PROCESS, os.getppid(), 19)": "replaced",
    "os.setpriority(os.PRIO_USER, os.getuid(), 19)": "replaced",
    "os.sched_setscheduler(os.getppid(), os.SCHED_IDLE, os.sched_param(0))": "replaced",
    "resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (16, 16))": "replaced",  # hard
}


def test_a_program_cannot_change_the_server_for_the_next_one(sandbox):
    """Either the change is refused (another uid, or a server with capabilities its programs
    lack), or the server puts it back, or it replaces the server; the next program starts as
    the one before did (every attribute of ``corrgrpo_sandbox.carryover``)."""
    see = carryover.read_program()
    for attack, fate in SERVER_ATTACKS.items():  # one sandbox for all: the servers are the check
        if "affinity" in attack and len(os.sched_getaffinity(0)) < 2:
            continue  # one CPU: the affinity cannot change
        before = _run_ok(sandbox, see)
        (first,) = _server_pids(sandbox)
        out = _run_ok(sandbox, carryover.PRELUDE + f"try:\n    {attack}\n    print('changed')\n"
                               "except OSError:\n    print('refused')\n")
        if sandbox.name == "docker":  # the attack is real there, and the server's answer known
            assert out == "changed\n", attack
            assert (first not in _server_pids(sandbox)) == (fate == "replaced"), attack
        elif out == "refused\n":
            assert _server_pids(sandbox) == [first], attack
        # (elsewhere a change may reach only the program: PRIO_USER of its own uid, when the
        # server has another; or the server, which then sets it back or is replaced)
        assert _run_ok(sandbox, see) == before, attack


ODD_ENDINGS = (
    # kill(-1) reaches the program itself, never the server (init of the pid namespace)
    ("import os, time\ntry:\n    os.kill(-1, 9)\nexcept OSError:\n    pass\ntime.sleep(1)",
     ("killed", "killed:SIGKILL", "ok")),
    ("import os\nos._exit(3)", ("killed",)),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", ("killed:SIGSEGV",)),
    # a real-time signal has no name of its own (a dnotify watch sends one to its owner)
    ("import os, signal\nos.kill(os.getpid(), signal.SIGRTMIN + 6)", ("killed:SIGRTMIN+6",)),
    ("import os\nos.close(3)\nos.close(1)", ("killed",)),
    ("import sys\nsys.stdout.close()\nsys.stderr.close()\nraise SystemExit(0)", ("error:SystemExit",)),
    ("import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()", ("timeout",)),
    ("import atexit\natexit.register(print, 'bye')", ("ok",)),
)


def test_odd_endings_get_their_status_and_the_next_program_runs(sandbox):
    for program, statuses in ODD_ENDINGS:
        result = sandbox.run(program)
        assert result.status in statuses, (program, result.status, result.stderr)
        assert not result.finished or result.status == "ok"
        assert _run_ok(sandbox, "print('next')") == "next\n", program


def test_atexit_output_is_captured(sandbox):
    assert _run_ok(sandbox, "import atexit\natexit.register(print, 'bye')") == "bye\n"


# The server is the pid namespace's init (a program's SIGKILL or SIGSTOP does not reach it) and,
# as host root, of another uid than its programs (the signal is refused).
SERVER_SURVIVES = ("ok", "error:PermissionError")


def test_killing_the_server_fails_and_gets_no_credit(sandbox):
    _run_ok(sandbox, "pass")
    (first,) = _server_pids(sandbox)
    result = sandbox.run("import os\nassert os.getppid() == 1\nos.kill(os.getppid(), 9)\nassert True")
    assert result.status in SERVER_SURVIVES and _server_pids(sandbox) == [first]
    assert _run_ok(sandbox, "print(1)") == "1\n"


def test_stopping_the_server_fails(sandbox):
    result = sandbox.run("import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)")
    assert result.status in SERVER_SURVIVES
    assert _run_ok(sandbox, "print(2)") == "2\n"


def test_timeouts_are_per_program(sandbox):
    sleepy = "import time\ntime.sleep(1.2)\nprint('slept')"
    assert [_run_ok(sandbox, sleepy) for _ in range(2)] == ["slept\n"] * 2  # 2.4 s > one timeout
    assert sandbox.run("while True:\n    pass").status == "timeout"
    start = time.perf_counter()
    assert _run_ok(sandbox, "print(3)") == "3\n"
    # a program that waited out the previous one's deadline would take at least that long;
    # this one takes milliseconds, so the deadline leaves a loaded machine ample room
    assert time.perf_counter() - start < LIMITS.timeout
    finished = []
    with SandboxPool(sandbox, workers=2) as pool:
        results = pool.run_many(["while True:\n    pass", "import time\ntime.sleep(0.1)"],
                                on_result=lambda i, _: finished.append(i))
    assert [r.status for r in results] == ["timeout", "ok"]
    # the short program ended while the looping one ran on to its deadline: not queued behind it
    assert finished == [1, 0]


def test_output_cap_kills_the_program_and_the_server_goes_on(sandbox):
    _run_ok(sandbox, "pass")
    (server,) = _server_pids(sandbox)
    long_deadline = dataclasses.replace(LIMITS, timeout=20.0)
    start = time.perf_counter()
    result = sandbox.run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", long_deadline)
    assert result.status == "output_limit" and len(result.stdout) == LIMITS.output_bytes
    # killed at the cap, not at the timeout: a long deadline, so a loaded machine cannot blur the two
    assert time.perf_counter() - start < long_deadline.timeout
    assert _run_ok(sandbox, "print(4)") == "4\n"
    assert _server_pids(sandbox) == [server]


def test_children_and_fork_bombs_die_between_programs(sandbox):
    _run_ok(sandbox, "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n")
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    assert sandbox.run(bomb).status == "timeout"
    listing = "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
    pids = eval(_run_ok(sandbox, listing))
    # the server (init of the pid namespace) and this program
    assert len(pids) == 2 and pids[0] == 1, pids


def test_server_is_replaced_after_max_programs():
    box = make_sandbox("process", LIMITS, reuse="fork", max_programs=2)
    if not box.forking:
        pytest.skip("unshare namespaces unavailable")
    with box:
        _run_ok(box, "pass")
        (first,) = _server_pids(box)
        _run_ok(box, "pass")
        assert _server_pids(box) == []
        _run_ok(box, "pass")
        assert _server_pids(box) != [first]


def test_same_statuses_as_fresh_interpreters(sandbox):
    fresh = make_sandbox(sandbox.name, LIMITS, reuse="fresh")
    programs = ["print(sum(range(10)))", "assert 1 == 2", "raise KeyError(1)", "def f(:", "import sys\nsys.exit(3)",
                "import os\nprint(os.getcwd(), os.environ['HOME'], sorted(os.environ))", "x = bytearray(10 ** 10)"]
    for program in programs:
        a, b = sandbox.run(program), fresh.run(program)
        assert (a.status, a.stdout) == (b.status, b.stdout), program


def test_a_sandbox_with_servers_pickles(sandbox):
    _run_ok(sandbox, "pass")
    copy = pickle.loads(pickle.dumps(sandbox))
    assert copy._forks is None
    try:
        assert _run_ok(copy, "print(5)") == "5\n"
    finally:
        copy.close()


def test_servers_outlive_the_pool_threads_that_started_them(sandbox):
    with SandboxPool(sandbox, workers=2) as pool:
        pool.run_many(["import time\ntime.sleep(0.2)"] * 2)
    servers = sorted(_server_pids(sandbox))
    assert len(servers) == 2
    time.sleep(0.3)  # the pool's threads have ended; a death signal tied to them would have fired
    with SandboxPool(sandbox, workers=2) as pool:
        results = pool.run_many(["import time\ntime.sleep(0.2)"] * 2)
    assert [r.status for r in results] == ["ok", "ok"]
    assert sorted(_server_pids(sandbox)) == servers
