"""The fork server: one isolated interpreter that forks a child per program.

Part of the fork server's program text (:data:`corrgrpo_sandbox.runner.SERVER_SOURCE`, after
the codec, the bootstrap and :mod:`~corrgrpo_sandbox.inside.server_state`). argv: the control
socket's fd (or path) and the server's config (a Python literal). It isolates itself once,
preloads common standard-library modules, then serves programs; each child gets its own
namespaces and uid and runs the very same bootstrap as a fresh runner. The protocol on the
control socket is in :mod:`corrgrpo_sandbox.runner`; the host side in
:mod:`corrgrpo_sandbox.forkserver`. Standard library only.
"""

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # the same program text holds these (see corrgrpo_sandbox.runner)
    from corrgrpo_sandbox.inside.boot import (
        MS_BIND,
        MS_NODEV,
        MS_NOSUID,
        MS_PRIVATE,
        MS_RDONLY,
        MS_REC,
        MS_REMOUNT,
        _confine,
        _corrgrpo_boot,
        _corrgrpo_fresh_keyring,
        _corrgrpo_libc,
        _isolate_fs,
        _mount,
    )
    from corrgrpo_sandbox.inside.server_state import (
        _corrgrpo_clean,
        _corrgrpo_fs_state,
        _corrgrpo_kernel_settled,
        _corrgrpo_kernel_state,
        _corrgrpo_self_restored,
        _corrgrpo_self_state,
        _corrgrpo_writable_roots,
    )


def _corrgrpo_serve():
    import select
    import signal
    import socket
    import time
    sock = _corrgrpo_control(socket, sys.argv[1])
    config = eval(sys.argv[2], {"__builtins__": {}})
    _corrgrpo_server_set_up(config, signal)
    me = os.getpid()
    _corrgrpo_probe_child(config)
    start = _corrgrpo_start_state(config)
    sock.sendall(b"ready")
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 256, 8)
        if not msg:
            _corrgrpo_quit()
        if not msg.startswith(b"R ") or len(fds) != 4:
            for fd in fds:
                os.close(fd)
            continue  # a late kill request for a program that already ended
        before = _corrgrpo_cpu_ns(config) if config.get("cpu_group") else None
        pid = os.fork()
        if pid == 0:
            _corrgrpo_child(fds, config)
        for fd in fds:
            os.close(fd)
        kind, code = _corrgrpo_wait(sock, pid, float(msg[2:]), select, signal, time)
        clean = _corrgrpo_reap(me, signal, time)
        # CPU time of the program and of every process it started (all dead by now), counted
        # by the kernel in the program's control group, out of the program's reach; -1 where
        # there is no such group (a rusage would miss children reaped automatically).
        cpu_ns = _corrgrpo_cpu_ns(config) - before if before is not None else -1
        clean = clean and _corrgrpo_back_to_start(start, time)
        sock.sendall(b"D %s %d %d %d" % (kind, code, int(clean), cpu_ns))
        if not clean:
            _corrgrpo_quit()


def _corrgrpo_server_set_up(config, signal):
    # Isolate the server itself once; what every program starts from.
    if config.get("isolate_fs"):
        _isolate_fs(config)
    if config.get("drop_caps"):
        # Keep only what giving each child its own namespaces and uid needs.
        _confine(None, SERVER_CAPS if config.get("fresh_tmpfs") else ())
    _corrgrpo_fresh_keyring(config.get("syscalls", {}))  # none of the host's keys, from here on
    os.chdir("/")
    if config.get("workdir"):  # made before the snapshot: every program finds it, empty
        os.makedirs(config["workdir"], exist_ok=True)
    for name in config.get("preload", ()):
        try:
            __import__(name)
        except Exception:
            pass
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    # Not dumpable: a program (same uid) can then neither ptrace the server nor open its
    # /proc files (memory, fds such as the control socket). Children inherit the flag.
    libc.prctl(4, 0, 0, 0, 0)
    # Child subreaper: processes a program leaves behind become the server's children, and
    # the server reaps them.
    libc.prctl(36, 1, 0, 0, 0)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def _corrgrpo_start_state(config):
    # What the server must be back to after each program (see server_state).
    roots = _corrgrpo_writable_roots()
    numbers = config.get("syscalls", {})
    key_owner = config.get("program_uid")
    key_owner = os.getuid() if key_owner is None else key_owner
    return {"roots": roots, "files": _corrgrpo_fs_state(roots), "numbers": numbers,
            "itself": _corrgrpo_self_state(numbers), "key_owner": key_owner,
            "kernel": _corrgrpo_kernel_state(key_owner)}


def _corrgrpo_back_to_start(start, time):
    # The server is as it was at start-up, once put back where it can be.
    return _corrgrpo_clean(start["roots"], start["files"]) \
        and _corrgrpo_self_restored(start["numbers"], start["itself"]) \
        and _corrgrpo_kernel_settled(start["key_owner"], start["kernel"], time)


def _corrgrpo_quit():
    try:
        os.kill(-1, 9)
    except OSError:
        pass
    os._exit(0)


def _corrgrpo_control(socket, where):
    # The host's end: an inherited fd, or a socket path (a container cannot inherit fds).
    if where.isdigit():
        return socket.socket(fileno=int(where))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.connect(where)
    return sock


def _corrgrpo_isolate_child(config):
    # Before any program code: own mount and IPC namespaces, the program's uid, no capability.
    if config.get("fresh_tmpfs"):
        _corrgrpo_private_ns(config)
    if config.get("drop_caps"):
        _confine(config.get("program_uid"))


def _corrgrpo_enter_program_group(config):
    # Into the control group that counts the program's CPU time, before anything else: every
    # process the program starts is born there, and it cannot leave (it never sees the group's
    # files: its mount namespace drops them, and it holds no capability to mount them again).
    if config.get("cpu_group"):
        fd = os.open(config["cpu_group"] + "/cgroup.procs", os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)


def _corrgrpo_cpu_ns(config):
    # CPU time (ns) of everything that ran in the programs' group (cgroup v2 or v1 cpuacct).
    with open(config["cpu_group"] + "/" + config["cpu_file"]) as f:
        text = f.read()
    if config["cpu_file"] == "cpuacct.usage":
        return int(text)
    for line in text.splitlines():
        if line.startswith("usage_usec "):
            return int(line.split()[1]) * 1000
    raise OSError("no usage_usec in cpu.stat")


def _corrgrpo_probe_child(config):
    # The isolation every child gets must work before the server says ready.
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            _corrgrpo_enter_program_group(config)
            _corrgrpo_isolate_child(config)
        except BaseException as exc:
            os.write(2, f"child isolation failed: {exc!r}\n".encode())
            code = 1
        os._exit(code)
    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
        raise SystemExit("the fork server cannot isolate its programs")


def _corrgrpo_child(fds, config):
    code = 1
    try:
        _corrgrpo_enter_program_group(config)
        os.setsid()
        for target, fd in enumerate(fds):  # stdin, stdout, stderr, status channel (fd 3)
            os.dup2(fd, target)
        os.closerange(4, 1 << 20)  # the control socket and everything else of the server
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        try:
            _corrgrpo_isolate_child(config)
        except BaseException:
            os._exit(125)  # never run a program without its isolation
        _corrgrpo_boot()
        code = 0
        # What interpreter shutdown would do after the program: non-daemon threads, atexit.
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
        import atexit
        atexit._run_exitfuncs()
    except BaseException:
        pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(code)


def _corrgrpo_wait(sock, pid, timeout, select, signal, time):
    kind = b"exit"
    pidfd = os.pidfd_open(pid)
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                kind = b"timeout"
                break
            ready = select.select([pidfd, sock], [], [], left)[0]
            if pidfd in ready:
                break
            if sock in ready:
                msg = sock.recv(256)
                if not msg:
                    _corrgrpo_quit()
                if msg.startswith(b"K"):
                    kind = b"killed"
                    break
    finally:
        os.close(pidfd)
    if kind != b"exit":
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass
    status = os.waitpid(pid, 0)[1]
    return kind, os.waitstatus_to_exitcode(status)


def _corrgrpo_reap(me, signal, time):
    # Kill every other process of the pid namespace (children the program left behind,
    # fork bombs) and reap ours; the namespace's init (pid 1) reaps the rest.
    deadline = time.monotonic() + 2.0
    while True:
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
        if not others:
            return True
        if time.monotonic() > deadline:
            return False
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        time.sleep(0.001)


#: Capabilities a fork server keeps to give each child fresh mount and IPC namespaces, switch


#: it to the program's uid and kill what it leaves behind (the child then drops them all).
SERVER_CAPS = (0, 1, 3, 5, 6, 7, 8, 21)  # CHOWN DAC_OVERRIDE FOWNER KILL SETGID SETUID SETPCAP SYS_ADMIN


def _corrgrpo_private_ns(config):
    # A fork-server child's own mount, IPC and network namespaces: fresh, size-capped /tmp,
    # /var/tmp and /dev/shm, new System V and POSIX message-queue namespaces, and a network
    # namespace of its own (abstract unix sockets live there: one kept alive by a descriptor
    # cycle is unreachable once the program ended); all vanish with the program.
    ctypes, libc = _corrgrpo_libc()
    CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWNET = 0x00020000, 0x08000000, 0x40000000
    if libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(mount, ipc, net) failed")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    if config.get("cpu_mount"):  # the control group files stay the server's
        if libc.umount2(config["cpu_mount"].encode(), 2) != 0:
            raise OSError(ctypes.get_errno(), f"umount {config['cpu_mount']} failed")
    _tmpfs_with_keeps(config["fresh_tmpfs"], config["tmpfs_bytes"], config.get("keep", []))


def _bind_ro(fd, path):
    # Bind an fd opened before its folder was covered (any permissions) read-only on path.
    os.makedirs(path, exist_ok=True)
    _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
    _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.close(fd)


def _tmpfs_with_keeps(points, size, keep, mode="1777", ro=False):
    # Fresh tmpfs on each point; folders of ``keep`` that lived under one stay visible, read-only.
    covered = [k for k in keep if any(k == p or k.startswith(p.rstrip("/") + "/") for p in points)]
    fds = [os.open(k, os.O_PATH) for k in covered]
    for target in points:
        if os.path.isdir(target):
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode={mode}")
    for fd, path in zip(fds, covered):
        _bind_ro(fd, path)
    if ro:
        for target in points:
            if os.path.isdir(target):
                _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
