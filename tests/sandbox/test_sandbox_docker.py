"""The docker backend through the Docker SDK: no CLI, local and remote engines, engine errors,
clean-up, CPU time from the container's control group, the stacked system-call denials and
nothing shared between programs of one container."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from corrgrpo_sandbox import Limits, SandboxUnavailable
from corrgrpo_sandbox.docker import (
    MASKED_PATHS,
    DockerEngineError,
    DockerSandbox,
    docker_available,
    engine_address,
)
from corrgrpo_sandbox.seccomp import DENIED
from corrgrpo_sandbox.syscall_filter import syscall_numbers

_OK, _REASON = docker_available()
pytestmark = pytest.mark.skipif(not _OK, reason=f"docker backend: {_REASON}")

LIMITS = Limits(timeout=5.0, memory_mb=256, file_size_mb=4, processes=32, output_bytes=1 << 16)
REUSE = ["fork", "fresh"]


@pytest.fixture(params=REUSE)
def box(request):
    sandbox = DockerSandbox(LIMITS, reuse=request.param)
    yield sandbox
    sandbox.close()
    assert sandbox.containers() == [], "a container outlived close()"


# ---------------------------------------------------------------- no CLI, engine addresses
@pytest.mark.parametrize("reuse", REUSE)
def test_runs_without_a_docker_binary(reuse, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no `docker` to run
    assert shutil.which("docker") is None
    with DockerSandbox(LIMITS, reuse=reuse) as box:
        result = box.run("print(6 * 7)")
    assert (result.status, result.stdout, result.backend) == ("ok", "42\n", "docker")


class _TcpToUnix:
    """A TCP listener on 127.0.0.1 that forwards every connection to a unix socket: the local
    engine as a remote one (``tcp://``) would be reached."""

    def __init__(self, unix_path: str):
        self.unix_path = unix_path
        self.connections = 0
        self.bytes_up = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._stop = False
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self._stop:
                client.close()
                return
            engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            engine.connect(self.unix_path)
            self.connections += 1
            self.open += [client, engine]
            threading.Thread(target=self._pump, args=(client, engine, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(engine, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if up:
                    self.bytes_up += len(data)
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            for sock in (src, dst):
                try:
                    sock.close()
                except OSError:
                    pass

    def close(self) -> None:
        """Stop listening and cut every connection (the engine is gone, as far as clients see)."""
        self._stop = True
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() in progress
        except OSError:
            pass
        self.listener.close()
        for sock in self.open:
            try:
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            except OSError:
                pass


@pytest.mark.parametrize("reuse", REUSE)
@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_engine_named_by_docker_host(transport, reuse, monkeypatch):
    local = engine_address()
    if not local.startswith("unix://"):
        pytest.skip(f"the local engine is not on a unix socket ({local})")
    forwarder = None
    if transport == "unix":
        monkeypatch.setenv("DOCKER_HOST", local)
    else:
        forwarder = _TcpToUnix(local[len("unix://"):])
        monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{forwarder.port}")
    try:
        assert docker_available() == (True, "")
        with DockerSandbox(LIMITS, reuse=reuse) as box:
            assert box.engine == os.environ["DOCKER_HOST"]
            results = [box.run(f"print(sum(range({n})))") for n in (10, 100)]
            assert len(box.containers()) == (1 if reuse == "fork" else 0)
        assert [(r.status, r.stdout) for r in results] == [("ok", "45\n"), ("ok", "4950\n")]
        assert all(r.cpu_seconds is not None for r in results)
        if forwarder is not None:
            # every request went through the listener: containers, attach streams, removal
            assert forwarder.connections >= 2 and forwarder.bytes_up > 0
    finally:
        if forwarder is not None:
            forwarder.close()


def test_an_engine_lost_mid_session_is_a_result_and_leaves_no_container(monkeypatch):
    local = engine_address()
    if not local.startswith("unix://"):
        pytest.skip(f"the local engine is not on a unix socket ({local})")
    forwarder = _TcpToUnix(local[len("unix://"):])
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{forwarder.port}")
    box = DockerSandbox(LIMITS, reuse="fork")
    assert box.run("print(1)").stdout == "1\n"
    owner = box.owner
    forwarder.close()  # the engine is unreachable from now on
    with pytest.warns(RuntimeWarning, match="cannot remove container"):
        result = box.run("print(2)")
        box.close()
    assert result.status in ("killed", "sandbox_error"), result
    import docker

    client = docker.DockerClient(base_url=local)
    deadline = time.monotonic() + 30  # its stdin ended with the stream: the engine removes it
    while client.api.containers(all=True, quiet=True, filters={"label": f"corrgrpo.owner={owner}"}):
        assert time.monotonic() < deadline, "the container outlived its lost stream"
        time.sleep(0.2)
    client.close()


# ---------------------------------------------------------------- errors
def test_missing_image_carries_the_engine_message():
    with pytest.raises(SandboxUnavailable) as caught:
        DockerSandbox(image="corrgrpo/no-such-image:never")
    assert "No such image: corrgrpo/no-such-image:never" in str(caught.value)
    assert "docker_engine.sh" in str(caught.value)


def test_unreachable_engine_names_its_address():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"  # nothing listens there any more
    ok, reason = docker_available(base_url=address)
    assert not ok and address in reason
    with pytest.raises(SandboxUnavailable, match=f"127.0.0.1:{port}"):
        DockerSandbox(base_url=address)


def test_a_refused_container_is_an_exception_with_the_engine_message():
    box = DockerSandbox(LIMITS, cpus=4096, reuse="fork")
    with pytest.raises(DockerEngineError) as caught:
        box._start_server(LIMITS)
    error = caught.value
    assert error.status_code == 400 and "CPU" in error.explanation
    assert error.engine == engine_address() and error.explanation in str(error)
    # through run(): the same message as a sandbox_error (fork and fresh alike)
    assert "CPU" in box.run("pass").stderr and box.run("pass").status == "sandbox_error"
    fresh = DockerSandbox(LIMITS, cpus=4096, reuse="fresh")
    result = fresh.run("pass")
    assert result.status == "sandbox_error" and error.explanation in result.stderr
    assert box.containers() == [] and fresh.containers() == []


# ---------------------------------------------------------------- streams, limits, clean-up
def test_streams_limits_and_verdicts(box):
    big = "x" * 300_000  # the program travels in many stdin frames
    result = box.run(f"s = {big!r}\nprint(len(s))\nimport sys; print('err', file=sys.stderr)")
    assert (result.status, result.stdout, result.stderr) == ("ok", "300000\n", "err\n")
    assert box.run("assert 1 == 2").status == "assertion"
    assert box.run("raise KeyError(1)").status == "error:KeyError"
    assert box.run("import os; os._exit(3)").status == "killed"
    flood = box.run("while True: print('y' * 1000)")
    assert flood.status == "output_limit" and len(flood.stdout) <= LIMITS.output_bytes
    slow_limits = Limits(timeout=1.0, memory_mb=256, file_size_mb=4)
    slow = box.run("while True: pass", slow_limits)
    # ended by its deadline; the slack covers stopping a container on a loaded machine
    assert slow.status == "timeout" and slow.wall_seconds < slow_limits.timeout + 10.0
    # limits the engine enforces on the container
    assert box.run("import os; print(os.getuid())").stdout.strip() != "0"
    assert box.run("import socket; socket.create_connection(('1.1.1.1', 53), 1)").status \
        == "error:OSError"
    assert box.run("open('/etc/corrgrpo', 'w')").status == "error:OSError"  # read-only root
    assert box.run("print('after')").stdout == "after\n"


def test_containers_are_removed_after_timeouts_and_floods():
    box = DockerSandbox(LIMITS, reuse="fresh")
    quick = Limits(timeout=1.0, memory_mb=256, file_size_mb=4, output_bytes=1 << 12)
    assert box.run("while True: pass", quick).status == "timeout"
    assert box.run("while True: print('z' * 100)", quick).status == "output_limit"
    assert box.containers() == []


def test_a_dead_host_process_leaves_no_container():
    """The host process is killed without any clean-up: the container's stdin ends with the
    attach stream, the relay stops it, and the engine removes it."""
    code = ("import sys, time\n"
            "from corrgrpo_sandbox.docker import DockerSandbox\n"
            "box = DockerSandbox(reuse='fork')\n"
            "assert box.run('pass').status == 'ok'\n"
            "print(box.owner, flush=True)\n"
            "time.sleep(600)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, text=True)
    try:
        owner = proc.stdout.readline().strip()
        assert owner, "the child did not start a sandbox"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    import docker

    client = docker.from_env()
    deadline = time.monotonic() + 30
    while client.api.containers(all=True, quiet=True, filters={"label": f"corrgrpo.owner={owner}"}):
        assert time.monotonic() < deadline, "the container outlived its host process"
        time.sleep(0.2)
    client.close()


# ---------------------------------------------------------------- CPU time
# the same work everywhere: a function (its locals are faster than a module's globals)
_WORK = "def work(_=None):\n    x = 0\n    for i in range(3_000_000):\n        x += i\n"
_HIDDEN = {
    "main": _WORK + "work()\n",
    "auto_reaped_child": _WORK + (
        "import os, signal\n"
        "signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps: no rusage for us\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.close(r)\n"
        "    work()\n"
        "    os._exit(0)\n"
        "os.close(w)\n"
        "os.read(r, 1)  # the child's end closes when it is done\n"),
    "double_forked_daemon": _WORK + (
        "import os\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.close(r)\n"
        "        work()\n"
        "        os._exit(0)\n"
        "    os._exit(0)\n"
        "os.close(w)\n"
        "os.wait()\n"
        "os.read(r, 1)\n"),
    "thread_pool": _WORK + (
        "from concurrent.futures import ThreadPoolExecutor\n"
        "with ThreadPoolExecutor(2) as pool:\n"
        "    list(pool.map(work, range(1)))\n"),
}


def test_cpu_time_comes_from_the_control_group(box):
    """Moving the work into an auto-reaped child, a double-forked daemon or a thread pool never
    lowers the CPU time (so never raises efficiency)."""
    cpu = {}
    for name, program in _HIDDEN.items():
        result = box.run(program, Limits(timeout=20.0, memory_mb=256, file_size_mb=4))
        assert result.status == "ok", (name, result)
        cpu[name] = result.cpu_seconds
    assert all(value is not None for value in cpu.values()), cpu
    assert cpu["main"] > 0.05, cpu
    for name, value in cpu.items():  # (hidden work would read as the idle time, ~0.005 s;
        assert value >= 0.5 * cpu["main"], (name, cpu)  # CPU time varies on a busy machine)
    idle = box.run("pass").cpu_seconds
    assert idle is not None and idle < cpu["main"]


# ---------------------------------------------------------------- system calls
_PROBE = """
import ctypes, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
numbers = json.loads({numbers!r})
buf = ctypes.create_string_buffer(256)
p = ctypes.addressof(buf)
args = {{
    "mount": (b"none", b"/tmp", b"tmpfs", 0, 0), "umount2": (b"/tmp", 0),
    "pivot_root": (b"/tmp", b"/tmp"), "open_tree": (-100, b"/tmp", 0), "move_mount": (-1, b"", -1, b"", 0),
    "fsopen": (b"tmpfs", 0), "fsconfig": (-1, 0, 0, 0, 0), "fsmount": (-1, 0, 0), "fspick": (-100, b"/", 0),
    "mount_setattr": (-100, b"/tmp", 0, p, 32),
    "keyctl": (0, -3, 0), "add_key": (b"user", b"corrgrpo-probe", b"v", 1, -3),
    "request_key": (b"user", b"corrgrpo-probe", 0, 0),
    "io_uring_setup": (1, p), "io_uring_enter": (0, 0, 0, 0, 0), "io_uring_register": (0, 0, 0, 0),
    "userfaultfd": (0,), "perf_event_open": (p, 0, -1, -1, 0), "bpf": (0, p, 64),
    "unshare": (0x10000000,), "clone": (0x10000000 | 17, 0, 0, 0, 0),
    "clone3": (p, 88),
    "inotify_init": (), "inotify_init1": (0,), "inotify_add_watch": (0, b"/tmp", 0x20),
    "fanotify_init": (0x200, 0), "fanotify_mark": (0, 1, 0x20, -100, b"/tmp"),
    "flock": (0, 6), "io_setup": (1, p), "io_submit": (0, 0, 0), "cachestat": (0, p, p + 64, 0),
}}
out = {{}}
for name, call_args in args.items():
    if name not in numbers:  # (not a call of this machine: aarch64 has no inotify_init)
        continue
    ctypes.set_errno(0)
    rc = libc.syscall(numbers[name], *call_args)
    if rc == 0 and name == "clone":
        os._exit(0)  # (never reached when denied)
    out[name] = "ok" if rc >= 0 else os.strerror(ctypes.get_errno())
status = open("/proc/self/status").read()
out["filters"] = [l.split()[1] for l in status.splitlines() if l.startswith("Seccomp_filters:")]
print(json.dumps(out))
"""


def test_denied_system_calls_fail_with_eperm(box):
    numbers = syscall_numbers(box.architecture)
    result = box.run(_PROBE.format(numbers=json.dumps(numbers)))
    assert result.status == "ok", result
    out = json.loads(result.stdout)
    eperm = os.strerror(1)
    for name in set(DENIED) & set(numbers):  # clone3: ENOSYS, the C library falls back to clone
        assert out[name] == (os.strerror(38) if name == "clone3" else eperm), (name, out[name])
    assert int(out["filters"][0]) >= 2, "the engine's profile and the backend's filter, stacked"
    plain_fork = "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nprint(os.waitpid(pid, 0)[1])"
    assert box.run(plain_fork).stdout == "0\n"  # forks without new namespaces still work


def test_proc_locks_is_masked_with_the_engines_own_paths(box):
    """``/proc/locks`` lists the open-file-description locks of the host and every container;
    the backend's list of masked paths keeps every path the engine masks by default."""
    result = box.run("print(repr(open('/proc/locks').read()))")
    assert (result.status, result.stdout) == ("ok", "''\n"), result
    client = box._client()
    plain = client.api.create_container(box.image, "true")  # the engine's defaults
    try:
        default = client.api.inspect_container(plain["Id"])["HostConfig"]["MaskedPaths"]
    finally:
        client.api.remove_container(plain["Id"])
    assert set(default) <= set(MASKED_PATHS) and "/proc/locks" not in default


def test_the_backend_filter_stacks_on_a_custom_profile(tmp_path):
    """A profile given to the engine replaces its default; the backend's denials still hold."""
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        {"names": ["getpgid"], "action": "SCMP_ACT_ERRNO"}]}))
    with DockerSandbox(LIMITS, reuse="fresh", seccomp_profile=str(profile)) as box:
        numbers = syscall_numbers(box.architecture)
        result = box.run("import ctypes, os\n"
                         "libc = ctypes.CDLL(None, use_errno=True)\n"
                         "try:\n    os.getpgid(0); print('getpgid ok')\n"
                         "except OSError as e:\n    print('getpgid', e.errno)\n"
                         f"print('io_uring', libc.syscall({numbers['io_uring_setup']}, 1, 0), "
                         "ctypes.get_errno())\n")
    assert result.stdout == "getpgid 1\nio_uring -1 1\n", result


# ---------------------------------------------------------------- nothing shared
_LEAVE_SOCKETS = """
import os, socket
a, b = socket.socketpair()
named = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
named.bind(b"\\0corrgrpo-left-behind")
named.listen(1)
tcp = socket.create_server(("127.0.0.1", 47001))
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", 47002))
# b in its own receive queue with the others: a cycle that outlives every descriptor
socket.send_fds(a, [b"x"], [named.fileno(), tcp.fileno(), udp.fileno(), b.fileno()])
for sock in (a, b, named, tcp, udp):
    sock.close()
print("left")
"""
_FIND_SOCKETS = """
import socket
tables = "".join(open("/proc/net/" + t).read() for t in ("unix", "tcp", "udp"))
reached = []
for family, kind, address in ((socket.AF_UNIX, socket.SOCK_STREAM, b"\\0corrgrpo-left-behind"),
                              (socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", 47001))):
    c = socket.socket(family, kind)
    try:
        c.connect(address)
        reached.append(True)
    except OSError:
        reached.append(False)
print("corrgrpo-left-behind" in tables, ":B799" in tables, ":B79A" in tables, reached)
"""


def test_a_socket_never_reaches_the_next_program(box):
    """An abstract name, a TCP listener and a bound UDP port kept alive by a descriptor cycle:
    none is there for the next program (a new container), nor on the host."""
    assert box.run(_LEAVE_SOCKETS).stdout == "left\n"
    assert box.run(_FIND_SOCKETS).stdout == "False False False [False, False]\n"
    assert "corrgrpo-left-behind" not in Path("/proc/net/unix").read_text()


def test_keys_cannot_be_left_for_the_next_program_or_the_host(box):
    add = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
           "rc = libc.syscall({n}, b'user', b'corrgrpo-key-probe', b'secret', 6, -3)\n"
           "print(rc, ctypes.get_errno())\n").format(n=syscall_numbers(box.architecture)["add_key"])
    assert box.run(add).stdout == "-1 1\n"
    assert "corrgrpo-key-probe" not in Path("/proc/keys").read_text()


# Searched in place (no copy of memory is made) with patterns whose text is not the mark:
# only a copy of the previous program's bytes can match.
_SCAN_MEMORY = """
import ctypes, re
patterns = {"source": re.compile(rb"c[o]rrgrpo-s[o]urce-mark"),
            "output": re.compile(rb"c[o]rrgrpo-o[u]tput-mark")}
found = set()
for line in open("/proc/self/maps").read().splitlines():
    fields = line.split()
    if not fields[1].startswith("r") or (len(fields) > 5 and fields[5].startswith("[v")):
        continue
    start, end = (int(x, 16) for x in fields[0].split("-"))
    view = memoryview((ctypes.c_char * (end - start)).from_address(start)).cast("B")
    found.update(name for name, pattern in patterns.items() if pattern.search(view))
print(sorted(found))
"""


def _run_fresh(program: str) -> str:
    with DockerSandbox(LIMITS, reuse="fresh") as box:
        return box.run(program).stdout


def test_a_program_finds_nothing_of_the_previous_one_in_its_memory():
    """Every program is forked from the container's first process, which carries the programs'
    bytes: a reference solution, say, must not be in the memory the next program inherits."""
    with DockerSandbox(LIMITS, reuse="fork") as box:
        first = box.run("# corrgrpo-source-mark\nprint('corrgrpo-output-mark' * 100)")
        assert first.status == "ok"
        scan = box.run(_SCAN_MEMORY)
        assert scan.extra["container"] == first.extra["container"]
    assert scan.status == "ok" and scan.stdout == "[]\n", (scan.stdout, scan.stderr)
    # (the same scan finds the marks when the program itself holds them)
    holds = _run_fresh("x = '# corrgrpo-source-mark'\n" + _SCAN_MEMORY)
    assert holds == "['source']\n", holds


def test_fork_server_container_is_reused_between_clean_programs():
    with DockerSandbox(LIMITS, reuse="fork") as box:
        first = box.run("print(1)")
        second = box.run("open('/tmp/work/f', 'w').write('x')")
        third = box.run("import os; print(os.listdir('/tmp/work'))")
        assert first.extra["container"] == second.extra["container"] == third.extra["container"]
        assert third.stdout == "[]\n"
        # a socket left behind ends that container: the next program gets a new one (a
        # closed loopback connection stays in TIME_WAIT, its ports visible, for a minute)
        left = box.run("import socket\n"
                       "server = socket.create_server(('127.0.0.1', 47003))\n"
                       "client = socket.create_connection(('127.0.0.1', 47003))\n"
                       "peer, _ = server.accept()\n"
                       "client.close(); peer.close(); server.close()\n")
        assert left.status == "ok" and left.extra["container"] == first.extra["container"]
        after = box.run("print(':B79B' in open('/proc/net/tcp').read())")
        assert after.stdout == "False\n" and after.extra["container"] != first.extra["container"]
        assert len(box.containers()) == 1
