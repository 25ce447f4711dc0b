"""The sandbox's system-call denials as a seccomp BPF program for a given machine.

:mod:`corrgrpo_sandbox.seccomp` builds the filter the runner installs with
libseccomp, for this host's machine. A Docker engine may run on another machine
(``DOCKER_HOST``), and the docker backend's relay installs the same denials
(:data:`~corrgrpo_sandbox.seccomp.DENIED`) as the container's first step, so
this module assembles them for the engine's machine from its system-call table:
a classic BPF program over ``struct seccomp_data`` that returns ``EPERM`` for
every entry (``clone``/``unshare`` only when their flags ask for a new user
namespace; the calls of :data:`~corrgrpo_sandbox.seccomp.DENIED_VALUES` and
:data:`~corrgrpo_sandbox.seccomp.DENIED_FLAGS` only for those values or flags of
one argument, whose low 32 bits it compares), ``ENOSYS`` for ``clone3`` (its flags sit in memory a filter cannot
read, so C libraries fall back to ``clone``), ``EPERM`` for any call made through
another ABI of the machine (``int 0x80``, x32), and allows the rest. Filters
stack: installed under a container engine's own profile, a call runs only when
both allow it.

:func:`denial_filter` returns the program as bytes (``struct sock_filter``
entries); whatever installs it needs ``PR_SET_NO_NEW_PRIVS`` first and passes it
to ``prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &sock_fprog)``.
"""

from __future__ import annotations

import struct

from corrgrpo_sandbox.seccomp import CLONE_NEWUSER, DENIED, DENIED_FLAGS, DENIED_VALUES

__all__ = ["canonical_machine", "denial_filter", "filter_architectures", "runner_syscall_numbers",
           "syscall_numbers"]

#: Denied only with ``CLONE_NEWUSER`` in their flags (the first argument), and ``ENOSYS``.
_FLAGGED = ("clone", "unshare")
_NOSYS = ("clone3",)

_ARCHES: dict[str, dict] = {
    "x86_64": {
        "audit": 0xC000003E,
        "x32_bit": 0x40000000,  # x32 calls are the x86_64 numbers with this bit set
        "numbers": {
            "clone": 56, "pivot_root": 155, "mount": 165, "umount2": 166, "add_key": 248,
            "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298,
            "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
            "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
            "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435, "mount_setattr": 442,
            "inotify_init": 253, "inotify_add_watch": 254, "inotify_init1": 294,
            "fanotify_init": 300, "fanotify_mark": 301, "fcntl": 72, "flock": 73,
            "fadvise64": 221, "preadv2": 327, "io_setup": 206, "io_submit": 209,
            "cachestat": 451,
        },
    },
    "aarch64": {
        "audit": 0xC00000B7,
        "x32_bit": None,
        "numbers": {
            "umount2": 39, "mount": 40, "pivot_root": 41, "unshare": 97, "add_key": 217,
            "request_key": 218, "keyctl": 219, "clone": 220, "perf_event_open": 241, "bpf": 280,
            "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
            "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
            "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435, "mount_setattr": 442,
            # (no inotify_init: the generic table has only inotify_init1)
            "inotify_init1": 26, "inotify_add_watch": 27, "fanotify_init": 262,
            "fanotify_mark": 263, "fcntl": 25, "flock": 32, "fadvise64": 223, "preadv2": 286,
            "io_setup": 0, "io_submit": 2, "cachestat": 451,
        },
    },
}
_ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}

#: The calls the runner makes by number (:data:`~corrgrpo_sandbox.seccomp.RUNNER_SYSCALLS`),
#: on the engine's machine.
_RUNNER_NUMBERS = {
    "x86_64": {"keyctl": 250, "ioprio_set": 251, "ioprio_get": 252},
    "aarch64": {"keyctl": 219, "ioprio_set": 30, "ioprio_get": 31},
}

# classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_EPERM = 1
_ENOSYS = 38
# offsets in struct seccomp_data: nr, arch, instruction_pointer, args[6] (little endian: an
# argument's low 32 bits first, 8 bytes apart)
_NR, _ARCH, _ARG0_LOW = 0, 4, 16


def canonical_machine(machine: str) -> str:
    """``uname -m``'s name for a machine an engine may call otherwise (``amd64``, ``arm64``)."""
    return _ARCH_ALIASES.get(machine, machine)


def filter_architectures() -> tuple[str, ...]:
    """The machines :func:`denial_filter` knows the system-call numbers of."""
    return tuple(_ARCHES)


def syscall_numbers(machine: str) -> dict[str, int]:
    """The numbers of the denied calls (:data:`~corrgrpo_sandbox.seccomp.DENIED`, and those
    denied for some arguments) on ``machine`` (those the machine has: aarch64 has no
    ``inotify_init``)."""
    arch = _ARCHES.get(_ARCH_ALIASES.get(machine, machine))
    if arch is None:
        raise ValueError(f"no system-call filter for architecture {machine!r}; "
                         f"known: {', '.join(_ARCHES)}")
    return dict(arch["numbers"])


def runner_syscall_numbers(machine: str) -> dict[str, int]:
    """The numbers of the calls the runner makes by number, on ``machine``."""
    syscall_numbers(machine)  # (raises for an unknown machine)
    return dict(_RUNNER_NUMBERS[canonical_machine(machine)])


def denial_filter(machine: str) -> bytes:
    """The filter for ``machine`` (``uname -m`` or an engine's architecture name).

    Raises:
        ValueError: for a machine whose system-call numbers are not known here.
    """
    numbers = syscall_numbers(machine)
    arch = _ARCHES[_ARCH_ALIASES.get(machine, machine)]
    deny = (_RET_K, 0, 0, _ERRNO | _EPERM)
    allow = (_RET_K, 0, 0, _ALLOW)
    prog: list[tuple[int, int, int, int]] = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ_K, 1, 0, arch["audit"]),  # this ABI: go on; any other: denied
        deny,
        (_LD_W_ABS, 0, 0, _NR),
    ]
    if arch["x32_bit"] is not None:
        prog += [(_JGE_K, 0, 1, arch["x32_bit"]), deny]
    for name in DENIED:
        if name not in numbers:  # not a system call of this machine
            continue
        if name in _FLAGGED:  # new user namespaces: denied; other flags pass on
            prog += [(_JEQ_K, 0, 4, numbers[name]), (_LD_W_ABS, 0, 0, _ARG0_LOW),
                     (_JSET_K, 0, 1, CLONE_NEWUSER), deny, allow]
        elif name in _NOSYS:
            prog += [(_JEQ_K, 0, 1, numbers[name]), (_RET_K, 0, 0, _ERRNO | _ENOSYS)]
        else:
            prog += [(_JEQ_K, 0, 1, numbers[name]), deny]
    for name, (index, values) in DENIED_VALUES.items():
        if name in numbers:  # nr == N: load the argument; each value: denied; else allowed
            tests = [(_JEQ_K, len(values) - i, 0, value) for i, value in enumerate(values)]
            prog += [(_JEQ_K, 0, len(tests) + 3, numbers[name]),
                     (_LD_W_ABS, 0, 0, _ARG0_LOW + 8 * index), *tests, allow, deny]
    for name, (index, flag, _why) in DENIED_FLAGS.items():
        if name in numbers:
            prog += [(_JEQ_K, 0, 4, numbers[name]), (_LD_W_ABS, 0, 0, _ARG0_LOW + 8 * index),
                     (_JSET_K, 0, 1, flag), deny, allow]
    prog.append(allow)
    return b"".join(struct.pack("<HBBI", *op) for op in prog)
