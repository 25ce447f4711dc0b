"""Process attributes one sandboxed program could change and a later program read.

Programs of one fork server are forked from it and inherit what it is (nice value, I/O
priority, limits...), and every program of a sandbox shares its kernel objects (a control
group, a uid's keyrings). So a program that changes one of those on its fork server, the
server's process group, its uid or its control group hands the change to the next program: a
channel between programs, and a way to slow or starve them. Each :class:`Attribute` here is one such
attribute, with two snippets of Python that run inside the sandbox:

* ``change`` tries to change it on every target the system call allows: the program itself
  (which must not matter), its parent (the fork server, or a fresh run's first process), pid 1
  of the sandbox, the parent's process group and every process of the program's uid; it
  records, per target, ``changed`` or the errno the kernel answered;
* ``read`` reads it as a program sees it at its start.

:func:`change_program` and :func:`read_program` put them together into one program each, and
:func:`check` runs them through one sandbox (read; change, read, for all attributes at once or
one program per attribute) and says which attributes carried (a later read differs). ``tests/test_sandbox_carryover.py`` runs it on every backend and
reuse mode; ``corrgrpo code redteam`` runs it as the attack class ``carried_attributes``.

The programs call a few system calls by number (``ioprio_get``, ``ioprio_set``, ``add_key``):
their table is keyed by the sandbox's own machine (a Docker engine may run on another one);
on a machine it does not know, those attributes read ``error: ENOSYS`` every time.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field

from corrgrpo_envs.sandbox.base import Sandbox

__all__ = ["ATTRIBUTES", "PRELUDE", "Attribute", "CarryReport", "change_program", "check",
           "read_program"]


@dataclass(frozen=True)
class Attribute:
    """One process attribute: ``name``, how a program could pass it on (``via``), and the
    snippets that change it (``change``: statements that call ``attempt(name, target, fn)``
    for each target) and read it (``read``: an expression)."""

    name: str
    via: str
    change: str
    read: str


#: Helpers every probe program starts with (Python source): ``call(name, *args)`` makes a
#: system call the C library does not wrap (``ioprio_set``, ``ioprio_get``, ``add_key``) and
#: raises ``OSError``, ``prctl``, ``write``, ``text``; ``TARGETS`` names the processes a change
#: can aim at (the parent, pid 1).
PRELUDE = r'''
import ctypes, errno, json, os, re, resource, signal, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
# numbers of the calls the C library does not wrap, on the sandbox's own machine
NR = {"x86_64": {"ioprio_set": 251, "ioprio_get": 252, "add_key": 248},
      "aarch64": {"ioprio_set": 30, "ioprio_get": 31, "add_key": 217},
      "riscv64": {"ioprio_set": 30, "ioprio_get": 31, "add_key": 217}}.get(os.uname().machine, {})
IOPRIO_WHO_PROCESS, IOPRIO_WHO_PGRP, IOPRIO_WHO_USER = 1, 2, 3
IOPRIO_IDLE = 3 << 13

def call(name, *args):
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
        raise OSError(ctypes.get_errno(), "prctl %d" % option)
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
'''

_CHANGE_HEAD = r'''
CHANGES = {}
def attempt(attribute, target, fn):
    try:
        fn()
        CHANGES.setdefault(attribute, {})[target] = "changed"
    except OSError as exc:
        CHANGES.setdefault(attribute, {})[target] = errno.errorcode.get(exc.errno, str(exc.errno))
    except Exception as exc:
        CHANGES.setdefault(attribute, {})[target] = type(exc).__name__
'''

_READ_HEAD = r'''
def safely(fn):
    try:
        return fn()
    except OSError as exc:
        return "error: " + errno.errorcode.get(exc.errno, "?")
    except Exception as exc:
        return "error: " + type(exc).__name__
'''

#: Every attribute. Each changes other processes first and the program itself last (a program
#: at nice 19 in SCHED_IDLE with 32 descriptors is slow, not broken, for the changes after).
ATTRIBUTES: tuple[Attribute, ...] = (
    Attribute("nice", "setpriority on the fork server, its process group or the uid",
              change='''
for name, pid in TARGETS.items():
    attempt("nice", name, lambda: os.setpriority(os.PRIO_PROCESS, pid, 19))
if PARENT_GROUP:
    attempt("nice", "parent group", lambda: os.setpriority(os.PRIO_PGRP, PARENT_GROUP, 19))
attempt("nice", "uid", lambda: os.setpriority(os.PRIO_USER, os.getuid(), 19))
attempt("nice", "self", lambda: os.setpriority(os.PRIO_PROCESS, 0, 19))
''', read="os.getpriority(os.PRIO_PROCESS, 0)"),
    Attribute("io_priority", "ioprio_set on the fork server, its process group or the uid",
              change='''
for name, pid in TARGETS.items():
    attempt("io_priority", name, lambda: call("ioprio_set", IOPRIO_WHO_PROCESS, pid, IOPRIO_IDLE))
if PARENT_GROUP:
    attempt("io_priority", "parent group",
            lambda: call("ioprio_set", IOPRIO_WHO_PGRP, PARENT_GROUP, IOPRIO_IDLE))
# (the uid by number: kernels may answer ESRCH to IOPRIO_WHO_USER with 0, "my uid")
attempt("io_priority", "uid",
        lambda: call("ioprio_set", IOPRIO_WHO_USER, os.getuid(), IOPRIO_IDLE))
attempt("io_priority", "self", lambda: call("ioprio_set", IOPRIO_WHO_PROCESS, 0, IOPRIO_IDLE))
''', read='call("ioprio_get", IOPRIO_WHO_PROCESS, 0)'),
    Attribute("scheduling", "sched_setscheduler on the fork server",
              change='''
for name, pid in TARGETS.items():
    attempt("scheduling", name, lambda: os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0)))
attempt("scheduling", "self", lambda: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0)))
''', read="[os.sched_getscheduler(0), os.sched_getparam(0).sched_priority]"),
    Attribute("cpu_affinity", "sched_setaffinity on the fork server",
              change='''
one = {min(os.sched_getaffinity(0))}
for name, pid in TARGETS.items():
    attempt("cpu_affinity", name, lambda: os.sched_setaffinity(pid, one))
attempt("cpu_affinity", "self", lambda: os.sched_setaffinity(0, one))
''', read="sorted(os.sched_getaffinity(0))"),
    Attribute("rlimits", "prlimit on the fork server (a child inherits its hard limits)",
              change='''
def lower(pid):
    for kind, value in ((resource.RLIMIT_NOFILE, 32), (resource.RLIMIT_STACK, 1 << 20),
                        (resource.RLIMIT_MEMLOCK, 4096), (resource.RLIMIT_NICE, 0)):
        resource.prlimit(pid, kind, (value, value))
for name, pid in TARGETS.items():
    attempt("rlimits", name, lambda: lower(pid))
attempt("rlimits", "self", lambda: lower(0))
''', read='''{n: list(resource.getrlimit(getattr(resource, n))) for n in sorted(dir(resource))
             if n.startswith("RLIMIT_")}'''),
    Attribute("oom_score_adj", "/proc/<pid>/oom_score_adj of the fork server",
              change='''
for name, pid in TARGETS.items():
    attempt("oom_score_adj", name, lambda: write("/proc/%d/oom_score_adj" % pid, "1000"))
attempt("oom_score_adj", "self", lambda: write("/proc/self/oom_score_adj", "1000"))
''', read='text("/proc/self/oom_score_adj")'),
    Attribute("timer_slack", "/proc/<pid>/timerslack_ns of the fork server",
              change='''
for name, pid in TARGETS.items():
    attempt("timer_slack", name, lambda: write("/proc/%d/timerslack_ns" % pid, "50000000"))
attempt("timer_slack", "self", lambda: prctl(29, 50000000))  # PR_SET_TIMERSLACK
''', read="prctl(30)"),
    Attribute("coredump_filter", "/proc/<pid>/coredump_filter of the fork server",
              change='''
for name, pid in TARGETS.items():
    attempt("coredump_filter", name, lambda: write("/proc/%d/coredump_filter" % pid, "0x7f"))
attempt("coredump_filter", "self", lambda: write("/proc/self/coredump_filter", "0x7f"))
''', read='text("/proc/self/coredump_filter")'),
    Attribute("process_name", "/proc/<pid>/comm of the fork server",
              change='''
for name, pid in TARGETS.items():
    attempt("process_name", name, lambda: write("/proc/%d/comm" % pid, "carried"))
attempt("process_name", "self", lambda: prctl(15, ctypes.addressof(ctypes.create_string_buffer(b"carried"))))
''', read='text("/proc/self/comm")'),
    Attribute("autogroup", "/proc/<pid>/autogroup (the scheduler group of a session)",
              change='''
for name, pid in TARGETS.items():
    attempt("autogroup", name, lambda: write("/proc/%d/autogroup" % pid, "19"))
attempt("autogroup", "self", lambda: write("/proc/self/autogroup", "19"))
''', read='re.sub(r"^/autogroup-[0-9]+ ", "", text("/proc/self/autogroup"))'),
    Attribute("cgroup", "the files of the control group the next program runs in",
              change='''
def cgroup_files():
    # every file of the sandbox's control groups it can see (a bounded walk)
    found = []
    for top, folders, files in os.walk("/sys/fs/cgroup"):
        found += [os.path.join(top, f) for f in files]
        if len(found) > 4000:
            break
    return found
def cgroup_write():
    written = []
    for path in cgroup_files():
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError:
            continue
        os.close(fd)
        written.append(path)
    if not written:  # (opening is enough: a write could set a limit of the next program)
        raise OSError(errno.EACCES, "no file of a control group is writable")
attempt("cgroup", "group files", cgroup_write)
attempt("cgroup", "new group", lambda: os.mkdir("/sys/fs/cgroup/corrgrpo-carried"))
''', read='''[re.sub(r"[0-9a-f]{64}|sb-[0-9]+-[0-9a-f]{12}", "*", line) for line in
             text("/proc/self/cgroup").splitlines()] + [text("/sys/fs/cgroup/" + f) for f in (
             "memory.max", "pids.max", "cpu.max", "memory/memory.limit_in_bytes",
             "pids/pids.max", "cpu/cpu.cfs_quota_us") if os.path.exists("/sys/fs/cgroup/" + f)]'''),
    Attribute("keyrings", "keys in the uid's user, user-session or persistent keyrings",
              change='''
for name, ring in (("session", -3), ("user", -4), ("user session", -5), ("process", -2)):
    attempt("keyrings", name, lambda: call("add_key", b"user", b"corrgrpo-carried", b"v", 1, ring))
''', read='''sorted(name for name in (line.split()[8].rstrip(":") for line in
             text("/proc/keys").splitlines() if len(line.split()) > 8) if name != "_ses")'''),
    Attribute("hostname", "the UTS namespace's host and domain names",
              change='''
attempt("hostname", "host name", lambda: socket.sethostname("carried"))
attempt("hostname", "domain name", lambda: write("/proc/sys/kernel/domainname", "carried"))
''', read='''[re.sub(r"^[0-9a-f]{12}$", "*", os.uname().nodename),  # (docker: the container's id)
             text("/proc/sys/kernel/domainname")]'''),
    Attribute("umask", "the program's own (the next one is forked from the server)",
              change='attempt("umask", "self", lambda: os.umask(0o777))',
              read="(lambda m: (os.umask(m), m)[1])(os.umask(0o22))"),
    Attribute("cwd", "the program's own",
              change='attempt("cwd", "self", lambda: os.chdir("/"))', read="os.getcwd()"),
    Attribute("environment", "the program's own",
              change='''
attempt("environment", "self", lambda: (os.putenv("CORRGRPO_CARRIED", "1"), os.unsetenv("PATH")))
os.environ["CORRGRPO_CARRIED"] = "1"
''', read='''sorted((k, re.sub(r"^[0-9a-f]{12}$", "*", v) if k == "HOSTNAME" else v)
             for k, v in os.environ.items())'''),  # (docker: HOSTNAME is the container's id)
    Attribute("signals", "the program's own dispositions and mask",
              change='''
def signals():
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGALRM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGINT, lambda *a: None)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2, signal.SIGHUP})
attempt("signals", "self", signals)
''', read='''[line for line in text("/proc/self/status").splitlines()
             if line.startswith(("SigBlk", "SigIgn", "SigCgt", "SigPnd", "ShdPnd"))]'''),
    Attribute("timers", "the program's own interval and POSIX timers",
              change='''
def timers():
    signal.setitimer(signal.ITIMER_REAL, 3600)
    signal.setitimer(signal.ITIMER_VIRTUAL, 3600)
    signal.setitimer(signal.ITIMER_PROF, 3600)
    timer = ctypes.c_void_p()
    if libc.timer_create(1, None, ctypes.byref(timer)) != 0:  # CLOCK_MONOTONIC
        raise OSError(ctypes.get_errno(), "timer_create")
attempt("timers", "self", timers)
''', read='''[signal.getitimer(t) for t in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL,
              signal.ITIMER_PROF)] + [text("/proc/self/timers")]'''),
    Attribute("personality", "the program's own execution domain",
              change='''
def personality():
    # UNAME26 (docker's profile allows only a few personalities; this is one of them)
    if libc.personality(ctypes.c_ulong(0x0020000)) == -1 or personality_now() != 0x0020000:
        raise OSError(ctypes.get_errno(), "personality")
attempt("personality", "self", personality)
''', read="personality_now()"),
    Attribute("securebits", "the program's own (changing them needs CAP_SETPCAP)",
              change='attempt("securebits", "self", lambda: prctl(28, 0))',
              read="prctl(27)"),
    Attribute("capabilities", "the program's own bounding and ambient sets",
              change='''
attempt("capabilities", "bounding set", lambda: prctl(24, 21))  # PR_CAPBSET_DROP SYS_ADMIN
attempt("capabilities", "ambient", lambda: prctl(47, 2, 21))  # PR_CAP_AMBIENT_RAISE
''', read='''[line for line in text("/proc/self/status").splitlines()
             if line.startswith(("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"))]'''),
    Attribute("no_new_privs_and_seccomp", "the program's own (filters only stack)",
              change='''
def another_filter():
    allow = (ctypes.c_uint8 * 8).from_buffer_copy(bytes([6, 0, 0, 0, 0, 0, 0xFF, 0x7F]))
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    prog = Prog(1, ctypes.addressof(allow))
    prctl(38, 1)
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp")
attempt("no_new_privs_and_seccomp", "self", another_filter)
''', read='''[prctl(39)] + [line for line in text("/proc/self/status").splitlines()
             if line.startswith(("NoNewPrivs", "Seccomp"))]'''),
    Attribute("process_flags", "the program's own dumpable, THP, speculation, subreaper flags",
              change='''
attempt("process_flags", "dumpable", lambda: prctl(4, 1))
attempt("process_flags", "thp", lambda: prctl(41, 1, 0, 0, 0))
attempt("process_flags", "speculation", lambda: prctl(53, 0, 4))  # store bypass: disable
attempt("process_flags", "subreaper", lambda: prctl(36, 1))
attempt("process_flags", "death signal", lambda: prctl(1, 10))
''', read="[prctl(3), prctl(42), safely(lambda: prctl(52, 0)), prctl_out(37), prctl_out(2)]"),
)


def change_program(names: Iterable[str] | None = None) -> str:
    """Program A: tries every change of :data:`ATTRIBUTES` (or of those ``names``), prints
    ``{attribute: {target: outcome}}`` as JSON."""
    chosen = _chosen(names)
    body = "".join(textwrap.dedent(a.change).strip() + "\n" for a in chosen)
    return PRELUDE + _CHANGE_HEAD + body + "print(json.dumps(CHANGES))\n"


def read_program() -> str:
    """Program B: reads every attribute of :data:`ATTRIBUTES`, prints ``{attribute: value}`` as
    JSON (``error: <errno>`` where a read fails, e.g. ``ENOSYS`` for a call unknown there)."""
    reads = "".join(f"    {a.name!r}: safely(lambda: {textwrap.dedent(a.read).strip()}),\n"
                    for a in ATTRIBUTES)
    return PRELUDE + _READ_HEAD + "print(json.dumps({\n" + reads + "}, default=str))\n"


def _chosen(names: Iterable[str] | None) -> list[Attribute]:
    if names is None:
        return list(ATTRIBUTES)
    wanted = list(names)
    unknown = sorted(set(wanted) - {a.name for a in ATTRIBUTES})
    if unknown:
        raise ValueError(f"unknown attributes {unknown}; known: {[a.name for a in ATTRIBUTES]}")
    return [a for a in ATTRIBUTES if a.name in wanted]


@dataclass
class CarryReport:
    """What :func:`check` saw: the attributes before any change, what the kernel answered to
    each change, and each later read with the changes made before it."""

    before: dict
    changes: dict = field(default_factory=dict)
    #: ``(the attributes changed just before, what the next program read)``
    after: list[tuple[list[str], dict]] = field(default_factory=list)

    @property
    def carried(self) -> dict[str, list]:
        """Attributes a later program read differently: ``{name: [before, (changed before the
        read, what it read)...]}`` with only the reads that differ."""
        out: dict[str, list] = {}
        for name, value in self.before.items():
            differ = [(changed, read.get(name)) for changed, read in self.after
                      if read.get(name) != value]
            if differ:
                out[name] = [value, *differ]
        return out

    def accepted(self, target: str | None = None) -> dict[str, list[str]]:
        """Per attribute, the targets where the kernel accepted a change (only ``target``'s,
        when given)."""
        out = {}
        for name, outcomes in self.changes.items():
            hit = [t for t, o in outcomes.items() if o == "changed" and target in (None, t)]
            if hit:
                out[name] = hit
        return out


def check(sandbox: Sandbox, names: Iterable[str] | None = None, separately: bool = False,
          reads_after: int = 1) -> CarryReport:
    """Read every attribute; then let a program change the attributes (all, or those
    ``names``: in one program, or one program each when ``separately``), each followed by
    ``reads_after`` programs that read every attribute again. The programs run through
    ``sandbox`` one after the other, so through one fork server for as long as it stays clean.
    One program per attribute tells them apart: a change the server cannot undo replaces it,
    which would hide, in the same program, a change it could not see. Raises
    :class:`RuntimeError` when a program does not run to the end."""
    def run(program: str) -> dict:
        result = sandbox.run(program)
        if result.status != "ok":
            raise RuntimeError(f"a carry-over probe ended {result.status}: {result.stderr[-400:]}")
        return json.loads(result.stdout)

    chosen = [a.name for a in _chosen(names)]
    report = CarryReport(before=run(read_program()))
    for group in ([[name] for name in chosen] if separately else [chosen]):
        report.changes.update(run(change_program(group)))
        report.after += [(group, run(read_program())) for _ in range(reads_after)]
    return report
