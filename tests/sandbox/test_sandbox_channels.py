"""No channel between programs that run at the same time: the attacks of
``corrgrpo_envs/redteam/channels.py`` are real (without the seccomp filter a receiver gets the
sender's message through directory notifications, file locks and the page cache, on the
``process`` and ``bwrap`` backends, and an OFD lock a sandbox takes shows in every
``/proc/locks``), and ``/proc/locks`` cannot be read inside any sandbox."""

from __future__ import annotations

import re
import secrets
import tempfile
import threading
import time
from pathlib import Path

import pytest

from corrgrpo_envs.redteam import channels
from corrgrpo_envs.redteam import registry as redteam
from corrgrpo_sandbox import Limits, SandboxUnavailable, make_sandbox
from corrgrpo_sandbox.seccomp import seccomp_unavailable_reason
from tests.sandbox.backends import backend_params, open_sandbox

LIMITS = Limits(timeout=5.0, memory_mb=256)


@pytest.fixture(params=backend_params())
def sandbox(request):
    yield from open_sandbox(request.param, LIMITS)


def test_proc_locks_cannot_be_read(sandbox):
    """It would list every open-file-description lock of the host and of other sandboxes
    (docker masks it with an empty file, the others with a /dev/null that cannot be opened)."""
    program = ("try:\n    print(repr(open('/proc/locks').read()))\n"
               "except OSError as exc:\n    print(type(exc).__name__)\n")
    result = sandbox.run(program)
    assert result.status == "ok", result.stderr
    assert result.stdout == ("''\n" if sandbox.name == "docker" else "PermissionError\n")


def _unfiltered(backend: str):
    """A sandbox of ``backend`` whose programs run without the seccomp filter (only to show that
    the attacks are real: the filter is what stops them)."""
    if seccomp_unavailable_reason():
        pytest.skip(f"no seccomp filter here: {seccomp_unavailable_reason()}")
    try:
        box = make_sandbox(backend, redteam.LIMITS)
    except SandboxUnavailable as exc:
        pytest.skip(f"{backend}: {exc}")
    box.seccomp = False
    return box


def _attack(name: str, backend: str, seccomp: bool) -> tuple[bool, str]:
    box = _unfiltered(backend)
    box.seccomp = seccomp
    (attack,) = [a for a in redteam.ATTACKS if a.name == name]
    with box, tempfile.TemporaryDirectory() as folder:
        return attack.run(redteam.Target(backend, box, Path(folder)))


@pytest.mark.parametrize("backend", ["process", "bwrap"])
def test_without_the_filter_file_locks_carry_64_bits(backend):
    held, detail = _attack("file_lock_channel", backend, seccomp=False)
    assert not held and detail.endswith("64 bits received exactly through: fcntl, flock, ofd"), \
        detail
    held, detail = _attack("file_lock_channel", backend, seccomp=True)
    assert held and "sender: fcntl EPERM, flock EPERM, ofd EPERM;" in detail, detail


@pytest.mark.parametrize("backend", ["process", "bwrap"])
def test_without_the_filter_directory_notifications_carry_the_message(backend):
    held, detail = _attack("dnotify_channel", backend, seccomp=False)
    assert not held and "F_NOTIFY made" in detail, detail
    received, sent = (int(x, 16) for x in re.search(r"received (\S+) of (\S+)", detail).groups())
    # every 1 bit arrives; other programs reading the same folders may add some (the host's
    # imports, other sandboxes): what a program learns of the host
    assert received & sent == sent, detail
    held, detail = _attack("dnotify_channel", backend, seccomp=True)
    assert held and "F_NOTIFY EPERM" in detail and "received 0x0000" in detail, detail


@pytest.mark.parametrize("backend", ["process", "bwrap"])
def test_without_the_filter_the_page_cache_carries_16_bits(backend):
    # a timing channel: the receiver samples residency while the sender evicts, so on a machine
    # other work keeps busy one exchange can fall out of step; the channel exists if any of a
    # few exchanges carries every bit (with the filter on, none can: every call is refused)
    for _ in range(4):
        held, detail = _attack("page_cache_channel", backend, seccomp=False)
        if not held and detail.endswith("16 bits received exactly through: preadv2"):
            break
    assert not held and detail.endswith("16 bits received exactly through: preadv2"), detail
    held, detail = _attack("page_cache_channel", backend, seccomp=True)
    assert held and "POSIX_FADV_DONTNEED EPERM" in detail and "preadv2 EPERM" in detail, detail


_OFD_LOCKER = '''
import fcntl, os, struct, time
fd = os.open(os.__file__, os.O_RDONLY)
fcntl.fcntl(fd, 37, struct.pack("hhqqi", fcntl.F_RDLCK, 0, OFFSET, 1, 0))
print("locked", flush=True)
time.sleep(3)  # hold the lock while the watcher looks for it (it stops as soon as it sees it)
'''


@pytest.mark.parametrize("backend", ["process", "bwrap"])
def test_an_ofd_lock_of_a_sandbox_shows_in_every_proc_locks(backend):
    """What the mask hides: the host's /proc/locks (any pid namespace's) lists a lock a
    sandboxed program takes without the filter, by its offset."""
    offset = secrets.randbits(40)
    box = _unfiltered(backend)
    seen = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + 8
        while not seen.is_set() and time.monotonic() < deadline:
            if any(line.split()[-2:-1] == [str(offset)]
                   for line in Path("/proc/locks").read_text().splitlines()):
                seen.set()
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    with box:
        result = box.run(_OFD_LOCKER.replace("OFFSET", str(offset)), Limits(timeout=8.0))
    watcher.join()
    assert result.stdout == "locked\n", result.stderr
    assert seen.is_set()


def test_every_channel_class_is_registered():
    names = {a.name for a in redteam.ATTACKS}
    assert {"dnotify_channel", "file_lock_channel", "proc_locks", "page_cache_channel",
            "ipc_channel", "shared_file_marks"} <= names
    assert set(channels.PAGE_CACHE_PROBES) == {"preadv2", "aio", "cachestat", "mincore"}
