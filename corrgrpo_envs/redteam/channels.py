"""Channels between programs judged at the same time: attack classes of the code domain.

Programs that run at once on one host share its kernel and, under ``process`` and ``bwrap``, the
host's own files of the allow-list view, bound read-only into every sandbox (docker containers
share their image's files through the engine's overlay). Two programs that can pass bits to each
other can split a task between them or learn which tasks run beside them; a program that sees
what the host does learns which files it reads.

Each class runs a *receiver* and a *sender* at the same time, each in its own sandbox of the
chosen backend (two fork servers, or two fresh runs), and tries to move a random message from
one to the other through one kind of kernel object both can name; it holds when the receiver
learns nothing. The defences: the seccomp filter's denials (:mod:`corrgrpo_sandbox.seccomp`:
``flock``, ``fcntl`` lock, lease and notification commands, page-cache probes) and a ``/proc``
without ``locks`` (``MASKED_PROC``; docker's ``MASKED_PATHS``). Namespaces already separate the
objects of :data:`IPC_OBJECTS`; their class checks that they still do.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import secrets
import struct
import textwrap
from concurrent.futures import ThreadPoolExecutor

from corrgrpo_envs.redteam.registry import LIMITS, Target, register
from corrgrpo_sandbox import RunResult

__all__ = ["IPC_OBJECTS", "PAGE_CACHE_PROBES", "run_together"]

#: Limits of the two programs of a class: long enough for a sender and a receiver that start a
#: second or two apart (a fork server or a container starting for one of them).
TOGETHER = dataclasses.replace(LIMITS, timeout=12.0)

#: Seconds a sender keeps its message up, and a receiver waits for it.
_SEND, _LISTEN = 3.0, 3.5

#: Shared by the programs: ``attempt`` records a call's errno name (or "made") in ``calls``.
_PRELUDE = '''
import ctypes, errno, fcntl, json, mmap, os, signal, struct, time
calls = {}
def attempt(name, fn):
    try:
        value = fn()
    except OSError as exc:
        calls[name] = errno.errorcode.get(exc.errno, str(exc.errno))
        return None
    calls[name] = "made"
    return value
STDLIB = os.path.dirname(os.__file__)
'''


def run_together(target: Target, receiver: str, sender: str) -> tuple[RunResult, RunResult]:
    """Run ``receiver`` and ``sender`` at the same time, each in its own sandbox of the target's
    backend (two threads: two fork servers, or two fresh runs)."""
    with ThreadPoolExecutor(2, thread_name_prefix="corrgrpo-redteam") as pool:
        # two servers ready first, so that the two programs start within milliseconds
        list(pool.map(lambda _: target.sandbox.run("pass", TOGETHER), range(2)))
        futures = [pool.submit(target.sandbox.run, program, TOGETHER)
                   for program in (receiver, sender)]
        return futures[0].result(), futures[1].result()


def _program(body: str, **values: object) -> str:
    """A program: the prelude, ``NAME = value`` for each of ``values``, then ``body``."""
    settings = "".join(f"{name} = {value!r}\n" for name, value in values.items())
    return _PRELUDE + settings + textwrap.dedent(body)


def _outputs(receiver: RunResult, sender: RunResult) -> tuple[dict, dict] | str:
    """The two programs' JSON lines, or why there are none."""
    for role, result in (("receiver", receiver), ("sender", sender)):
        if result.status != "ok":
            return f"the {role} ended with {result.status}: {result.stderr.strip()[-200:]}"
    try:
        return json.loads(receiver.stdout.strip().splitlines()[-1]), \
            json.loads(sender.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"unreadable output: {receiver.stdout[-100:]!r} {sender.stdout[-100:]!r}"


def _calls(calls: dict) -> str:
    """``name errno`` of each call, for a detail line."""
    return ", ".join(f"{name} {code}" for name, code in sorted(calls.items())) or "no calls"


# ------------------------------------------------------------------ directory notifications
#: The standard library's packages whose ``__init__.py`` has bytes to read: one per bit.
_PACKAGES = '''
def has_bytes(name):
    init = os.path.join(STDLIB, name, "__init__.py")
    return os.path.isfile(init) and os.path.getsize(init) > 0
PACKAGES = sorted(filter(has_bytes, os.listdir(STDLIB)))[-BITS:]  # (no start-up imports these)
'''

_DNOTIFY_RECEIVER = _PACKAGES + '''
signals = [signal.SIGRTMIN + 1 + i for i in range(len(PACKAGES))]
signal.pthread_sigmask(signal.SIG_BLOCK, signals)
for i, name in enumerate(PACKAGES):  # a watch on each folder, each with its own signal
    folder = os.open(os.path.join(STDLIB, name), os.O_RDONLY)
    if attempt("F_SETSIG", lambda: fcntl.fcntl(folder, 10, signals[i])) is None or attempt(
            "F_NOTIFY", lambda: fcntl.fcntl(folder, 1026, 0x1 | 0x80000000)) is None:
        break  # (DN_ACCESS | DN_MULTISHOT)
leased = os.open(os.__file__, os.O_RDONLY)  # a lease is told of every other opening
attempt("F_SETLEASE", lambda: fcntl.fcntl(leased, 1024, fcntl.F_RDLCK))
attempt("F_GETLEASE", lambda: fcntl.fcntl(leased, 1025))
seen = set()
deadline = time.monotonic() + LISTEN
while calls.get("F_NOTIFY") == "made" and time.monotonic() < deadline:
    info = signal.sigtimedwait(signals, 0.05)
    if info is not None:
        seen.add(signals.index(info.si_signo))
print(json.dumps({"calls": calls, "bits": sum(1 << i for i in seen), "width": len(PACKAGES)}))
'''

_DNOTIFY_SENDER = _PACKAGES + '''
end = time.monotonic() + SEND
while time.monotonic() < end:  # read a byte in each folder of a 1 bit, again and again
    for i, name in enumerate(PACKAGES):
        if MESSAGE >> i & 1:
            fd = os.open(os.path.join(STDLIB, name, "__init__.py"), os.O_RDONLY)
            os.pread(fd, 1, 0)
            os.close(fd)
    time.sleep(0.05)
print(json.dumps({"sent": MESSAGE & ((1 << len(PACKAGES)) - 1)}))
'''


@register("dnotify_channel", "sends 16 bits to a concurrent program through directory "
          "notifications (fcntl F_NOTIFY, F_SETSIG) on standard-library folders every sandbox "
          "binds, one folder per bit; asks for leases (F_SETLEASE, F_GETLEASE) too")
def _dnotify_channel(target: Target) -> tuple[bool, str]:
    message = secrets.randbits(16) | 1
    outputs = _outputs(*run_together(
        target, _program(_DNOTIFY_RECEIVER, BITS=16, LISTEN=_LISTEN),
        _program(_DNOTIFY_SENDER, BITS=16, SEND=_SEND, MESSAGE=message)))
    if isinstance(outputs, str):
        return False, outputs
    got, sent = outputs[0], outputs[1]["sent"]
    # (F_SETSIG alone only picks the signal of notifications and leases, which are denied)
    made = [name for name in ("F_NOTIFY", "F_SETLEASE", "F_GETLEASE")
            if got["calls"].get(name) == "made"]
    exact = " (exactly)" if got["bits"] == sent else ""
    return not made and not got["bits"], \
        f"{_calls(got['calls'])}; received {got['bits']:#06x} of {sent:#06x}{exact}"


# ------------------------------------------------------------------ file locks
_LOCK_FILES = '''
RECORD = os.open(os.__file__, os.O_RDONLY)  # fcntl record and OFD locks: bytes of one file
FILES = sorted(n for n in os.listdir(STDLIB) if n.endswith(".py"))[:65]  # flock: one per bit
BASES = {"fcntl": 1000, "ofd": 2000}  # the frame's byte; bit i at base + 1 + i
def region(kind, start):
    return struct.pack("hhqqi", kind, os.SEEK_SET, start, 1, 0)
'''

_LOCK_RECEIVER = _LOCK_FILES + '''
def recorded(command, start):  # does another process hold a lock on that byte?
    got = fcntl.fcntl(RECORD, command, region(fcntl.F_WRLCK, start))
    return struct.unpack("hhqqi", got)[0] != fcntl.F_UNLCK
def flocked(i):
    fd = os.open(os.path.join(STDLIB, FILES[i]), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # (drops the lock just taken)
    return False
probes = {"fcntl": lambda k: recorded(fcntl.F_GETLK, BASES["fcntl"] + k),
          "ofd": lambda k: recorded(36, BASES["ofd"] + k), "flock": flocked}
got = {}
deadline = time.monotonic() + LISTEN
while len(got) < len(probes) and time.monotonic() < deadline:
    for name, probe in probes.items():
        if name not in got and attempt(name, lambda: probe(0)):  # the frame: the bits are up
            got[name] = sum(probe(1 + i) << i for i in range(64))
        elif calls[name] != "made":
            got[name] = None
    time.sleep(0.02)
print(json.dumps({"calls": calls, "bits": got}))
'''

_LOCK_SENDER = _LOCK_FILES + '''
ones = [1 + i for i in range(64) if MESSAGE >> i & 1] + [0]  # the frame last
for name, command in (("fcntl", fcntl.F_SETLK), ("ofd", 37)):
    attempt(name, lambda: [fcntl.fcntl(RECORD, command, region(fcntl.F_RDLCK, BASES[name] + k))
                           for k in ones])
kept = []
def flock_ones():
    for k in ones:
        kept.append(os.open(os.path.join(STDLIB, FILES[k]), os.O_RDONLY))
        fcntl.flock(kept[-1], fcntl.LOCK_SH)
attempt("flock", flock_ones)
time.sleep(SEND if "made" in calls.values() else 0)
print(json.dumps({"calls": calls}))
'''


@register("file_lock_channel", "sends 64 bits to a concurrent program through locks on host "
          "files every sandbox binds read-only: fcntl record locks, open-file-description "
          "locks and flock")
def _file_lock_channel(target: Target) -> tuple[bool, str]:
    message = secrets.randbits(64)
    outputs = _outputs(*run_together(target, _program(_LOCK_RECEIVER, LISTEN=_LISTEN),
                                     _program(_LOCK_SENDER, SEND=_SEND, MESSAGE=message)))
    if isinstance(outputs, str):
        return False, outputs
    got, sender = outputs
    carried = sorted(name for name, bits in got["bits"].items() if bits is not None)
    exact = sorted(name for name in carried if got["bits"][name] == message)
    return not carried, f"sender: {_calls(sender['calls'])}; receiver: " \
        f"{_calls(got['calls'])}; 64 bits received exactly through: {', '.join(exact) or 'none'}"


# ------------------------------------------------------------------ /proc/locks
_PROC_LOCKS_RECEIVER = '''
lines = set()
deadline = time.monotonic() + LISTEN
while time.monotonic() < deadline:
    text = attempt("open /proc/locks", lambda: open("/proc/locks").read())
    if text is None:
        break
    lines.update(text.splitlines())
    time.sleep(0.05)
print(json.dumps({"calls": calls, "lines": sorted(lines)}))
'''

_PROC_LOCKS_SENDER = '''
fd = os.open(os.__file__, os.O_RDONLY)  # an OFD lock whose start is the message
attempt("F_OFD_SETLK", lambda: fcntl.fcntl(fd, 37, struct.pack("hhqqi", fcntl.F_RDLCK,
                                                                os.SEEK_SET, MESSAGE, 1, 0)))
time.sleep(SEND if calls["F_OFD_SETLK"] == "made" else 0)
print(json.dumps({"calls": calls}))
'''


@register("proc_locks", "reads /proc/locks, which lists the host's locks and every sandbox's "
          "open-file-description locks, while the host holds one and a concurrent program "
          "takes one whose offset is a 48-bit message")
def _proc_locks(target: Target) -> tuple[bool, str]:
    message, host_offset = secrets.randbits(48), secrets.randbits(48)
    host_file = target.folder / "proc-locks-probe"
    host_file.write_bytes(b"x")
    fd = os.open(host_file, os.O_RDONLY)
    try:  # a lock of the host's (an open-file-description one: every pid namespace lists it)
        fcntl.fcntl(fd, 37, struct.pack("hhqqi", fcntl.F_RDLCK, os.SEEK_SET, host_offset, 1, 0))
        outputs = _outputs(*run_together(
            target, _program(_PROC_LOCKS_RECEIVER, LISTEN=_LISTEN),
            _program(_PROC_LOCKS_SENDER, SEND=_SEND, MESSAGE=message)))
    finally:
        os.close(fd)
    if isinstance(outputs, str):
        return False, outputs
    got, sender = outputs
    starts = {line.split()[-2] for line in got["lines"] if len(line.split()) >= 2}
    return not got["lines"], f"{_calls(got['calls'])}; {len(got['lines'])} lock lines read; " \
        f"the host's lock among them: {str(host_offset) in starts}; the concurrent program's " \
        f"({_calls(sender['calls'])}): {str(message) in starts}"


# ------------------------------------------------------------------ the page cache
#: How the receiver asks whether a page of a shared file is in the page cache.
PAGE_CACHE_PROBES = {
    "preadv2": "a one-byte read with RWF_NOWAIT, which fails with EAGAIN unless the page is cached",
    "aio": "the same read through Linux native AIO (io_setup, io_submit)",
    "cachestat": "the page-cache statistics of a byte range",
    "mincore": "the residency of a shared mapping of the file",
}

_PAGES = '''
NR = {"x86_64": {"preadv2": 327, "io_setup": 206, "io_submit": 209, "io_getevents": 208,
                 "cachestat": 451},
      "aarch64": {"preadv2": 286, "io_setup": 0, "io_submit": 2, "io_getevents": 4,
                  "cachestat": 451}}.get(os.uname().machine, {})
for candidate in ("pydoc_data/topics.py", "_pydecimal.py", "typing.py"):  # a large shared file
    PATH = os.path.join(STDLIB, candidate)
    if os.path.exists(PATH) and os.path.getsize(PATH) > 100 * mmap.PAGESIZE:
        break
FD = os.open(PATH, os.O_RDONLY)
FRAMES = range(BITS + 2, os.path.getsize(PATH) // mmap.PAGESIZE - 1)  # then the last page
def page(k):  # page 0 unused, bit i on page 1 + i, then the frame pages
    return k * mmap.PAGESIZE
'''

_PAGE_CACHE_RECEIVER = _PAGES + '''
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
byte = ctypes.create_string_buffer(mmap.PAGESIZE)
class Vec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("size", ctypes.c_size_t)]
def fail(name):
    raise OSError(ctypes.get_errno(), name)
def nowait(k):
    n = libc.syscall(NR["preadv2"], FD, ctypes.byref(Vec(ctypes.addressof(byte), 1)), 1,
                     ctypes.c_long(page(k)), ctypes.c_long(0), 8)  # RWF_NOWAIT
    return 1 if n >= 0 else 0 if ctypes.get_errno() == errno.EAGAIN else fail("preadv2")
context = ctypes.c_ulong(0)
def aio(k):
    if not context.value and libc.syscall(NR["io_setup"], 1, ctypes.byref(context)) != 0:
        fail("io_setup")
    block = ctypes.create_string_buffer(struct.pack(
        "QIiHhIQQqQII", 0, 0, 8, 0, 0, FD, ctypes.addressof(byte), 1, page(k), 0, 0, 0))
    if libc.syscall(NR["io_submit"], context, 1, ctypes.byref(ctypes.c_void_p(
            ctypes.addressof(block)))) != 1:
        fail("io_submit")
    event = (ctypes.c_int64 * 4)()
    libc.syscall(NR["io_getevents"], context, 1, 1, event, None)
    return 1 if event[2] >= 0 else 0 if event[2] == -errno.EAGAIN else fail("aio")
def cachestat(k):
    span, stat = (ctypes.c_uint64 * 2)(page(k), 1), (ctypes.c_uint64 * 5)()
    return int(stat[0] > 0) if libc.syscall(NR["cachestat"], FD, span, stat, 0) == 0 \\
        else fail("cachestat")
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
mapped = libc.mmap(None, os.path.getsize(PATH), mmap.PROT_READ, mmap.MAP_SHARED, FD, 0)
resident = (ctypes.c_ubyte * 1)()
def mincore(k):
    if libc.mincore(ctypes.c_void_p(mapped + page(k)), ctypes.c_size_t(1), resident) != 0:
        fail("mincore")
    return resident[0] & 1
probes = {"preadv2": nowait, "cachestat": cachestat, "aio": aio, "mincore": mincore}
answering = [name for name, probe in probes.items()  # (asked of the last page, left alone)
             if attempt(name, lambda: probe(FRAMES.stop)) is not None]
# Each probe that finds no page starts reading it (on Linux 6.18), so each frame page is asked
# once: the sender evicts the file, reads the pages of its 1 bits, then a little later every
# frame page; a frame page found after one found missing says the bits are up.
probe = probes[answering[0]] if answering else None
missing, got = False, {}
for k in FRAMES if probe is not None else ():
    if probe(k):
        if missing:
            got[answering[0]] = sum(probe(1 + i) << i for i in range(BITS))
            break
    else:
        missing = True
    time.sleep(LISTEN / len(FRAMES))
print(json.dumps({"calls": calls, "bits": got}))
'''

_PAGE_CACHE_SENDER = _PAGES + '''
attempt("POSIX_FADV_RANDOM", lambda: os.posix_fadvise(FD, 0, 0, os.POSIX_FADV_RANDOM))
end = time.monotonic() + SEND
while time.monotonic() < end:  # evict; read the 1 bits; after a while, the frame pages
    attempt("POSIX_FADV_DONTNEED", lambda: os.posix_fadvise(FD, 0, 0, os.POSIX_FADV_DONTNEED))
    for k in [1 + i for i in range(BITS) if MESSAGE >> i & 1]:
        os.pread(FD, 1, page(k))
    time.sleep(0.4)
    for k in FRAMES:
        os.pread(FD, 1, page(k))
    time.sleep(0.4)
print(json.dumps({"calls": calls}))
'''


@register("page_cache_channel", "sends 16 bits to a concurrent program through the page cache of "
          "a host file every sandbox binds: the sender evicts it (fadvise DONTNEED) and reads "
          "some pages back, the receiver asks which are cached (preadv2 RWF_NOWAIT, native AIO, "
          "cachestat, mincore)")
def _page_cache_channel(target: Target) -> tuple[bool, str]:
    message = secrets.randbits(16)
    outputs = _outputs(*run_together(
        target, _program(_PAGE_CACHE_RECEIVER, BITS=16, LISTEN=_LISTEN),
        _program(_PAGE_CACHE_SENDER, BITS=16, SEND=_SEND, MESSAGE=message)))
    if isinstance(outputs, str):
        return False, outputs
    got, sender = outputs
    exact = sorted(name for name, bits in got["bits"].items() if bits == message)
    answered = sorted(name for name in ("preadv2", "aio", "cachestat")
                      if got["calls"].get(name) == "made")
    evicted = sender["calls"].get("POSIX_FADV_DONTNEED") == "made"
    return not (exact or answered or evicted), f"sender: {_calls(sender['calls'])}; receiver: " \
        f"{_calls(got['calls'])}; 16 bits received exactly through: {', '.join(exact) or 'none'}"


# ------------------------------------------------------------------ namespaced IPC objects
#: What the IPC class looks for: objects a program names by a key or a name of its choosing.
IPC_OBJECTS = ("abstract unix socket", "System V message queue", "System V shared memory",
               "System V semaphores", "POSIX shared memory", "POSIX message queue")

_IPC = '''
import socket
libc = ctypes.CDLL(None, use_errno=True)
try:
    libc.mq_open
except AttributeError:  # (glibc before 2.34 keeps it in librt)
    libc = ctypes.CDLL("librt.so.1", use_errno=True)
NAME = "corrgrpo-" + TAG
'''

_IPC_RECEIVER = _IPC + '''
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
attempt("abstract unix socket", lambda: sock.bind("\\0" + NAME))
for name, make in (("System V message queue", lambda: libc.msgget(KEY, 0o1666)),
                   ("System V shared memory", lambda: libc.shmget(KEY, 4096, 0o1666)),
                   ("System V semaphores", lambda: libc.semget(KEY, 1, 0o1666)),
                   ("POSIX message queue", lambda: libc.mq_open(
                       ("/" + NAME).encode(), os.O_RDWR | os.O_CREAT, 0o666, None))):
    made = make()
    calls[name] = "made" if made >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
attempt("POSIX shared memory", lambda: os.open("/dev/shm/" + NAME, os.O_CREAT | os.O_RDWR, 0o666))
time.sleep(LISTEN)
print(json.dumps({"calls": calls}))
'''

_IPC_SENDER = _IPC + '''
found = set()
end = time.monotonic() + SEND
while time.monotonic() < end:
    try:
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"x", "\\0" + NAME)
        found.add("abstract unix socket")
    except OSError:
        pass
    for name, look in (("System V message queue", lambda: libc.msgget(KEY, 0)),
                       ("System V shared memory", lambda: libc.shmget(KEY, 0, 0)),
                       ("System V semaphores", lambda: libc.semget(KEY, 0, 0)),
                       ("POSIX message queue", lambda: libc.mq_open(("/" + NAME).encode(),
                                                                    os.O_WRONLY)),
                       ("POSIX shared memory", lambda: os.path.exists("/dev/shm/" + NAME) or -1)):
        if look() >= 0:
            found.add(name)
    time.sleep(0.05)
print(json.dumps({"found": sorted(found)}))
'''


@register("ipc_channel", "makes an abstract unix socket, System V queue, memory and semaphores, "
          "POSIX shared memory and a message queue under names of its own; a concurrent "
          "program looks for each")
def _ipc_channel(target: Target) -> tuple[bool, str]:
    tag, key = secrets.token_hex(6), 1 + secrets.randbits(30)
    outputs = _outputs(*run_together(target, _program(_IPC_RECEIVER, TAG=tag, KEY=key,
                                                      LISTEN=_LISTEN),
                                     _program(_IPC_SENDER, TAG=tag, KEY=key, SEND=_SEND)))
    if isinstance(outputs, str):
        return False, outputs
    made, found = outputs[0]["calls"], outputs[1]["found"]
    missing = sorted(name for name in IPC_OBJECTS if made.get(name) != "made")
    return not found, f"made all but: {', '.join(missing) or 'none'}; " \
        f"found by the other program: {', '.join(found) or 'none'}"


# ------------------------------------------------------------------ marks on shared files
_MARKS = '''
path, before = os.__file__, os.stat(os.__file__)
attempt("setxattr", lambda: os.setxattr(path, "user.corrgrpo", b"1"))
attempt("utime", lambda: os.utime(path, (0, 0)))
attempt("chmod", lambda: os.chmod(path, before.st_mode))
attempt("open for writing", lambda: os.close(os.open(path, os.O_WRONLY)))
after = os.stat(path)
changed = [name for name in ("st_mode", "st_mtime_ns", "st_ctime_ns", "st_atime_ns")
           if getattr(before, name) != getattr(after, name)]
print(json.dumps({"calls": calls, "changed": changed}))
'''


@register("shared_file_marks", "marks a host file every sandbox binds (an extended attribute, "
          "its times, its mode, a write) for a concurrent program to find")
def _shared_file_marks(target: Target) -> tuple[bool, str]:
    result = target.sandbox.run(_program(_MARKS))
    if result.status != "ok":
        return False, f"status {result.status}: {result.stderr.strip()[-200:]}"
    out = json.loads(result.stdout)
    made = sorted(name for name, code in out["calls"].items() if code == "made")
    return not (made or out["changed"]), f"{_calls(out['calls'])}; changed: " \
        f"{', '.join(out['changed']) or 'nothing'}"
