"""The seccomp filter every program runs under: each denied system call fails with EPERM (clone3
with ENOSYS) from a sandboxed program, on every backend and reuse mode; ordinary programs
(threads, processes, pipes) still run. Without the filter, a program's inotify watch on a folder
every sandbox binds from the host sees which files a concurrent program opens."""

from __future__ import annotations

import pytest

from corrgrpo_sandbox import Limits, SandboxPool, SandboxUnavailable, make_sandbox
from corrgrpo_sandbox.seccomp import DENIED, seccomp_unavailable_reason
from tests.sandbox.backends import backend_params, open_sandbox

try:
    import pyseccomp
except (ImportError, OSError, RuntimeError) as exc:  # (RuntimeError: libseccomp is missing)
    pytest.skip(f"the tests name system calls by number, with pyseccomp and libseccomp: {exc}", allow_module_level=True)
pytestmark = pytest.mark.skipif(bool(seccomp_unavailable_reason()),
                                reason=f"no seccomp filter here: {seccomp_unavailable_reason()}")

LIMITS = Limits(timeout=5.0, memory_mb=256)
_ARCH = pyseccomp.system_arch()
NUMBERS = {name: int(pyseccomp.resolve_syscall(_ARCH, name)) for name in DENIED}
NUMBERS_OF_ARGUMENT_CALLS = {"fcntl": int(pyseccomp.resolve_syscall(_ARCH, "fcntl"))}
CLONE_NEWUSER, SIGCHLD = 0x10000000, 17

# Each denied call with arguments that would do something without the filter (or fail with
# another errno than EPERM): a new user namespace, a key, an io_uring, a mount...
CALLS = {
    "unshare": "(CLONE_NEWUSER,)",
    "clone": "(CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)",
    "clone3": "(ctypes.byref(clone_args), ctypes.sizeof(clone_args))",
    "keyctl": "(0, -3, 1)",  # KEYCTL_GET_KEYRING_ID of the session keyring, create
    "add_key": '(b"user", b"k", b"v", 1, -3)',
    "request_key": '(b"user", b"k", None, -3)',
    "io_uring_setup": "(8, ctypes.byref(ring_params))",
    "io_uring_enter": "(3, 0, 0, 0, None, 0)",
    "io_uring_register": "(3, 0, None, 0)",
    "userfaultfd": "(0,)",
    "perf_event_open": "(ctypes.byref(perf_attr), 0, -1, -1, 0)",
    "bpf": "(0, ctypes.byref(bpf_attr), 72)",  # BPF_MAP_CREATE
    "mount": '(b"none", b"/tmp", b"tmpfs", 0, None)',
    "umount2": '(b"/tmp", 2)',
    "fsopen": '(b"tmpfs", 0)',
    "fsconfig": "(3, 6, None, None, 0)",  # FSCONFIG_CMD_CREATE
    "fsmount": "(3, 0, 0)",
    "fspick": '(-100, b"/tmp", 0)',
    "move_mount": '(-100, b"/tmp", -100, b"/var/tmp", 0)',
    "open_tree": '(-100, b"/tmp", 1)',  # OPEN_TREE_CLONE
    "mount_setattr": '(-100, b"/tmp", 0, ctypes.byref(mount_attr), 32)',
    "pivot_root": '(b"/tmp", b"/tmp")',
    "inotify_init": "()",
    "inotify_init1": "(0,)",
    "inotify_add_watch": '(0, b"/tmp", 0x20)',  # IN_OPEN (fd 0: not an inotify one)
    "fanotify_init": "(0x200, 0)",  # FAN_REPORT_FID: allowed without privileges since 5.13
    "fanotify_mark": '(0, 1, 0x20, -100, b"/tmp")',  # FAN_MARK_ADD, FAN_OPEN
    "flock": "(0, 2 | 4)",  # LOCK_EX | LOCK_NB on the program's stdin
    "io_setup": "(1, ctypes.byref(aio_context))",
    "io_submit": "(0, 0, None)",
    "cachestat": "(0, ctypes.byref(cache_range), ctypes.byref(cache_stat), 0)",
}
# (a call this machine does not have, like inotify_init on aarch64, cannot be made at all)
CALLS = {name: args for name, args in CALLS.items() if NUMBERS[name] >= 0}
EXPECTED = {name: ("ENOSYS" if name == "clone3" else "EPERM") for name in CALLS}

PROBE = f'''
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
CLONE_NEWUSER, SIGCHLD = {CLONE_NEWUSER}, {SIGCHLD}
clone_args = (ctypes.c_uint64 * 11)(CLONE_NEWUSER, 0, 0, 0, SIGCHLD)
ring_params = (ctypes.c_char * 120)()
perf_attr = (ctypes.c_char * 128)()
ctypes.memmove(perf_attr, (ctypes.c_uint32 * 2)(1, 128), 8)  # PERF_TYPE_SOFTWARE, size
bpf_attr = (ctypes.c_uint32 * 18)(2, 4, 4, 1)  # an array map
mount_attr = (ctypes.c_uint64 * 4)(1, 0, 0, 0)  # MOUNT_ATTR_RDONLY
aio_context = ctypes.c_ulong(0)
cache_range, cache_stat = (ctypes.c_uint64 * 2)(0, 4096), (ctypes.c_uint64 * 5)()
def arg(a):
    if a is None or isinstance(a, (bytes, ctypes._SimpleCData)) or hasattr(a, "_obj"):
        return a
    return ctypes.c_long(a)
out = {{}}
for name, nr, args in CALLS:
    ctypes.set_errno(0)
    value = libc.syscall(ctypes.c_long(nr), *[arg(a) for a in args])
    if value >= 0 and name in ("clone", "clone3") and value == 0:
        os._exit(0)  # the child of a clone that went through
    out[name] = errno.errorcode.get(ctypes.get_errno(), "OK") if value < 0 else "OK"
print(out)
'''


def _probe_program() -> str:
    calls = ", ".join(f"({name!r}, {NUMBERS[name]}, {args})" for name, args in CALLS.items())
    return PROBE.replace("for name, nr, args in CALLS:", f"for name, nr, args in [{calls}]:")


@pytest.fixture(params=backend_params())
def sandbox(request):
    yield from open_sandbox(request.param, LIMITS)


def test_every_denied_call_fails_with_eperm(sandbox):
    result = sandbox.run(_probe_program())
    assert result.status == "ok", result.stderr
    assert eval(result.stdout) == EXPECTED, result.stdout


def test_without_the_filter_the_calls_reach_the_kernel():
    """The probe is real: with the filter off, a new user namespace and a key are possible."""
    with make_sandbox("process", LIMITS, reuse="fork") as box:
        box.seccomp = False
        result = box.run(_probe_program())
    assert result.status == "ok", result.stderr
    out = eval(result.stdout)
    assert out["unshare"] == "OK" and out["keyctl"] == "OK" and out["inotify_init1"] == "OK", out


def test_ordinary_programs_still_run(sandbox):
    program = '''
import os, subprocess, sys, threading, multiprocessing
from concurrent.futures import ThreadPoolExecutor
with ThreadPoolExecutor(4) as pool:
    assert sum(pool.map(lambda x: x * x, range(10))) == 285
t = threading.Thread(target=lambda: None); t.start(); t.join()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, b"hi"); os._exit(0)
os.waitpid(pid, 0)
assert os.read(r, 2) == b"hi"
out = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True)
assert out.stdout.strip() == "42", out
print("fine")
'''
    result = sandbox.run(program)
    assert result.status == "ok" and result.stdout.strip() == "fine", result.stderr


@pytest.mark.skipif(__import__("os").uname().machine != "x86_64", reason="i386 system calls: x86_64 only")
def test_a_system_call_of_another_abi_kills_the_program(sandbox):
    """``int 0x80`` (the i386 ABI, where the numbers differ) would slip past a filter on x86_64's
    numbers: libseccomp's architecture check kills the process instead."""
    program = '''
import ctypes, mmap
code = b"\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3"  # mov eax, 20 (getpid); int 0x80; ret
page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
address = ctypes.addressof(ctypes.c_char.from_buffer(page))
print("pid", ctypes.CFUNCTYPE(ctypes.c_int)(address)())
'''
    result = sandbox.run(program)
    # (a fresh bwrap or docker run reports the signal as an exit code of its wrapper)
    assert result.status in ("killed:SIGSYS", "killed"), (result.status, result.stderr)
    assert "pid" not in result.stdout


#: Watches the folder of the standard library's ``json`` package (bound read-only from the host
#: into every sandbox) and prints the names of the files opened there, until ``tool.py`` is.
WATCHER = '''
import ctypes, errno, json, os, select, struct, time
libc = ctypes.CDLL(None, use_errno=True)
def watch():
    fd = libc.inotify_init1(0o4000)  # IN_NONBLOCK
    if fd < 0:
        return "inotify_init1 " + errno.errorcode[ctypes.get_errno()]
    if libc.inotify_add_watch(fd, os.path.dirname(json.__file__).encode(), 0x20) < 0:  # IN_OPEN
        return "inotify_add_watch " + errno.errorcode[ctypes.get_errno()]
    seen = set()
    deadline = time.monotonic() + 8
    while "tool.py" not in seen and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.1)[0]:
            data = os.read(fd, 65536)
            while data:  # struct inotify_event: wd, mask, cookie, len, name[len]
                size = struct.unpack_from("iIII", data)[3]
                seen.add(data[16:16 + size].rstrip(b"\\0").decode())
                data = data[16 + size:]
    return "seen %s" % sorted(seen)
print(watch())
'''

#: Opens ``json/tool.py`` every 50 ms for 3 s (say, a module a reference solution imports).
OPENER = '''
import json, os, time
path = os.path.join(os.path.dirname(json.__file__), "tool.py")
end = time.monotonic() + 3
while time.monotonic() < end:
    open(path).close()
    time.sleep(0.05)
'''


@pytest.mark.parametrize("backend", ["process", "bwrap"])
@pytest.mark.parametrize("filtered", [True, False], ids=["filter", "no-filter"])
def test_a_program_cannot_watch_the_files_a_concurrent_program_opens(backend, filtered):
    """The files of the allow-list view are the host's own, shared by every sandbox: without the
    filter a watch sees what a concurrent program opens; with it, no watch can be made."""
    try:
        box = make_sandbox(backend, Limits(timeout=10.0, memory_mb=256), reuse="fork")
    except SandboxUnavailable as exc:
        pytest.skip(f"{backend}: {exc}")
    with box, SandboxPool(box, workers=2) as pool:
        box.seccomp = filtered
        watcher, opener = pool.run_many([WATCHER, OPENER])
    assert watcher.status == opener.status == "ok", (watcher.stderr, opener.stderr)
    if filtered:
        assert watcher.stdout == "inotify_init1 EPERM\n"
    else:  # the channel the filter closes
        assert "'tool.py'" in watcher.stdout, watcher.stdout


#: fcntl commands, fadvise advice and preadv2 flags, each made by a program on a file of the
#: host every sandbox binds (os.py) and on a file of its own; a command's upper 32 bits are
#: ignored by the kernel, so they must not slip a command past the filter.
ARGUMENT_PROBE = '''
import ctypes, errno, fcntl, os, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
shared = os.open(os.__file__, os.O_RDONLY)
folder = os.open(os.path.dirname(os.__file__), os.O_RDONLY)
own = os.open("/tmp/own", os.O_CREAT | os.O_RDWR)
os.write(own, b"x" * 8192)
lock = struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 1, 0)
out = {}
def call(name, fn):
    try:
        fn()
        out[name] = "OK"
    except OSError as exc:
        out[name] = errno.errorcode[exc.errno]
for fd, where in ((shared, "shared"), (own, "own")):
    call("F_SETLK " + where, lambda: fcntl.fcntl(fd, fcntl.F_SETLK, lock))
    call("F_GETLK " + where, lambda: fcntl.fcntl(fd, fcntl.F_GETLK, lock))
    call("F_OFD_SETLK " + where, lambda: fcntl.fcntl(fd, 37, lock))
    call("lockf " + where, lambda: fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB))
    call("flock " + where, lambda: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB))
    call("F_GETLEASE " + where, lambda: fcntl.fcntl(fd, 1025))
    call("DONTNEED " + where, lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED))
    call("WILLNEED " + where, lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED))
    call("RANDOM " + where, lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM))
    call("RWF_NOWAIT " + where, lambda: os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT))
    call("RWF_HIPRI " + where, lambda: os.preadv(fd, [bytearray(1)], 0, os.RWF_HIPRI))
call("F_NOTIFY", lambda: fcntl.fcntl(folder, fcntl.F_NOTIFY, fcntl.DN_ACCESS))
call("F_SETSIG", lambda: fcntl.fcntl(folder, 10, 0))
call("F_GETFL", lambda: fcntl.fcntl(own, fcntl.F_GETFL))
call("F_SETFD", lambda: fcntl.fcntl(own, fcntl.F_SETFD, fcntl.FD_CLOEXEC))
call("F_DUPFD_CLOEXEC", lambda: os.close(fcntl.fcntl(own, fcntl.F_DUPFD_CLOEXEC, 10)))
ctypes.set_errno(0)
high = libc.syscall(ctypes.c_long(FCNTL), ctypes.c_long(own), ctypes.c_long((1 << 32) | 6),
                    lock)  # F_SETLK with bits the kernel drops
out["F_SETLK upper bits"] = "OK" if high >= 0 else errno.errorcode[ctypes.get_errno()]
print(out)
'''

DENIED_HERE = {"F_SETLK", "F_GETLK", "F_OFD_SETLK", "lockf", "flock", "F_GETLEASE", "DONTNEED",
               "RWF_NOWAIT"}


def test_lock_notification_and_page_cache_arguments_are_denied(sandbox):
    """File locks, leases, directory notifications, evictions and page-cache probes get EPERM,
    on the host's files and the program's own alike (a filter cannot tell them apart); every
    other command, advice and flag still works."""
    result = sandbox.run(ARGUMENT_PROBE.replace("FCNTL", str(NUMBERS_OF_ARGUMENT_CALLS["fcntl"])))
    assert result.status == "ok", result.stderr
    out = eval(result.stdout)
    for name, code in out.items():
        denied = name in ("F_NOTIFY", "F_SETLK upper bits") or name.split()[0] in DENIED_HERE
        # (RWF_HIPRI: EOPNOTSUPP on a file system without polled I/O, never EPERM)
        assert (code == "EPERM") == denied, (name, code, out)
    assert out["RWF_HIPRI own"] in ("OK", "EOPNOTSUPP") and out["F_SETSIG"] == "OK"

#: What ordinary programs do that could touch the calls denied for some arguments.
LEGIT = '''
import concurrent.futures, json, multiprocessing, shelve, sqlite3, subprocess, sys, tempfile
db = sqlite3.connect(":memory:")
db.execute("create table t (x)")
db.execute("insert into t values (42)")
assert db.execute("select x from t").fetchall() == [(42,)]
unlocked = sqlite3.connect("file:/tmp/unlocked.db?vfs=unix-none", uri=True)
unlocked.execute("create table t (x)")
unlocked.commit()
with tempfile.NamedTemporaryFile() as f:
    f.write(b"x")
    f.flush()
with multiprocessing.Pool(2) as pool:
    assert pool.map(abs, [-1, -2]) == [1, 2]
with shelve.open("/tmp/shelf") as shelf:
    shelf["k"] = [1]
try:
    sqlite3.connect("/tmp/locked.db").execute("create table t (x)")
    print("file-backed sqlite ok")
except sqlite3.OperationalError as exc:
    print("file-backed sqlite:", exc)
'''


def test_ordinary_programs_need_no_lock_or_eviction(sandbox):
    """In-memory SQLite, SQLite without locks (vfs=unix-none), temporary files, process pools
    and shelve work under the filter; SQLite on a file with its default locking VFS does not
    (its locks are fcntl record locks: denied)."""
    result = sandbox.run(LEGIT, Limits(timeout=20.0, memory_mb=512))
    assert result.status == "ok", result.stderr
    assert result.stdout == "file-backed sqlite: access permission denied\n", result.stdout
