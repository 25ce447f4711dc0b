"""The seccomp filter every program runs under: each denied system call fails with EPERM (clone3
with ENOSYS) from a sandboxed program, on every backend and reuse mode; ordinary programs
(threads, processes, pipes) still run."""

from __future__ import annotations

import pytest

from corrgrpo_envs.sandbox import Limits, make_sandbox
from corrgrpo_envs.sandbox.seccomp import DENIED, seccomp_unavailable_reason
from tests.sandbox_backends import backend_params, open_sandbox

try:
    import pyseccomp
except (ImportError, OSError, RuntimeError) as exc:  # (RuntimeError: libseccomp is missing)
    pytest.skip(f"the tests name system calls by number, with pyseccomp and libseccomp: {exc}", allow_module_level=True)
pytestmark = pytest.mark.skipif(bool(seccomp_unavailable_reason()),
                                reason=f"no seccomp filter here: {seccomp_unavailable_reason()}")

LIMITS = Limits(timeout=5.0, memory_mb=256)
_ARCH = pyseccomp.system_arch()
NUMBERS = {name: int(pyseccomp.resolve_syscall(_ARCH, name)) for name in DENIED}
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
}
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
    assert out["unshare"] == "OK" and out["keyctl"] == "OK", out


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
