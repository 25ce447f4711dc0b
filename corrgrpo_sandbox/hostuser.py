"""Which host user a sandboxed program runs as.

A program never runs as the host's root, not even as a root that a user
namespace maps to host root: file permissions (``/etc/shadow``, root-owned
``/proc/sys`` files, the devices of ``/dev``) then apply to it as to any
unprivileged account. When the host process is root, every sandbox (one fork
server or one fresh run) gets its own unprivileged host uid, drawn at random
from a range no account uses, so that

* ``RLIMIT_NPROC`` (counted per uid) bounds the processes of that one sandbox,
  and a fork bomb in one sandbox cannot starve another;
* sandboxes cannot signal or trace one another's processes (different uids).

When the host process is not root, programs run as the host user inside a user
namespace (that is all an unprivileged user namespace can map).
"""

from __future__ import annotations

import os
import secrets

__all__ = ["SANDBOX_UID_RANGE", "host_is_root", "sandbox_uid"]

#: Host uids drawn for sandboxes: far above accounts (< 65534) and the usual subordinate
#: ranges of rootless containers (100000 + 65536 * n for small n).
SANDBOX_UID_RANGE = (1 << 30, (1 << 31) - 2)


def host_is_root() -> bool:
    """Whether this host process runs as root (then programs get a :func:`sandbox_uid`)."""
    return os.geteuid() == 0


def sandbox_uid() -> int:
    """A fresh unprivileged host uid for one sandbox (unique with overwhelming probability)."""
    low, high = SANDBOX_UID_RANGE
    return low + secrets.randbelow(high - low)
