"""System calls a sandboxed program may not make, as a seccomp filter built on the host.

The runner (which runs under ``python -I -S`` and cannot import this package)
gets two things from the host: the numbers of the few system calls it makes by
number (:data:`RUNNER_SYSCALLS`), and the filter itself as a
classic BPF program (:func:`program_filter`) that it installs with
``prctl(PR_SET_SECCOMP)`` right before the program starts, after its own set-up
(mounts, namespaces, keyring, uid, capabilities). Both come from libseccomp
through the ``pyseccomp`` bindings, so the numbers, the architecture check and
the rejection of foreign system-call ABIs (the process is killed) are libseccomp's
for this machine.

The filter returns ``EPERM`` for every entry of :data:`DENIED` (``clone3`` gets
``ENOSYS``: its flags live in memory a filter cannot read, and C libraries fall
back to ``clone``, whose flags it can), and for the calls of :data:`DENIED_VALUES`
and :data:`DENIED_FLAGS` when one argument asks for what a program may not do
(``fcntl`` with a lock or notification command...). The reason for each entry is
in those tables and in the threat model of ``docs/code.md``.
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile
import warnings

from corrgrpo_sandbox.types import SandboxDowngrade

__all__ = ["DENIED", "DENIED_FLAGS", "DENIED_VALUES", "program_filter",
           "seccomp_unavailable_reason", "syscall_numbers"]

#: The system calls the runner makes by number (the C library wraps none of them): ``keyctl``
#: to join a fresh session keyring, ``ioprio_get``/``ioprio_set`` for a fork server to check
#: and put back its own I/O priority.
RUNNER_SYSCALLS = ("keyctl", "ioprio_get", "ioprio_set")

CLONE_NEWUSER = 0x10000000

#: What the filter denies, and why. ``unshare``/``clone`` only with ``CLONE_NEWUSER``.
DENIED: dict[str, str] = {
    "unshare": "with CLONE_NEWUSER: a new user namespace holds every capability, which "
               "reaches mounts, network configuration, packet and netfilter sockets",
    "clone": "with CLONE_NEWUSER (the same, through clone)",
    "clone3": "its flags are in memory a filter cannot read (ENOSYS: libc falls back to clone)",
    "keyctl": "key management: a filter cannot tell the program's own keyring from another's "
              "(serials are listed in /proc/keys), and user, user-session and persistent "
              "keyrings outlive the program",
    "add_key": "adds keys to those keyrings",
    "request_key": "looks keys up in those keyrings and may start an upcall",
    "io_uring_setup": "io_uring: a large kernel surface, system calls outside the filter's view",
    "io_uring_enter": "io_uring (see io_uring_setup)",
    "io_uring_register": "io_uring (see io_uring_setup)",
    "userfaultfd": "stalls kernel accesses to user memory at will: a common exploit primitive",
    "perf_event_open": "performance counters: side channels and a history of kernel bugs",
    "bpf": "BPF programs and maps: kernel code paths no judged program needs",
    "mount": "mounts (the sandbox is built before the filter; a program needs none)",
    "umount2": "unmounting would uncover what the sandbox hides",
    "fsopen": "the new mount interface (as mount)",
    "fsconfig": "the new mount interface (as mount)",
    "fsmount": "the new mount interface (as mount)",
    "fspick": "the new mount interface (as mount)",
    "move_mount": "the new mount interface (as mount)",
    "open_tree": "clones mounts (as mount)",
    "mount_setattr": "changes mount flags, e.g. read-only (as mount)",
    "pivot_root": "changes the root (as mount)",
    "inotify_init": "file watches: the host folders a sandbox binds read-only are the same files "
                    "for every sandbox, so a watch there sees which files a concurrent program "
                    "opens and reads (the modules it imports, a data file it finds)",
    "inotify_init1": "file watches (see inotify_init)",
    "inotify_add_watch": "file watches (see inotify_init; denied too in case a watch descriptor "
                         "is ever inherited)",
    "fanotify_init": "file-access notification of whole mounts and file systems (as inotify, "
                     "wider; unprivileged since Linux 5.13)",
    "fanotify_mark": "file-access notification (see fanotify_init)",
    "flock": "a whole-file lock lives on the host's file, which every sandbox binds read-only "
             "and may lock: a program can set and test locks another one sees (a channel "
             "between concurrent programs); a program's own files need none",
    "io_setup": "Linux native AIO: its reads carry RWF_NOWAIT in memory a filter cannot read, "
                "which tells whether a shared file's page is in the page cache",
    "io_submit": "Linux native AIO (see io_setup)",
    "cachestat": "page-cache state of a file (the kernel also refuses it for a file the "
                 "caller may not write; denied in case a kernel does not)",
}

#: ``fcntl`` commands (its second argument) that reach the host's file behind a descriptor:
#: record locks and leases live on that file, directory notifications watch it.
_FCNTL_DENIED = {
    5: "F_GETLK: tests record locks (see F_SETLK)",
    6: "F_SETLK: a record lock on a read-only file of the host is seen by every sandbox "
       "(64 bits in 64 bytes of one file); a program's own files need none",
    7: "F_SETLKW (see F_SETLK)",
    36: "F_OFD_GETLK (see F_SETLK)",
    37: "F_OFD_SETLK (see F_SETLK; open-file-description locks also show in every "
        "/proc/locks)",
    38: "F_OFD_SETLKW (see F_OFD_SETLK)",
    1024: "F_SETLEASE: a lease reports every other opening of a file",
    1025: "F_GETLEASE (see F_SETLEASE)",
    1026: "F_NOTIFY: directory notifications (dnotify) on the host folders every sandbox "
          "binds see the files a concurrent program or the host reads, and signal them",
}

#: Calls denied when one argument (its low 32 bits, as the kernel reads an ``int``) has one of
#: some values: ``{call: (argument index, {value: why})}``.
DENIED_VALUES: dict[str, tuple[int, dict[int, str]]] = {
    "fcntl": (1, _FCNTL_DENIED),
    "fadvise64": (3, {4: "POSIX_FADV_DONTNEED evicts a shared file's pages from the page "
                      "cache, which a concurrent program can then see refilled (and slows "
                      "the host)"}),
}

#: Calls denied when one argument has a flag: ``{call: (argument index, flag, why)}``.
DENIED_FLAGS: dict[str, tuple[int, int, str]] = {
    "preadv2": (5, 0x8, "RWF_NOWAIT: a read that fails unless the page is in the page cache "
                        "tells which pages of a shared file another program has read"),
}


@functools.lru_cache(maxsize=1)
def syscall_numbers() -> dict[str, int]:
    """``{name: number}`` of :data:`RUNNER_SYSCALLS` on this machine (empty without libseccomp:
    the runner then uses its own table for x86_64, aarch64 and riscv64)."""
    try:
        import pyseccomp
    except (ImportError, OSError, RuntimeError):  # the bindings, or libseccomp itself, missing
        return {}
    arch = pyseccomp.system_arch()
    return {name: int(pyseccomp.resolve_syscall(arch, name)) for name in RUNNER_SYSCALLS}


@functools.lru_cache(maxsize=1)
def _build() -> tuple[bytes, str]:
    try:
        import pyseccomp
    except (ImportError, OSError, RuntimeError) as exc:
        return b"", (f"the pyseccomp bindings or libseccomp are missing ({exc}); "
                     "pip install 'corrgrpo[code]', apt-get install libseccomp2")
    deny, nosys = pyseccomp.ERRNO(errno.EPERM), pyseccomp.ERRNO(errno.ENOSYS)
    flags_arg = 1 if os.uname().machine.startswith("s390") else 0  # clone's flags argument
    new_user = pyseccomp.Arg(0, pyseccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)
    filt = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    arch = pyseccomp.system_arch()
    try:
        # a system call of another ABI (i386's int 0x80, x32) ends the whole program
        filt.set_attr(pyseccomp.Attr.ACT_BADARCH, pyseccomp.KILL_PROCESS)
        for name in DENIED:
            if pyseccomp.resolve_syscall(arch, name) < 0:
                continue  # not a system call of this machine (inotify_init on aarch64)
            if name == "unshare":
                filt.add_rule(deny, name, new_user)
            elif name == "clone":
                filt.add_rule(deny, name, pyseccomp.Arg(flags_arg, pyseccomp.MASKED_EQ,
                                                        CLONE_NEWUSER, CLONE_NEWUSER))
            else:
                filt.add_rule(nosys if name == "clone3" else deny, name)
        for name, (index, values) in DENIED_VALUES.items():
            if pyseccomp.resolve_syscall(arch, name) >= 0:
                for value in values:
                    filt.add_rule(deny, name, pyseccomp.Arg(index, pyseccomp.MASKED_EQ,
                                                            0xFFFFFFFF, value))
        for name, (index, flag, _why) in DENIED_FLAGS.items():
            if pyseccomp.resolve_syscall(arch, name) >= 0:
                filt.add_rule(deny, name, pyseccomp.Arg(index, pyseccomp.MASKED_EQ, flag, flag))
        with tempfile.TemporaryFile() as out:
            filt.export_bpf(out)
            out.seek(0)
            program = out.read()
    except (OSError, ValueError, RuntimeError) as exc:
        return b"", f"libseccomp could not build the filter: {exc}"
    if not program or len(program) % 8:
        return b"", f"libseccomp exported {len(program)} bytes, not a BPF program"
    return program, ""


def seccomp_unavailable_reason() -> str:
    """``""`` when :func:`program_filter` works here, else why not."""
    return _build()[1]


def program_filter() -> bytes | None:
    """The filter as classic BPF (8 bytes per instruction), for ``prctl(PR_SET_SECCOMP)``;
    ``None``, with a :class:`~corrgrpo_sandbox.types.SandboxDowngrade` warning, where
    it cannot be built."""
    program, reason = _build()
    if program:
        return program
    warnings.warn(f"sandbox: no seccomp filter, programs may make every system call: {reason}",
                  SandboxDowngrade, stacklevel=2)
    return None
