"""The bootstrap that runs inside every sandbox, before the untrusted program.

It is passed to a fresh ``python -I -S -c`` and reads, from standard input, one
header line (a Python literal) and then the program's source. It applies the isolation that
must happen inside the new process (private mounts, dropped capabilities,
resource limits), runs the program with ``exec`` and reports the outcome on a
separate status channel, tagged with a one-time token so that a program cannot
forge a pass by printing or by exiting early.

The source is kept as a string (:data:`RUNNER_SOURCE`) because it runs in an
interpreter that cannot import this package (``-S`` drops site-packages).

:data:`SERVER_SOURCE` is the long-lived variant: a fork server that isolates
itself once, preloads common standard-library modules, and then forks one child
per program; the child runs the very same bootstrap as the fresh runner. See
:mod:`corrgrpo_envs.sandbox.forkserver` for the protocol and the host side.
"""

from __future__ import annotations

from corrgrpo_envs.sandbox.calls import CALLS_DIRECTIVE, PLAIN_SOURCE

__all__ = ["RUNNER_SOURCE", "SERVER_SOURCE", "PRELOAD_MODULES", "STATUS_OK", "STATUS_ASSERTION"]

STATUS_OK = "ok"
STATUS_ASSERTION = "assertion"

#: Standard-library modules the fork server imports once, before any program
#: (what judged programs commonly import; each child gets them for free).
PRELOAD_MODULES = (
    "abc", "array", "bisect", "collections", "collections.abc", "copy", "dataclasses",
    "datetime", "decimal", "enum", "fractions", "functools", "hashlib", "heapq", "io",
    "itertools", "json", "math", "operator", "random", "re", "resource", "statistics",
    "string", "threading", "time", "typing",
)

_SHARED_SOURCE = r'''
import sys, os
def _corrgrpo_boot():
    # The header is written by the host (trusted) as a Python literal: eval is far cheaper to
    # import than json, and start-up time is most of a short program's cost.
    header = eval(sys.stdin.buffer.readline().decode(), {"__builtins__": {}})
    source = sys.stdin.buffer.read().decode("utf-8", "replace")
    sys.stdin.close()
    token = header["token"]
    calls = None
    if source.startswith(CALLS_DIRECTIVE):
        # Written by the host in front of the program: which function to call, on what.
        import json
        first, _, rest = source.partition("\n")
        calls = json.loads(first[len(CALLS_DIRECTIVE):])
        source = "\n" + rest  # the program keeps its line numbers
    if header.get("isolate_fs"):
        _isolate_fs(header)
    if header.get("drop_caps"):
        _drop_caps()
    if header.get("make_cwd"):
        os.makedirs(header["cwd"], exist_ok=True)
    os.chdir(header["cwd"])
    for path in header.get("paths", []):
        sys.path.append(path)
    import resource
    for name, value in header.get("rlimits", {}).items():
        kind = getattr(resource, name)
        soft, hard = resource.getrlimit(kind)
        value = int(value)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        try:
            resource.setrlimit(kind, (value, value if name != "RLIMIT_CPU" else value + 1))
        except (ValueError, OSError):
            pass
    fd = header.get("status_fd")
    def emit(text):
        line = ("%s %s\n" % (token, text)).encode()
        if fd is None:
            sys.stderr.flush()
            line = b"\n" + line
        try:
            while line:
                line = line[os.write(2 if fd is None else fd, line):]
        except OSError:
            pass
    def report(status, seconds=0.0):
        emit("%s %.9f" % (status, seconds))
    try:
        code = compile(source, "<program>", "exec")
    except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError):
        report("syntax")
        return
    del source, header
    import time
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    sys.argv = ["program"]
    start = time.perf_counter()
    try:
        exec(code, scope)
    except AssertionError:
        status = "assertion"
    except MemoryError:
        status = "memory"
    except BaseException as exc:
        status = "error:" + type(exc).__name__
    else:
        status = "ok"
    if calls is not None and status == "ok":
        status = _corrgrpo_call_all(calls, scope, emit)
    elapsed = time.perf_counter() - start
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    report(status, elapsed)

def _corrgrpo_call_all(calls, scope, emit):
    # Call the entry on every input; one record per call on the status channel. What a call
    # returns is judged by the host, never here: this process only reports values.
    try:
        import json
        names = calls.get("classes", [])
        classes = {n: scope[n] for n in names if isinstance(scope.get(n), type)}
        entry = eval(calls["entry"], scope)
        for i, text in enumerate(calls["inputs"]):
            args, kwargs = _plain_decode(json.loads(text), classes)
            try:
                value = entry(*args, **kwargs)
            except BaseException as exc:
                emit("X %d %s" % (i, type(exc).__name__))
                return "error:" + type(exc).__name__
            try:
                nodes = _plain_encode(value, names)
            except (_PlainError, RecursionError, MemoryError) as exc:
                emit("P %d %s" % (i, str(exc)[:60].replace("\n", " ") or "?"))
                return "error:NotPlain"
            emit("R %d %s" % (i, json.dumps(nodes, separators=(",", ":"))))
    except BaseException as exc:
        return "error:" + type(exc).__name__
    return "ok"

def _isolate_fs(header):
    # Runs as (namespace) root inside fresh mount, pid and network namespaces.
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
    MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    def mount(src, target, fstype, flags, data=None):
        enc = lambda s: None if s is None else s.encode()
        if libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, "mount %s: %s" % (target, os.strerror(err)))
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    keep = [os.open(p, os.O_PATH) for p in header.get("keep", [])]
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            opts = parts[5].split(",")
            flags = 0
            for name, bit in (("nosuid", MS_NOSUID), ("nodev", MS_NODEV), ("noexec", MS_NOEXEC)):
                if name in opts:
                    flags |= bit
            points.append((parts[4].replace("\\040", " "), flags))
    for target, flags in points:
        if target.startswith("/proc"):
            continue
        try:
            mount(target, target, None, MS_BIND | MS_REC)
            mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except OSError:
            pass
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    size = "size=%d" % header.get("tmpfs_bytes", 64 << 20)
    for target in header.get("tmpfs", []):
        if os.path.isdir(target):
            mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, size + ",mode=1777")
    for fd, path in zip(keep, header.get("keep", [])):
        os.makedirs(path, exist_ok=True)
        mount("/proc/self/fd/%d" % fd, path, None, MS_BIND | MS_REC)
        mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        os.close(fd)
    os.makedirs(header["cwd"], exist_ok=True)

def _drop_caps():
    # Stay uid 0 (the interpreter may live in a root-only folder) but give up
    # every capability, for this process and for anything it executes.
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECUREBITS = 24, 38, 28
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_SET_SECUREBITS, 0x2F, 0, 0, 0)  # NOROOT, NO_SETUID_FIXUP, and their locks
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
'''

_SHARED_SOURCE = f"CALLS_DIRECTIVE = {CALLS_DIRECTIVE!r}\n" + PLAIN_SOURCE + _SHARED_SOURCE

RUNNER_SOURCE = _SHARED_SOURCE + "\n_corrgrpo_boot()\n"

# The fork server. argv: the control socket's fd and the server's config (a Python
# literal). Protocol on the SOCK_SEQPACKET control socket:
#   server -> host  b"ready"                      once isolated and preloaded
#   host -> server  b"R <timeout>" + 4 fds        stdin, stdout, stderr, status of one program
#   host -> server  b"K"                          kill the running program (output cap hit)
#   server -> host  b"D <kind> <code> <clean> <cpu_ns>"
#                                                 kind: exit, timeout or killed; code: exit
#                                                 code (negative: signal); clean 0: the server
#                                                 could not restore a clean state and exits;
#                                                 cpu_ns: CPU time of the program's processes
# The program itself (header and source) travels on its stdin pipe straight to the child,
# so the server never holds a program's text or output.
_SERVER_PART = r'''
def _corrgrpo_serve():
    import socket, select, signal, time
    sock = socket.socket(fileno=int(sys.argv[1]))
    config = eval(sys.argv[2], {"__builtins__": {}})
    if config.get("isolate_fs"):
        _isolate_fs(config)
    if config.get("drop_caps"):
        _drop_caps()
    os.chdir("/")
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
    # Child subreaper: processes a program leaves behind become the server's children, so
    # their CPU time is counted with the program's and the server reaps them.
    libc.prctl(36, 1, 0, 0, 0)
    import resource
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    me = os.getpid()
    roots = _corrgrpo_writable_roots()
    snapshot = _corrgrpo_fs_state(roots)
    itself = _corrgrpo_self_state()
    sock.sendall(b"ready")
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 256, 8)
        if not msg:
            _corrgrpo_quit()
        if not msg.startswith(b"R ") or len(fds) != 4:
            for fd in fds:
                os.close(fd)
            continue  # a late kill request for a program that already ended
        before = _corrgrpo_children_cpu_ns(resource)
        pid = os.fork()
        if pid == 0:
            _corrgrpo_child(fds)
        for fd in fds:
            os.close(fd)
        kind, code = _corrgrpo_wait(sock, pid, float(msg[2:]), select, signal, time)
        clean = _corrgrpo_reap(me, signal, time)
        # CPU time of the program and of every process it left behind (all reaped by now:
        # the server is their subreaper), counted by the kernel, out of the program's reach.
        cpu_ns = _corrgrpo_children_cpu_ns(resource) - before
        clean = clean and _corrgrpo_clean(roots, snapshot) and _corrgrpo_self_state() == itself
        sock.sendall(b"D %s %d %d %d" % (kind, code, int(clean), cpu_ns))
        if not clean:
            _corrgrpo_quit()

def _corrgrpo_quit():
    try:
        os.kill(-1, 9)
    except OSError:
        pass
    os._exit(0)

def _corrgrpo_child(fds):
    code = 1
    try:
        os.setsid()
        for target, fd in enumerate(fds):  # stdin, stdout, stderr, status channel (fd 3)
            os.dup2(fd, target)
        os.closerange(4, 1 << 20)  # the control socket and everything else of the server
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
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

def _corrgrpo_children_cpu_ns(resource):
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return int(round((usage.ru_utime + usage.ru_stime) * 1e9))

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

def _corrgrpo_writable_roots():
    # The tmpfs mounts a program can write to; a later mount on the same point hides the
    # earlier ones, so the last line of each point decides.
    top = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            fstype = parts[parts.index("-") + 1]
            top[parts[4].replace("\\040", " ")] = fstype == "tmpfs" and "rw" in parts[5].split(",")
    return [point for point, writable in top.items() if writable]

def _corrgrpo_fs_state(roots):
    # Every path on the writable file systems with its type, mode and owner (and size and
    # mtime for files); directories of other mounts are not entered.
    state = {}
    def walk(path, dev):
        try:
            entries = list(os.scandir(path))
        except PermissionError:
            return  # a folder the program made unreadable: removed as a whole
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            is_dir = (st.st_mode & 0o170000) == 0o040000
            state[entry.path] = (st.st_mode, st.st_uid, st.st_gid,
                                 0 if is_dir else st.st_size, 0 if is_dir else st.st_mtime_ns)
            if len(state) > 10000:
                raise OSError("too many files to clean")
            if is_dir and st.st_dev == dev:
                walk(entry.path, dev)
    for root in roots:
        st = os.lstat(root)
        state[root] = (st.st_mode, st.st_uid, st.st_gid, 0, 0)
        walk(root, st.st_dev)
    return state

def _corrgrpo_remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, 0o700)
        for entry in os.scandir(path):
            _corrgrpo_remove(entry.path)
        os.rmdir(path)
    else:
        os.unlink(path)

def _corrgrpo_clean(roots, snapshot):
    # Put the writable file systems back as they were at start-up (the program's folder,
    # anything it wrote in /tmp, /dev/shm...) and check that no System V IPC object is left;
    # anything that cannot be undone makes the server quit (the host starts a new one).
    try:
        now = _corrgrpo_fs_state(roots)
        if now == snapshot:
            return _corrgrpo_no_ipc()
        for path in now:
            if path not in snapshot and os.path.dirname(path) in snapshot:
                _corrgrpo_remove(path)
        return _corrgrpo_fs_state(roots) == snapshot and _corrgrpo_no_ipc()
    except (OSError, RecursionError, ValueError):
        return False

def _corrgrpo_self_state():
    # What a program with the server's uid could change about the server and so about every
    # later child: its nice value, CPU affinity and resource limits (setpriority, prlimit).
    import resource
    limits = [resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith("RLIMIT_")]
    return os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0)), limits

def _corrgrpo_no_ipc():
    for name in ("shm", "sem", "msg"):
        try:
            with open("/proc/sysvipc/" + name) as f:
                if len(f.read().splitlines()) > 1:
                    return False
        except OSError:
            pass
    return True
'''

SERVER_SOURCE = _SHARED_SOURCE + _SERVER_PART + "\n_corrgrpo_serve()\n"
