"""The bootstrap that runs inside every sandbox, before the untrusted program.

It is passed to a fresh ``python -I -S -c`` and reads, from standard input, one
header line (a Python literal) and then the program's source. It applies the isolation that
must happen inside the new process (private mounts, dropped capabilities,
resource limits), runs the program with ``exec`` and reports the outcome on a
separate status channel, tagged with a one-time token so that printing or exiting
early does not read as a pass. A program that starts with a calls directive
(:mod:`corrgrpo_envs.sandbox.calls`) also has its entry called on the given
inputs, one record per call on that channel; those records are all the host
judges (the program can reach the channel, so nothing there is trusted).

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
        _confine(header.get("program_uid"))
    if header.get("make_cwd"):
        os.makedirs(header["cwd"], exist_ok=True)
    # Nothing of the keyrings of whoever started the sandbox (or of an earlier program).
    _corrgrpo_fresh_keyring(header.get("syscalls", {}))
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
    if header.get("seccomp"):
        _corrgrpo_seccomp(header["seccomp"])
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

#: System call numbers where the host cannot resolve them (x86_64; the generic table).
_SYSCALLS = {"x86_64": {"keyctl": 250, "ioprio_set": 251, "ioprio_get": 252},
             "aarch64": {"keyctl": 219, "ioprio_set": 30, "ioprio_get": 31},
             "riscv64": {"keyctl": 219, "ioprio_set": 30, "ioprio_get": 31}}

def _corrgrpo_syscall_nr(name, numbers):
    nr = numbers.get(name, _SYSCALLS.get(os.uname().machine, {}).get(name))
    if nr is None:
        raise OSError("no system call number for %s on %s" % (name, os.uname().machine))
    return nr

def _corrgrpo_fresh_keyring(numbers):
    # keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL): a new anonymous session keyring, so the session
    # keyring inherited from the host (or the fork server) is no longer reachable. A filter that
    # denies keyctl itself (docker's default profile, ours) leaves nothing to reach.
    ctypes, libc = _corrgrpo_libc()
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(_corrgrpo_syscall_nr("keyctl", numbers)), ctypes.c_long(1),
                    ctypes.c_void_p(None)) < 0:
        err = ctypes.get_errno()
        if err not in (1, 38):  # EPERM, ENOSYS: keyctl is denied to the program too
            raise OSError(err, "cannot join a fresh session keyring: %s" % os.strerror(err))

def _corrgrpo_seccomp(program):
    # The host's filter (classic BPF from libseccomp: corrgrpo_envs.sandbox.seccomp), for this
    # process and everything it starts, irrevocably; the last set-up step before the program.
    ctypes, libc = _corrgrpo_libc()
    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    code = ctypes.create_string_buffer(program, len(program))
    prog = _Prog(len(program) // 8, ctypes.cast(code, ctypes.c_void_p))
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    zero = ctypes.c_ulong(0)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), zero, zero, zero) != 0 or \
            libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(prog),
                       zero, zero) != 0:
        err = ctypes.get_errno()
        os.write(2, ("cannot install the seccomp filter: %s\n" % os.strerror(err)).encode())
        os._exit(125)  # never run a program without it

_CORRGRPO_LIBC = []

def _corrgrpo_libc():
    # (made once per process: a fork server checks itself with it after every program)
    if not _CORRGRPO_LIBC:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        libc.syscall.restype = ctypes.c_long
        _CORRGRPO_LIBC.append((ctypes, libc))
    return _CORRGRPO_LIBC[0]

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18

def _mount(src, target, fstype, flags, data=None):
    ctypes, libc = _corrgrpo_libc()
    enc = lambda s: None if s is None else s.encode()
    if libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "mount %s: %s" % (target, os.strerror(err)))

def _bind_ro(fd, path):
    # Bind an fd opened before its folder was covered (any permissions) read-only on path.
    os.makedirs(path, exist_ok=True)
    _mount("/proc/self/fd/%d" % fd, path, None, MS_BIND | MS_REC)
    _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.close(fd)

def _tmpfs_with_keeps(points, size, keep, mode="1777", ro=False):
    # Fresh tmpfs on each point; folders of ``keep`` that lived under one stay visible, read-only.
    covered = [k for k in keep if any(k == p or k.startswith(p.rstrip("/") + "/") for p in points)]
    fds = [os.open(k, os.O_PATH) for k in covered]
    for target in points:
        if os.path.isdir(target):
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, "size=%d,mode=%s" % (size, mode))
    for fd, path in zip(fds, covered):
        _bind_ro(fd, path)
    if ro:
        for target in points:
            if os.path.isdir(target):
                _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)

def _isolate_fs(header):
    # Runs as (namespace) root inside fresh mount, pid and network namespaces. Builds a new
    # root holding only the allow-list view (corrgrpo_envs.sandbox.view), then pivots into it:
    # the host's other folders are absent, not merely unreadable.
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    view = header["view"]
    # Opened before anything is covered (the interpreter may live under /tmp).
    sources = [(path, os.open(path, os.O_PATH)) for path in view["binds"]]
    cpu_bind = header.get("cpu_bind")  # (host folder, where) of a fork server's control group
    if cpu_bind:
        sources.append((cpu_bind[1], os.open(cpu_bind[0], os.O_PATH)))
    devices = {name: os.open("/dev/" + name, os.O_PATH) for name in ("null", "zero", "random", "urandom")}
    new = "/tmp"  # the staging point: our own namespace's /tmp, covered by the new root
    _mount("corrgrpo-root", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1048576,mode=755")
    size = header.get("tmpfs_bytes", 64 << 20)
    writable = [new + t for t in header.get("tmpfs", [])] + ([new + cpu_bind[1]] if cpu_bind else [])
    steps = [(p, "bind", fd) for p, fd in sources] + [(p, "link", t) for p, t in view["links"]]
    steps += [(t, "tmpfs", None) for t in header.get("tmpfs", []) if t != "/dev/shm"]
    steps += [("/dev", "dev", None), ("/proc", "proc", None)]
    for path, kind, arg in sorted(steps, key=lambda s: s[0].split("/")):
        target = new + path
        if kind == "link":
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if not os.path.lexists(target):
                os.symlink(arg, target)
            continue
        if kind == "bind" and not os.path.isdir("/proc/self/fd/%d" % arg):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if not os.path.exists(target):
                open(target, "w").close()
        else:
            os.makedirs(target, exist_ok=True)
        if kind == "bind":
            _mount("/proc/self/fd/%d" % arg, target, None, MS_BIND | MS_REC)
            os.close(arg)
        elif kind == "tmpfs":
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, "size=%d,mode=1777" % size)
        elif kind == "proc":
            _mount("proc", target, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            # Kernel settings and triggers stay read-only even for a namespace root.
            for sub in ("sys", "sysrq-trigger", "irq", "bus", "fs", "acpi"):
                if os.path.exists(target + "/" + sub):
                    _mount(target + "/" + sub, target + "/" + sub, None, MS_BIND | MS_REC)
                    _mount(None, target + "/" + sub, None,
                           MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        else:  # the host's device nodes a program may use; nothing else of /dev
            _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=65536,mode=755")
            for name, fd in devices.items():
                open(target + "/" + name, "w").close()
                _mount("/proc/self/fd/%d" % fd, target + "/" + name, None, MS_BIND)
                os.close(fd)
            for name, link in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                               ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
                os.symlink(link, target + "/" + name)
            os.mkdir(target + "/shm")
            if "/dev/shm" in header.get("tmpfs", []):
                _mount("tmpfs", target + "/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=%d,mode=1777" % size)
    os.makedirs(new + header["cwd"], exist_ok=True)
    if header.get("program_uid") is not None:
        os.chown(new + header["cwd"], header["program_uid"], header["program_uid"])
    # Everything bound is read-only (each mount of a recursive bind on its own), keeping the
    # flags a user namespace may not drop.
    with open("/proc/self/mountinfo") as f:
        mounts = [(p[4].replace("\\040", " "), p[5].split(",")) for p in (l.split() for l in f)]
    for point, opts in mounts:
        if not point.startswith(new + "/") or point in writable or point.startswith(new + "/proc"):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for name, bit in (("nosuid", MS_NOSUID), ("nodev", MS_NODEV), ("noexec", MS_NOEXEC)):
            if name in opts:
                flags |= bit
        try:
            _mount(None, point, None, flags)
        except OSError:
            if point != new + "/dev":
                raise
    ctypes, libc = _corrgrpo_libc()
    os.chdir(new)
    number = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
    if libc.syscall(number.get(os.uname().machine, 155), b".", b".") != 0:
        raise OSError(ctypes.get_errno(), "pivot_root failed")
    if libc.umount2(b".", 2) != 0:  # MNT_DETACH: the host's root leaves this namespace
        raise OSError(ctypes.get_errno(), "umount of the old root failed")
    os.chdir("/")
    # Data inside allowed folders (reference solutions, tests): covered, after the pivot so that
    # symbolic links resolve inside the new root.
    for path in view["hide_dirs"]:
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4096,mode=755")
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for path in view["hide_files"]:
        _mount("/dev/null", path, None, MS_BIND)
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)

#: Capabilities a fork server keeps to give each child fresh mount and IPC namespaces, switch
#: it to the program's uid and kill what it leaves behind (the child then drops them all).
SERVER_CAPS = (0, 1, 3, 5, 6, 7, 8, 21)  # CHOWN DAC_OVERRIDE FOWNER KILL SETGID SETUID SETPCAP SYS_ADMIN

def _confine(uid=None, keep=()):
    # Give up every capability (but ``keep``) for this process and anything it executes; as
    # the host's root, first become the unprivileged ``uid`` (never run a program as root).
    ctypes, libc = _corrgrpo_libc()
    PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECUREBITS = 24, 38, 28
    for cap in range(64):
        if cap not in keep:
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    if not keep:
        libc.prctl(PR_SET_SECUREBITS, 0x2F, 0, 0, 0)  # NOROOT, NO_SETUID_FIXUP, and their locks
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    mask = 0
    for cap in keep:
        mask |= 1 << cap
    with open("/proc/self/status") as f:  # only what this process holds can be kept
        mask &= int([line for line in f if line.startswith("CapPrm:")][0].split()[1], 16)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)(mask & 0xFFFFFFFF, mask & 0xFFFFFFFF, 0, mask >> 32, mask >> 32, 0)
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
    if not keep:
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if uid is not None and (os.getuid(), os.geteuid()) != (uid, uid):
            raise OSError("still uid %d" % os.geteuid())

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
            raise OSError(ctypes.get_errno(), "umount %s failed" % config["cpu_mount"])
    _tmpfs_with_keeps(config["fresh_tmpfs"], config["tmpfs_bytes"], config.get("keep", []))
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
#                                                 cpu_ns: CPU time of the program's control
#                                                 group, -1 without one
# The program itself (header and source) travels on its stdin pipe straight to the child,
# so the server never holds a program's text or output.
_SERVER_PART = r'''
def _corrgrpo_serve():
    import socket, select, signal, time
    sock = _corrgrpo_control(socket, sys.argv[1])
    config = eval(sys.argv[2], {"__builtins__": {}})
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
    me = os.getpid()
    _corrgrpo_probe_child(config)
    roots = _corrgrpo_writable_roots()
    snapshot = _corrgrpo_fs_state(roots)
    numbers = config.get("syscalls", {})
    itself = _corrgrpo_self_state(numbers)
    key_owner = config.get("program_uid")
    key_owner = os.getuid() if key_owner is None else key_owner
    kernel = _corrgrpo_kernel_state(key_owner)
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
        clean = clean and _corrgrpo_clean(roots, snapshot) \
            and _corrgrpo_self_restored(numbers, itself) \
            and _corrgrpo_kernel_settled(key_owner, kernel, time)
        sock.sendall(b"D %s %d %d %d" % (kind, code, int(clean), cpu_ns))
        if not clean:
            _corrgrpo_quit()

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
            os.write(2, ("child isolation failed: %r\n" % (exc,)).encode())
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

def _corrgrpo_writable_roots():
    # The tmpfs mounts a program can write to; a later mount on the same point hides the
    # earlier ones, so the last line of each point decides.
    top = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            fstype = parts[parts.index("-") + 1]
            top[parts[4].replace("\\040", " ")] = (fstype in ("tmpfs", "mqueue")
                                                    and "rw" in parts[5].split(","))
    # (folders only: a container masks files such as /proc/keys with a tmpfs file)
    # (kernel file systems are not the program's to write: /sys/fs/cgroup of a container)
    return [point for point, writable in top.items()
            if writable and os.path.isdir(point) and not os.path.islink(point)
            and not point.startswith(("/proc/", "/sys/")) and point not in ("/proc", "/sys")]

def _corrgrpo_xattrs(path):
    try:
        names = os.listxattr(path, follow_symlinks=False)
        return tuple(sorted((n, os.getxattr(path, n, follow_symlinks=False)) for n in names))
    except OSError:
        return ()

def _corrgrpo_entry(st, path):
    # type, mode, owner, size (files), modification time and extended attributes
    is_dir = (st.st_mode & 0o170000) == 0o040000
    return (st.st_mode, st.st_uid, st.st_gid, 0 if is_dir else st.st_size, st.st_mtime_ns,
            _corrgrpo_xattrs(path))

def _corrgrpo_fs_state(roots):
    # Every path on the writable file systems (see _corrgrpo_entry); directories of other
    # mounts are not entered.
    state = {}
    def walk(path, dev):
        try:
            entries = list(os.scandir(path))
        except PermissionError:
            return  # a folder the program made unreadable: removed as a whole
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            is_dir = (st.st_mode & 0o170000) == 0o040000
            # another mount's root: its contents are that mount's business (a root of its own
            # when writable)
            state[entry.path] = _corrgrpo_entry(st, entry.path) if st.st_dev == dev else \
                (st.st_mode, st.st_uid, st.st_gid, 0, None, ())
            if len(state) > 10000:
                raise OSError("too many files to clean")
            if is_dir and st.st_dev == dev:
                walk(entry.path, dev)
    for root in roots:
        st = os.lstat(root)
        state[root] = _corrgrpo_entry(st, root)
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
        for path, was in snapshot.items():  # extended attributes, then modification times
            if path in now and now[path][5] != was[5]:
                for name, _ in now[path][5]:
                    os.removexattr(path, name, follow_symlinks=False)
                for name, value in was[5]:
                    os.setxattr(path, name, value, follow_symlinks=False)
        for path in sorted(snapshot, key=len, reverse=True):
            st = os.lstat(path)
            if snapshot[path][4] not in (None, st.st_mtime_ns) and not os.path.islink(path):
                os.utime(path, ns=(st.st_atime_ns, snapshot[path][4]))
        return _corrgrpo_fs_state(roots) == snapshot and _corrgrpo_no_ipc()
    except (OSError, RecursionError, ValueError):
        return False

def _corrgrpo_self_state(numbers):
    # What a program could change about the server, and so about every later child (a child
    # inherits them at fork): where the kernel lets a process of the server's uid with no more
    # capabilities than the server act on it (docker: the same uid, no capabilities at all), a
    # program reaches, for each of the server's threads (setpriority, ioprio_set and
    # sched_setaffinity take thread ids; PRIO_USER and IOPRIO_WHO_USER reach them all), its
    # nice value, I/O priority, scheduling policy and priority and CPU affinity, and for the
    # process its resource limits (prlimit). Also compared: its timer slack (CAP_SYS_NICE to
    # change from outside), whether anything traces it or could (its tracer and dumpable flag),
    # its filters and identity. (Its /proc files, such as oom_score_adj, belong to root while it
    # is not dumpable: no program writes them.)
    import resource
    ctypes, libc = _corrgrpo_libc()
    threads = {}
    for name in sorted(os.listdir("/proc/self/task")):
        tid = int(name)
        threads[tid] = (os.getpriority(os.PRIO_PROCESS, tid), _corrgrpo_ioprio(numbers, tid),
                        os.sched_getscheduler(tid), os.sched_getparam(tid).sched_priority,
                        tuple(sorted(os.sched_getaffinity(tid))))
    limits = [(n, resource.getrlimit(getattr(resource, n))) for n in sorted(dir(resource))
              if n.startswith("RLIMIT_")]
    with open("/proc/self/status") as f:
        tracer = [line for line in f if line.startswith(("TracerPid:", "NoNewPrivs:", "Seccomp:"))]
    return (threads, limits, tracer, libc.prctl(3, 0, 0, 0, 0),  # PR_GET_DUMPABLE
            libc.prctl(30, 0, 0, 0, 0),  # PR_GET_TIMERSLACK
            os.getresuid(), os.getresgid(), os.getgroups())

def _corrgrpo_ioprio(numbers, tid, value=None):
    # ioprio_get/ioprio_set(IOPRIO_WHO_PROCESS, tid[, value]); None where the call is missing
    ctypes, libc = _corrgrpo_libc()
    try:
        nr = _corrgrpo_syscall_nr("ioprio_get" if value is None else "ioprio_set", numbers)
    except OSError:
        return None
    args = [ctypes.c_long(nr), ctypes.c_long(1), ctypes.c_long(tid)]
    if value is not None:
        args.append(ctypes.c_long(value))
    result = libc.syscall(*args)
    if value is not None and result < 0:
        raise OSError(ctypes.get_errno(), "ioprio_set")
    return result

def _corrgrpo_restore_self(numbers, state):
    # Put back what a process may set again on itself without a capability: each thread's I/O
    # priority (a best-effort or idle class), CPU affinity (within its cpuset) and a policy of
    # SCHED_BATCH back to SCHED_OTHER, and soft resource limits up to the hard ones. A raised
    # nice value, SCHED_IDLE or a lowered hard limit need a capability (or RLIMIT_NICE) the
    # server does not have: the comparison that follows fails and the server quits.
    import resource
    threads, limits = state[0], state[1]
    for tid, (nice, ioprio, policy, priority, cpus) in threads.items():
        for restore in ("ioprio", "affinity", "policy", "nice"):
            try:
                if restore == "ioprio" and ioprio is not None:
                    _corrgrpo_ioprio(numbers, tid, ioprio)
                elif restore == "affinity":
                    os.sched_setaffinity(tid, cpus)
                elif restore == "policy":
                    os.sched_setscheduler(tid, policy, os.sched_param(priority))
                elif restore == "nice":
                    os.setpriority(os.PRIO_PROCESS, tid, nice)
            except OSError:
                pass
    for name, value in limits:
        try:
            resource.setrlimit(getattr(resource, name), value)
        except (OSError, ValueError):
            pass

def _corrgrpo_self_restored(numbers, state):
    # Whether the server is as it was at start-up, once put back where it can be (a thread
    # that vanished while being read: not as it was).
    try:
        if _corrgrpo_self_state(numbers) == state:
            return True
        _corrgrpo_restore_self(numbers, state)
        return _corrgrpo_self_state(numbers) == state
    except OSError:
        return False

def _corrgrpo_kernel_state(uid):
    # Kernel objects a program could leave for the next one outside its namespaces: the keys
    # its uid owns (/proc/key-users: keys, instantiated keys, quota in keys and bytes; the
    # user and user-session keyrings of a uid outlive its processes) and the unix sockets of
    # the server's network namespace (an abstract socket kept alive by a descriptor cycle).
    keys = (0, 0, 0, 0)  # keys, instantiated keys, keys and bytes counted against the quota
    try:
        with open("/proc/key-users") as f:
            for line in f:
                head, _, rest = line.partition(":")
                if head.strip() == str(uid):
                    # "<uid>: <usage> <keys>/<instantiated> <quota keys>/<max> <bytes>/<max>"
                    counts = [part.split("/") for part in rest.split()[1:4]]
                    keys = (int(counts[0][0]), int(counts[0][1]), int(counts[1][0]),
                            int(counts[2][0]))
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/proc/net/unix") as f:
            sockets = frozenset(line.split()[6] for line in list(f)[1:] if len(line.split()) > 6)
    except OSError:
        sockets = frozenset()
    return keys, sockets

#: What three anonymous session keyrings ("_ses", 5 bytes each) count in /proc/key-users.
_PENDING_KEYRINGS = (3, 3, 3, 15)

def _corrgrpo_kernel_settled(uid, start, time):
    # The kernel frees a dead program's session keyring (after an RCU grace period, some
    # 60 ms) and its sockets asynchronously, so the keyrings of the last few programs may
    # still be counted. A key that outlives its program needs a keyring of the uid that
    # outlives it too: the user and user-session keyrings ("_uid.<uid>", "_uid_ses.<uid>",
    # 2 keys, 26 bytes for uid 65534) or the persistent one ("_persistent.<uid>", 18 bytes
    # for uid 65534, more for larger uids), more than three session keyrings' bytes. So up
    # to that much counts as settled; beyond it the server waits, and anything more half a
    # second later makes it quit.
    deadline = time.monotonic() + 0.5
    while True:
        keys, sockets = _corrgrpo_kernel_state(uid)
        extra = [now - was for now, was in zip(keys, start[0])]
        if all(e <= room for e, room in zip(extra, _PENDING_KEYRINGS)) and sockets <= start[1]:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)

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
