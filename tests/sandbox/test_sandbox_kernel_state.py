"""Kernel state no program shares with the next one or with the host: keys (each program runs
in a fresh anonymous session keyring; keys a program links into its uid's keyrings make a fork
server quit) and abstract unix sockets (each fork child has its own network namespace)."""

from __future__ import annotations

import ctypes
import socket
import uuid

import pytest

from corrgrpo_sandbox import Limits, make_sandbox

try:
    import pyseccomp
except (ImportError, OSError, RuntimeError) as exc:  # (RuntimeError: libseccomp is missing)
    pytest.skip(f"the key tests name system calls by number, with pyseccomp and libseccomp: {exc}", allow_module_level=True)
from tests.sandbox.backends import backend_params, open_sandbox

LIMITS = Limits(timeout=5.0, memory_mb=256)
_ARCH = pyseccomp.system_arch()
KEYCTL = int(pyseccomp.resolve_syscall(_ARCH, "keyctl"))
ADD_KEY = int(pyseccomp.resolve_syscall(_ARCH, "add_key"))
# keyctl operations and the special keyring ids (linux/keyctl.h)
GET_KEYRING_ID, JOIN_SESSION, SEARCH, GET_PERSISTENT = 0, 1, 10, 22
THREAD, PROCESS, SESSION, USER, USER_SESSION = -1, -2, -3, -4, -5


@pytest.fixture(params=backend_params())
def sandbox(request):
    yield from open_sandbox(request.param, LIMITS, need_fork=True)


_KEYS = f'''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    value = libc.syscall(ctypes.c_long(nr), *args)
    return value if value >= 0 else -ctypes.get_errno()
def keyctl(*args):
    return call({KEYCTL}, *[a if isinstance(a, bytes) else ctypes.c_long(a) for a in args])
def add_key(description, keyring):
    return call({ADD_KEY}, b"user", description, b"secret-payload", ctypes.c_size_t(14),
                ctypes.c_long(keyring))
def search(description):
    found = []
    for ring in ({THREAD}, {PROCESS}, {SESSION}, {USER}, {USER_SESSION}):
        value = keyctl({SEARCH}, ring, b"user", description, 0)
        if value > 0:
            found.append(ring)
    persistent = keyctl({GET_PERSISTENT}, -1, 0)
    if persistent > 0 and keyctl({SEARCH}, persistent, b"user", description, 0) > 0:
        found.append("persistent")
    try:
        listed = description.decode() in open("/proc/keys").read()
    except OSError:
        listed = False
    return found, listed
'''


def _leave_keys(name: str) -> str:
    """Adds a key called ``name`` to every keyring a program can name, then prints what it did."""
    return _KEYS + f'''
added = {{}}
for ring in ({SESSION}, {USER}, {USER_SESSION}, {PROCESS}):
    added[ring] = add_key({name.encode()!r}, ring)
persistent = keyctl({GET_PERSISTENT}, -1, 0)
if persistent > 0:
    added["persistent"] = add_key({name.encode()!r}, persistent)
print("added", added, "found", search({name.encode()!r}))
'''


def _find_keys(name: str) -> str:
    return _KEYS + f'print("found", search({name.encode()!r}))\n'


def _host_search(description: bytes) -> list[int]:
    """Keyrings of this (host) process that hold a key called ``description``."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    found = []
    for ring in (THREAD, PROCESS, SESSION, USER, USER_SESSION):
        if libc.syscall(ctypes.c_long(KEYCTL), ctypes.c_long(SEARCH), ctypes.c_long(ring),
                        b"user", description, ctypes.c_long(0)) > 0:
            found.append(ring)
    return found


@pytest.fixture
def host_key():
    """A key in a fresh session keyring of this process (what a sandbox inherits)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    assert libc.syscall(ctypes.c_long(KEYCTL), ctypes.c_long(JOIN_SESSION), None) > 0
    name = f"corrgrpo-host-{uuid.uuid4().hex[:12]}".encode()
    serial = libc.syscall(ctypes.c_long(ADD_KEY), b"user", name, b"host-secret", ctypes.c_size_t(11),
                          ctypes.c_long(SESSION))
    assert serial > 0, ctypes.get_errno()
    return name


# With the seccomp filter (the default) no key system call gets through; without it the other
# layers must hold on their own: the fresh session keyring and the fork server's key count.
FILTERED = pytest.mark.parametrize("filtered", [True, False], ids=["filter", "no-filter"])


@FILTERED
def test_the_hosts_session_keyring_is_out_of_reach(sandbox, host_key, filtered):
    sandbox.seccomp = filtered
    result = sandbox.run(_find_keys(host_key.decode()))
    assert result.status == "ok", result.stderr
    assert "found ([], False)" in result.stdout, result.stdout
    assert _host_search(host_key) == [SESSION]  # and the host's key is still there


@FILTERED
def test_a_key_left_by_one_program_is_invisible_to_the_next_and_to_the_host(sandbox, filtered):
    sandbox.seccomp = filtered
    name = f"corrgrpo-left-{uuid.uuid4().hex[:12]}"
    first = sandbox.run(_leave_keys(name))
    assert first.status == "ok", first.stderr
    if not filtered and sandbox.name != "docker":  # the keys were really added
        assert "found ([-2, -3, -4, -5]" in first.stdout, first.stdout
    for _ in range(3):  # the next program, and the one after (a replaced server's first)
        second = sandbox.run(_find_keys(name))
        assert second.status == "ok", second.stderr
        assert "found ([], False)" in second.stdout, (first.stdout, second.stdout)
    assert _host_search(name.encode()) == []


def _abstract_socket(name: str) -> str:
    """Binds an abstract unix socket and sends it its own descriptor: a cycle the kernel keeps
    alive after the program has ended."""
    return f'''
import array, socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("\\0{name}")
s.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [s.fileno()]))], 0,
          "\\0{name}")
print("bound", "{name}" in open("/proc/net/unix").read())
'''


def _reach_socket(name: str) -> str:
    return f'''
import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
try:
    s.sendto(b"y", "\\0{name}")
    reached = True
except OSError:
    reached = False
print("reached", reached, "listed", "{name}" in open("/proc/net/unix").read())
'''


def test_an_abstract_socket_left_by_one_program_is_invisible_to_the_next_and_to_the_host(sandbox):
    name = f"corrgrpo-sock-{uuid.uuid4().hex[:12]}"
    first = sandbox.run(_abstract_socket(name))
    assert first.status == "ok" and "bound True" in first.stdout, first.stderr
    second = sandbox.run(_reach_socket(name))
    assert second.status == "ok", second.stderr
    assert "reached False listed False" in second.stdout, second.stdout
    host = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    with pytest.raises(OSError):
        host.sendto(b"z", "\0" + name)
    host.close()


def test_programs_that_leave_nothing_keep_their_server():
    """The checks that cover keys and sockets do not replace a server after ordinary programs."""
    with make_sandbox("process", LIMITS, reuse="fork") as box:
        if not box.forking:
            pytest.skip("process: fork servers need namespaces, unavailable here")
        assert box.run("pass").status == "ok"
        servers = [s.proc.pid for s in box._forks.servers()]
        for _ in range(5):
            assert box.run("import socket\na, b = socket.socketpair()\n").status == "ok"
        assert [s.proc.pid for s in box._forks.servers()] == servers
