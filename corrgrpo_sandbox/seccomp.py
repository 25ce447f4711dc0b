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
back to ``clone``, whose flags it can). The reason for each entry is in
:data:`DENIED` and in the threat model of ``docs/code.md``.
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile
import warnings

from corrgrpo_sandbox.types import SandboxDowngrade

__all__ = ["DENIED", "program_filter", "seccomp_unavailable_reason", "syscall_numbers"]

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
