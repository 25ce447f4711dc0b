"""Probes of process attributes one sandboxed program could pass on to the next.

The programs of :mod:`corrgrpo_sandbox.carryover`: this text, then calls of ``change_<name>()``
for the chosen attributes and ``print_changes()`` (program A), or ``print_reads([...])``
(program B). A change tries every target the system call allows and records,
per target, ``changed`` or the errno the kernel answered; a read returns the attribute as the
program sees it at its start. Each change aims at other processes first and the program itself
last (a program at nice 19 in SCHED_IDLE with 32 descriptors is slow, not broken, for the
changes after). Standard library only: the text runs as an untrusted program would.
"""

import ctypes
import errno
import json
import os
import re
import resource
import signal
import socket

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
# numbers of the calls the C library does not wrap, on the sandbox's own machine
NR = {"x86_64": {"ioprio_set": 251, "ioprio_get": 252, "add_key": 248},
      "aarch64": {"ioprio_set": 30, "ioprio_get": 31, "add_key": 217},
      "riscv64": {"ioprio_set": 30, "ioprio_get": 31, "add_key": 217}}.get(os.uname().machine, {})
IOPRIO_WHO_PROCESS, IOPRIO_WHO_PGRP, IOPRIO_WHO_USER = 1, 2, 3
IOPRIO_IDLE = 3 << 13


def call(name, *args):
    """A system call the C library does not wrap, by name; raises OSError."""
    if name not in NR:
        raise OSError(errno.ENOSYS, "no number for " + name)
    ctypes.set_errno(0)
    value = libc.syscall(ctypes.c_long(NR[name]), *[
        a if a is None or isinstance(a, bytes) else ctypes.c_long(a) for a in args])
    if value < 0:
        raise OSError(ctypes.get_errno(), name)
    return value


def prctl(option, *args):
    ctypes.set_errno(0)
    value = libc.prctl(ctypes.c_int(option), *[ctypes.c_ulong(a) for a in args],
                       *[ctypes.c_ulong(0)] * (4 - len(args)))
    if value < 0:
        raise OSError(ctypes.get_errno(), f"prctl {option}")
    return value


def prctl_out(option):
    # the PR_GET_* options that store their answer in an int
    value = ctypes.c_int()
    prctl(option, ctypes.addressof(value))
    return value.value


def personality_now():
    # (the query, 0xffffffff, as the unsigned 64-bit word docker's profile compares it to)
    return libc.personality(ctypes.c_ulong(0xFFFFFFFF))


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as exc:
        return "unreadable: " + errno.errorcode.get(exc.errno, "?")


def status_lines(*prefixes):
    return [line for line in text("/proc/self/status").splitlines() if line.startswith(prefixes)]


PARENT = os.getppid()
try:
    PARENT_GROUP = os.getpgid(PARENT) if PARENT else 0
except OSError:
    PARENT_GROUP = 0
# the parent (a fork server) and pid 1 (the sandbox's first process); a fresh run in its own
# pid namespace is pid 1 itself, with no parent it can name
TARGETS = {"parent": PARENT, "pid 1": 1} if PARENT else {}
if os.getpid() == 1:
    TARGETS.pop("pid 1", None)

#: attribute -> {target: "changed" or the errno's name}
CHANGES = {}


def attempt(attribute, target, fn):
    try:
        fn()
        CHANGES.setdefault(attribute, {})[target] = "changed"
    except OSError as exc:
        CHANGES.setdefault(attribute, {})[target] = errno.errorcode.get(exc.errno, str(exc.errno))
    except Exception as exc:
        CHANGES.setdefault(attribute, {})[target] = type(exc).__name__


def safely(fn):
    try:
        return fn()
    except OSError as exc:
        return "error: " + errno.errorcode.get(exc.errno, "?")
    except Exception as exc:
        return "error: " + type(exc).__name__


def print_changes():
    """Program A's last line: what the kernel answered to each change."""
    print(json.dumps(CHANGES))


def print_reads(names):
    """Program B: every attribute of ``names`` as this program sees it."""
    print(json.dumps({name: safely(globals()["read_" + name]) for name in names}, default=str))


def change_nice():
    for name, pid in TARGETS.items():
        attempt("nice", name, lambda pid=pid: os.setpriority(os.PRIO_PROCESS, pid, 19))
    if PARENT_GROUP:
        attempt("nice", "parent group", lambda: os.setpriority(os.PRIO_PGRP, PARENT_GROUP, 19))
    attempt("nice", "uid", lambda: os.setpriority(os.PRIO_USER, os.getuid(), 19))
    attempt("nice", "self", lambda: os.setpriority(os.PRIO_PROCESS, 0, 19))


def read_nice():
    return os.getpriority(os.PRIO_PROCESS, 0)


def change_io_priority():
    for name, pid in TARGETS.items():
        attempt("io_priority", name,
                lambda pid=pid: call("ioprio_set", IOPRIO_WHO_PROCESS, pid, IOPRIO_IDLE))
    if PARENT_GROUP:
        attempt("io_priority", "parent group",
                lambda: call("ioprio_set", IOPRIO_WHO_PGRP, PARENT_GROUP, IOPRIO_IDLE))
    # (the uid by number: kernels may answer ESRCH to IOPRIO_WHO_USER with 0, "my uid")
    attempt("io_priority", "uid",
            lambda: call("ioprio_set", IOPRIO_WHO_USER, os.getuid(), IOPRIO_IDLE))
    attempt("io_priority", "self", lambda: call("ioprio_set", IOPRIO_WHO_PROCESS, 0, IOPRIO_IDLE))


def read_io_priority():
    return call("ioprio_get", IOPRIO_WHO_PROCESS, 0)


def change_scheduling():
    for name, pid in TARGETS.items():
        attempt("scheduling", name,
                lambda pid=pid: os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0)))
    attempt("scheduling", "self",
            lambda: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0)))


def read_scheduling():
    return [os.sched_getscheduler(0), os.sched_getparam(0).sched_priority]


def change_cpu_affinity():
    one = {min(os.sched_getaffinity(0))}
    for name, pid in TARGETS.items():
        attempt("cpu_affinity", name, lambda pid=pid: os.sched_setaffinity(pid, one))
    attempt("cpu_affinity", "self", lambda: os.sched_setaffinity(0, one))


def read_cpu_affinity():
    return sorted(os.sched_getaffinity(0))


def _lower_rlimits(pid):
    for kind, value in ((resource.RLIMIT_NOFILE, 32), (resource.RLIMIT_STACK, 1 << 20),
                        (resource.RLIMIT_MEMLOCK, 4096), (resource.RLIMIT_NICE, 0)):
        resource.prlimit(pid, kind, (value, value))


def change_rlimits():
    for name, pid in TARGETS.items():
        attempt("rlimits", name, lambda pid=pid: _lower_rlimits(pid))
    attempt("rlimits", "self", lambda: _lower_rlimits(0))


def read_rlimits():
    return {n: list(resource.getrlimit(getattr(resource, n))) for n in sorted(dir(resource))
            if n.startswith("RLIMIT_")}


def _change_proc_file(attribute, file, value):
    # /proc/<pid>/<file> of every target, then the program's own
    for name, pid in TARGETS.items():
        attempt(attribute, name, lambda pid=pid: write(f"/proc/{pid}/{file}", value))
    attempt(attribute, "self", lambda: write(f"/proc/self/{file}", value))


def change_oom_score_adj():
    _change_proc_file("oom_score_adj", "oom_score_adj", "1000")


def read_oom_score_adj():
    return text("/proc/self/oom_score_adj")


def change_timer_slack():
    for name, pid in TARGETS.items():
        attempt("timer_slack", name, lambda pid=pid: write(f"/proc/{pid}/timerslack_ns", "50000000"))
    attempt("timer_slack", "self", lambda: prctl(29, 50000000))  # PR_SET_TIMERSLACK


def read_timer_slack():
    return prctl(30)


def change_coredump_filter():
    _change_proc_file("coredump_filter", "coredump_filter", "0x7f")


def read_coredump_filter():
    return text("/proc/self/coredump_filter")


def change_process_name():
    for name, pid in TARGETS.items():
        attempt("process_name", name, lambda pid=pid: write(f"/proc/{pid}/comm", "carried"))
    attempt("process_name", "self",
            lambda: prctl(15, ctypes.addressof(ctypes.create_string_buffer(b"carried"))))


def read_process_name():
    return text("/proc/self/comm")


def change_autogroup():
    _change_proc_file("autogroup", "autogroup", "19")


def read_autogroup():
    return re.sub(r"^/autogroup-[0-9]+ ", "", text("/proc/self/autogroup"))


def _cgroup_files():
    # every file of the sandbox's control groups it can see (a bounded walk)
    found = []
    for top, _folders, files in os.walk("/sys/fs/cgroup"):
        found += [os.path.join(top, f) for f in files]
        if len(found) > 4000:
            break
    return found


def _cgroup_write():
    written = []
    for path in _cgroup_files():
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError:
            continue
        os.close(fd)
        written.append(path)
    if not written:  # (opening is enough: a write could set a limit of the next program)
        raise OSError(errno.EACCES, "no file of a control group is writable")


def change_cgroup():
    attempt("cgroup", "group files", _cgroup_write)
    attempt("cgroup", "new group", lambda: os.mkdir("/sys/fs/cgroup/corrgrpo-carried"))


def read_cgroup():
    limits = ("memory.max", "pids.max", "cpu.max", "memory/memory.limit_in_bytes",
              "pids/pids.max", "cpu/cpu.cfs_quota_us")
    return [re.sub(r"[0-9a-f]{64}|sb-[0-9]+-[0-9a-f]{12}", "*", line)
            for line in text("/proc/self/cgroup").splitlines()] + [
        text("/sys/fs/cgroup/" + f) for f in limits if os.path.exists("/sys/fs/cgroup/" + f)]


def change_keyrings():
    for name, ring in (("session", -3), ("user", -4), ("user session", -5), ("process", -2)):
        attempt("keyrings", name,
                lambda ring=ring: call("add_key", b"user", b"corrgrpo-carried", b"v", 1, ring))


def read_keyrings():
    return sorted(name for name in (line.split()[8].rstrip(":") for line in
                  text("/proc/keys").splitlines() if len(line.split()) > 8) if name != "_ses")


def change_hostname():
    attempt("hostname", "host name", lambda: socket.sethostname("carried"))
    attempt("hostname", "domain name", lambda: write("/proc/sys/kernel/domainname", "carried"))


def read_hostname():
    return [re.sub(r"^[0-9a-f]{12}$", "*", os.uname().nodename),  # (docker: the container's id)
            text("/proc/sys/kernel/domainname")]


def change_umask():
    attempt("umask", "self", lambda: os.umask(0o777))


def read_umask():
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def change_cwd():
    attempt("cwd", "self", lambda: os.chdir("/"))


def read_cwd():
    return os.getcwd()


def change_environment():
    attempt("environment", "self",
            lambda: (os.putenv("CORRGRPO_CARRIED", "1"), os.unsetenv("PATH")))
    os.environ["CORRGRPO_CARRIED"] = "1"


def read_environment():
    # (docker: HOSTNAME is the container's id)
    return sorted((k, re.sub(r"^[0-9a-f]{12}$", "*", v) if k == "HOSTNAME" else v)
                  for k, v in os.environ.items())


def _signals():
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGALRM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGINT, lambda *a: None)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2, signal.SIGHUP})


def change_signals():
    attempt("signals", "self", _signals)


def read_signals():
    return status_lines("SigBlk", "SigIgn", "SigCgt", "SigPnd", "ShdPnd")


def _timers():
    signal.setitimer(signal.ITIMER_REAL, 3600)
    signal.setitimer(signal.ITIMER_VIRTUAL, 3600)
    signal.setitimer(signal.ITIMER_PROF, 3600)
    timer = ctypes.c_void_p()
    if libc.timer_create(1, None, ctypes.byref(timer)) != 0:  # CLOCK_MONOTONIC
        raise OSError(ctypes.get_errno(), "timer_create")


def change_timers():
    attempt("timers", "self", _timers)


def read_timers():
    return [signal.getitimer(t) for t in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL,
                                          signal.ITIMER_PROF)] + [text("/proc/self/timers")]


def _personality():
    # UNAME26 (docker's profile allows only a few personalities; this is one of them)
    if libc.personality(ctypes.c_ulong(0x0020000)) == -1 or personality_now() != 0x0020000:
        raise OSError(ctypes.get_errno(), "personality")


def change_personality():
    attempt("personality", "self", _personality)


def read_personality():
    return personality_now()


def change_securebits():
    attempt("securebits", "self", lambda: prctl(28, 0))


def read_securebits():
    return prctl(27)


def change_capabilities():
    attempt("capabilities", "bounding set", lambda: prctl(24, 21))  # PR_CAPBSET_DROP SYS_ADMIN
    attempt("capabilities", "ambient", lambda: prctl(47, 2, 21))  # PR_CAP_AMBIENT_RAISE


def read_capabilities():
    return status_lines("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


def _another_filter():
    allow = (ctypes.c_uint8 * 8).from_buffer_copy(bytes([6, 0, 0, 0, 0, 0, 0xFF, 0x7F]))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    prog = Prog(1, ctypes.addressof(allow))
    prctl(38, 1)
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp")


def change_no_new_privs_and_seccomp():
    attempt("no_new_privs_and_seccomp", "self", _another_filter)


def read_no_new_privs_and_seccomp():
    return [prctl(39)] + status_lines("NoNewPrivs", "Seccomp")


def change_process_flags():
    attempt("process_flags", "dumpable", lambda: prctl(4, 1))
    attempt("process_flags", "thp", lambda: prctl(41, 1, 0, 0, 0))
    attempt("process_flags", "speculation", lambda: prctl(53, 0, 4))  # store bypass: disable
    attempt("process_flags", "subreaper", lambda: prctl(36, 1))
    attempt("process_flags", "death signal", lambda: prctl(1, 10))


def read_process_flags():
    return [prctl(3), prctl(42), safely(lambda: prctl(52, 0)), prctl_out(37), prctl_out(2)]
