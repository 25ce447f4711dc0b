"""The bootstrap that runs inside every sandbox, before the untrusted program.

Sent as text to a fresh ``python -I -S -c`` (after :mod:`~corrgrpo_sandbox.inside.plain`;
:data:`corrgrpo_sandbox.runner.RUNNER_SOURCE`), or run by a fork server's child. It reads,
from standard input, one header line (a Python literal written by the host) and then the
program's source; applies the isolation that must happen inside the new process (private
mounts, dropped capabilities, resource limits, the seccomp filter); runs the program with
``exec``; and reports the outcome on the status channel, each line tagged with the run's token.
Standard library only: ``-S`` drops site-packages, and this package is not importable there.
"""

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # the same program text holds the codec (see corrgrpo_sandbox.runner)
    from corrgrpo_sandbox.inside.plain import _plain_decode, _plain_encode, _PlainError

#: First-line prefix of a program that asks the runner to call its entry.
CALLS_DIRECTIVE = "#corrgrpo-calls "


def _corrgrpo_boot():
    # (The program runs in this frame: it can find token, emit and report here, as the red
    # team's frame-walking attacks do; what they forge is worth nothing, see the host's judge.)
    header, source, calls = _corrgrpo_read_input()
    _corrgrpo_set_up(header)
    token, fd = header["token"], header.get("status_fd")
    emit = _corrgrpo_emitter(token, fd)

    def report(status, seconds=0.0):
        emit(f"{status} {seconds:.9f}")
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


def _corrgrpo_read_input():
    # The header is written by the host (trusted) as a Python literal: eval is far cheaper to
    # import than json, and start-up time is most of a short program's cost.
    header = eval(sys.stdin.buffer.readline().decode(), {"__builtins__": {}})
    source = sys.stdin.buffer.read().decode("utf-8", "replace")
    sys.stdin.close()
    calls = None
    if source.startswith(CALLS_DIRECTIVE):
        # Written by the host in front of the program: which function to call, on what.
        import json
        first, _, rest = source.partition("\n")
        calls = json.loads(first[len(CALLS_DIRECTIVE):])
        source = "\n" + rest  # the program keeps its line numbers
    return header, source, calls


def _corrgrpo_set_up(header):
    # Everything but the seccomp filter, which comes last (after the status channel is ready).
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
    _corrgrpo_rlimits(header.get("rlimits", {}))


def _corrgrpo_rlimits(limits):
    import resource
    for name, value in limits.items():
        kind = getattr(resource, name)
        soft, hard = resource.getrlimit(kind)
        value = int(value)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        try:
            resource.setrlimit(kind, (value, value if name != "RLIMIT_CPU" else value + 1))
        except (ValueError, OSError):
            pass


def _corrgrpo_emitter(token, fd):
    # Writes one tagged line on the status channel: fd ``fd``, or stderr (each line after a
    # newline, so it starts a line whatever the program printed) when there is none.
    def emit(text):
        line = f"{token} {text}\n".encode()
        if fd is None:
            sys.stderr.flush()
            line = b"\n" + line
        try:
            while line:
                line = line[os.write(2 if fd is None else fd, line):]
        except OSError:
            pass
    return emit


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
                emit(f"X {i} {type(exc).__name__}")
                return "error:" + type(exc).__name__
            try:
                nodes = _plain_encode(value, names)
            except (_PlainError, RecursionError, MemoryError) as exc:
                emit(f"P {i} " + (str(exc)[:60].replace("\n", " ") or "?"))
                return "error:NotPlain"
            emit(f"R {i} " + json.dumps(nodes, separators=(",", ":")))
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
        raise OSError(f"no system call number for {name} on {os.uname().machine}")
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
            raise OSError(err, "cannot join a fresh session keyring: " + os.strerror(err))


def _corrgrpo_seccomp(program):
    # The host's filter (classic BPF from libseccomp: corrgrpo_sandbox.seccomp), for this
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
        os.write(2, f"cannot install the seccomp filter: {os.strerror(err)}\n".encode())
        os._exit(125)  # never run a program without it


_CORRGRPO_LIBC = []


def _corrgrpo_libc():
    # (made once per process: a fork server checks itself with it after every program)
    if not _CORRGRPO_LIBC:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                               ctypes.c_char_p]
        libc.syscall.restype = ctypes.c_long
        _CORRGRPO_LIBC.append((ctypes, libc))
    return _CORRGRPO_LIBC[0]


MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
#: Flags of a read-only remount of a bind mount.
_RO_BIND = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV


def _encoded(text):
    return None if text is None else text.encode()


def _mount(src, target, fstype, flags, data=None):
    ctypes, libc = _corrgrpo_libc()
    if libc.mount(_encoded(src), _encoded(target), _encoded(fstype), flags, _encoded(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _isolate_fs(header):
    # Runs as (namespace) root inside fresh mount, pid and network namespaces. Builds a new
    # root holding only the allow-list view (corrgrpo_sandbox.view), then pivots into it:
    # the host's other folders are absent, not merely unreadable.
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    view = header["view"]
    # Opened before anything is covered (the interpreter may live under /tmp).
    sources = [(path, os.open(path, os.O_PATH)) for path in view["binds"]]
    cpu_bind = header.get("cpu_bind")  # (host folder, where) of a fork server's control group
    if cpu_bind:
        sources.append((cpu_bind[1], os.open(cpu_bind[0], os.O_PATH)))
    devices = {name: os.open("/dev/" + name, os.O_PATH)
               for name in ("null", "zero", "random", "urandom")}
    new = "/tmp"  # the staging point: our own namespace's /tmp, covered by the new root
    _mount("corrgrpo-root", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1048576,mode=755")
    size = header.get("tmpfs_bytes", 64 << 20)
    tmpfs = header.get("tmpfs", [])
    writable = [new + t for t in tmpfs] + ([new + cpu_bind[1]] if cpu_bind else [])
    steps = [(p, "bind", fd) for p, fd in sources] + [(p, "link", t) for p, t in view["links"]]
    steps += [(t, "tmpfs", None) for t in tmpfs if t != "/dev/shm"]
    steps += [("/dev", "dev", None), ("/proc", "proc", None)]
    for path, kind, arg in sorted(steps, key=lambda s: s[0].split("/")):
        _corrgrpo_place(new + path, kind, arg, size)
        if kind == "dev":
            _corrgrpo_fill_dev(new + path, devices, "/dev/shm" in tmpfs, size)
    os.makedirs(new + header["cwd"], exist_ok=True)
    if header.get("program_uid") is not None:
        os.chown(new + header["cwd"], header["program_uid"], header["program_uid"])
    _corrgrpo_read_only_below(new, writable)
    _corrgrpo_pivot(new)
    _corrgrpo_hide(view)
    _corrgrpo_mask(header.get("masked_proc", ()))


def _corrgrpo_place(target, kind, arg, size):
    # One step of the new root: a symbolic link, a bind of an opened fd (file or folder), a
    # private tmpfs, /proc or an empty /dev.
    if kind == "link":
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.lexists(target):
            os.symlink(arg, target)
        return
    if kind == "bind" and not os.path.isdir(f"/proc/self/fd/{arg}"):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            open(target, "w").close()
    else:
        os.makedirs(target, exist_ok=True)
    if kind == "bind":
        _mount(f"/proc/self/fd/{arg}", target, None, MS_BIND | MS_REC)
        os.close(arg)
    elif kind == "tmpfs":
        _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")
    elif kind == "proc":
        _mount("proc", target, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        # Kernel settings and triggers stay read-only even for a namespace root.
        for sub in ("sys", "sysrq-trigger", "irq", "bus", "fs", "acpi"):
            if os.path.exists(target + "/" + sub):
                _mount(target + "/" + sub, target + "/" + sub, None, MS_BIND | MS_REC)
                _mount(None, target + "/" + sub, None, _RO_BIND | MS_NOEXEC)
    else:  # the host's device nodes a program may use; nothing else of /dev
        _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=65536,mode=755")


def _corrgrpo_fill_dev(target, devices, shm, size):
    for name, fd in devices.items():
        open(target + "/" + name, "w").close()
        _mount(f"/proc/self/fd/{fd}", target + "/" + name, None, MS_BIND)
        os.close(fd)
    for name, link in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                       ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(link, target + "/" + name)
    os.mkdir(target + "/shm")
    if shm:
        _mount("tmpfs", target + "/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")


def _corrgrpo_read_only_below(new, writable):
    # Everything bound is read-only (each mount of a recursive bind on its own), keeping the
    # flags a user namespace may not drop.
    with open("/proc/self/mountinfo") as f:
        mounts = [(p[4].replace("\\040", " "), p[5].split(",")) for p in (ln.split() for ln in f)]
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


def _corrgrpo_pivot(new):
    ctypes, libc = _corrgrpo_libc()
    os.chdir(new)
    number = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
    if libc.syscall(number.get(os.uname().machine, 155), b".", b".") != 0:
        raise OSError(ctypes.get_errno(), "pivot_root failed")
    if libc.umount2(b".", 2) != 0:  # MNT_DETACH: the host's root leaves this namespace
        raise OSError(ctypes.get_errno(), "umount of the old root failed")
    os.chdir("/")


def _corrgrpo_hide(view):
    # Data inside allowed folders (reference solutions, tests): covered, after the pivot so that
    # symbolic links resolve inside the new root.
    for path in view["hide_dirs"]:
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4096,mode=755")
        _mount(None, path, None, _RO_BIND | MS_NOEXEC)
    for path in view["hide_files"]:
        _mount("/dev/null", path, None, MS_BIND)
        _mount(None, path, None, _RO_BIND | MS_NOEXEC)
    _mount(None, "/", None, _RO_BIND)


def _corrgrpo_mask(paths):
    # Files of /proc that list what the host and other sandboxes hold (/proc/locks: every
    # open-file-description lock, whatever its pid namespace): covered by a nodev bind of
    # /dev/null, which cannot be opened.
    for path in paths:
        if os.path.exists(path):
            _mount("/dev/null", path, None, MS_BIND)
            _mount(None, path, None, _RO_BIND | MS_NOEXEC)


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
            raise OSError(f"still uid {os.geteuid()}")
