"""System calls a sandboxed program may not make, as a seccomp filter built on the host.

The runner (which runs under ``python -I -S`` and cannot import this package)
needs two things from the host: the numbers of the few system calls it makes by
number (``keyctl``, to join a fresh session keyring), and the filter itself as
a classic BPF program it installs with ``prctl(PR_SET_SECCOMP)`` right before
the program starts. Both come from libseccomp (through the ``pyseccomp``
bindings), so the numbers and the architecture checks are the kernel's own for
this machine.
"""

from __future__ import annotations

import functools

__all__ = ["syscall_numbers"]

#: The system calls the runner makes by number.
RUNNER_SYSCALLS = ("keyctl",)


@functools.lru_cache(maxsize=1)
def syscall_numbers() -> dict[str, int]:
    """``{name: number}`` of :data:`RUNNER_SYSCALLS` on this machine (empty without libseccomp:
    the runner then uses its own table for x86_64, aarch64 and riscv64)."""
    try:
        import pyseccomp
    except (ImportError, OSError):  # the bindings, or libseccomp itself, are missing
        return {}
    arch = pyseccomp.system_arch()
    return {name: int(pyseccomp.resolve_syscall(arch, name)) for name in RUNNER_SYSCALLS}
