"""The ``process`` backend: a fresh interpreter in its own namespaces.

Each program runs as ``unshare --net --mount --pid --ipc --uts --fork
--kill-child python -I -S -c RUNNER`` in its own session. Inside, the runner builds a new
root (a tmpfs it pivots into) that holds only the allow-list view of the host
(:mod:`corrgrpo_sandbox.view`: system folders, a minimal ``/etc``, the
interpreter, the extra ``paths``, each bound read-only, the ``hide`` paths inside
them covered), gives the program private, size-capped ``/tmp``, ``/var/tmp`` and
``/dev/shm``, mounts a ``/proc`` that shows only the sandbox's own processes (and
not ``/proc/locks``: :data:`MASKED_PROC`),
drops every capability and sets resource limits.
The wall timeout kills the whole process group; the pid namespace takes any
child the program left behind with it.

Without ``root``, ``unshare --map-root-user`` gives the same namespaces where
unprivileged user namespaces are enabled. Where ``unshare`` does not work at
all, the backend degrades to resource limits, a private session, a minimal
environment and a temporary working folder (``isolation == "rlimits"``); the
``bwrap`` backend is then the one to use for untrusted code.

With namespaces and ``reuse="auto"`` (default) or ``"fork"``, each worker keeps
one such namespace alive with a fork server inside as its pid 1
(:mod:`corrgrpo_sandbox.forkserver`); programs run in forked children.
Without namespaces there is no pid namespace to clean up after a program, so
``auto`` runs fresh interpreters there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import warnings

from corrgrpo_sandbox.base import runner_command
from corrgrpo_sandbox.cgroups import (
    PROGRAM_GROUP,
    SERVER_CPU_MOUNT,
    SandboxCgroup,
    new_cgroup,
)
from corrgrpo_sandbox.forkserver import ForkingSandbox
from corrgrpo_sandbox.hostuser import host_is_root, sandbox_uid
from corrgrpo_sandbox.types import SANDBOX_CWD, Limits, RunResult, SandboxDowngrade, new_token
from corrgrpo_sandbox.view import filesystem_view, interpreter_roots

__all__ = ["MASKED_PROC", "PRIVATE_TMPFS", "ProcessSandbox", "interpreter_roots",
           "isolation_warning", "keep_visible"]


def keep_visible(covered: list[str], python: str, extra: list[str]) -> list[str]:
    """Folders under a covered one (a fork child's fresh ``/tmp``) that must stay readable
    (the interpreter, extra paths)."""
    keep = []
    for root in [*interpreter_roots(python), *extra]:
        if any(root == h or root.startswith(h.rstrip("/") + "/") for h in covered):
            keep.append(root)
    return sorted(set(keep))


#: Folders every sandbox replaces with its own empty, size-capped tmpfs (writable).
PRIVATE_TMPFS = ("/tmp", "/var/tmp", "/dev/shm")

#: Files of a sandbox's ``/proc`` that cannot be opened: ``/proc/locks`` lists the
#: open-file-description locks of every pid namespace (the host's, other sandboxes').
MASKED_PROC = ("/proc/locks",)


def isolation_warning(wanted: str, got: str, reason: str) -> None:
    """Say loudly that a sandbox runs with less isolation than asked for, and why."""
    warnings.warn(f"sandbox: {wanted} unavailable, using {got} instead: {reason}",
                  SandboxDowngrade, stacklevel=3)


class ProcessSandbox(ForkingSandbox):
    """``python -I`` under namespaces, limits and a wall timeout: forked by a server or fresh.

    Args:
        limits: default :class:`Limits` for :meth:`run`.
        python: the interpreter (default: the current one).
        paths: folders appended to the program's ``sys.path`` (and bound into its view).
        isolation: ``"auto"`` (namespaces when ``unshare`` works, else
            rlimits only), ``"namespaces"`` (fail if unavailable) or ``"rlimits"``.
        reuse: ``auto`` (fork servers when namespaces work), ``fork`` or ``fresh``.
        max_programs: programs one fork server runs before it is replaced.
        hide: files and folders to cover inside the allowed ones (data sets, caches),
            besides :func:`~corrgrpo_sandbox.view.default_hidden`.
    """

    name = "process"
    _lock_names = ("_fork_lock", "_lock")

    def __init__(self, limits: Limits | None = None, python: str | None = None,
                 paths: list[str] | None = None, isolation: str = "auto", reuse: str = "auto",
                 max_programs: int = 1000, hide: list[str] | None = None):
        super().__init__(limits, python, paths, reuse, max_programs, hide)
        if isolation not in ("auto", "namespaces", "rlimits"):
            raise ValueError(f"isolation must be auto, namespaces or rlimits, got {isolation!r}")
        self._wanted = isolation
        self._prefix: list[str] | None = None
        #: why namespaces are unavailable (empty when they work)
        self.reason = ""
        self._lock = threading.Lock()

    @property
    def isolation(self) -> str:
        """``"namespaces"`` or ``"rlimits"``: what this machine allows (probed once)."""
        self._probe()
        return "namespaces" if self._prefix else "rlimits"

    def _probe(self) -> None:
        with self._lock:
            if self._prefix is not None:
                return
            self._prefix = []
            if self._wanted == "rlimits":
                return
            unshare = shutil.which("unshare")
            candidates = []
            if unshare:
                base = [unshare, "--net", "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
                candidates = [base] if os.geteuid() == 0 else []
                candidates.append([*base[:1], "--map-root-user", *base[1:]])
            self.reason = "unshare is not installed (util-linux)"
            for prefix in candidates:
                self._prefix = prefix
                probe = self._run_namespaced("print('ok')", Limits(timeout=10))
                if probe.status == "ok" and probe.stdout.strip() == "ok":
                    self.reason = ""
                    return
                self.reason = (f"{' '.join(prefix[:2])} ... failed: {probe.status} "
                               f"{probe.stderr.strip()[-300:]!r}")
            self._prefix = []
            if self._wanted == "namespaces":
                raise RuntimeError(f"the process backend needs unshare namespaces: {self.reason}")
            isolation_warning("process namespaces", "resource limits only (do not run untrusted "
                              "code this way)", self.reason)

    def run(self, program: str, limits: Limits | None = None) -> RunResult:
        limits = limits or self.limits
        self._probe()
        if self.forking:
            result = self._run_forked(program, limits)
            if result is not None:
                result.extra["isolation"] = "namespaces"
                return result
        if self._prefix:
            return self._run_namespaced(program, limits)
        return self._run_plain(program, limits)

    def _fork_unsupported(self) -> str:
        self._probe()
        return "" if self._prefix else "fork servers need unshare namespaces, unavailable here"

    def _server_prefix(self, limits: Limits) -> list[str]:
        self._probe()
        return list(self._prefix or [])

    def _server_launch(self, limits: Limits, group: SandboxCgroup | None) -> tuple[list[str], dict]:
        """The server's namespaces and set-up; its control group bound at ``SERVER_CPU_MOUNT``
        (the server is the namespace's root, so no file of the group needs another owner)."""
        config = self._server_config(limits)
        program = group.program_group(None) if group is not None else None
        if program is not None and group is not None and group.cpu is not None:
            config.update(cpu_bind=(str(group.cpu.folder), SERVER_CPU_MOUNT),
                          cpu_group=f"{SERVER_CPU_MOUNT}/{PROGRAM_GROUP}",
                          cpu_file=program.usage_file, cpu_mount=SERVER_CPU_MOUNT)
        return self._server_prefix(limits), config

    def _server_config(self, limits: Limits, fork: bool = True) -> dict:
        """Mount, uid and capability set-up (a fresh run's header asks the runner for the same).

        A new root with only the allow-list view (:mod:`corrgrpo_sandbox.view`:
        system folders, a minimal ``/etc``, the interpreter, ``paths``; ``hide``
        covered), read-only; a private ``/dev`` (null, zero, random, urandom),
        read-only ``/proc/sys``, size-capped private ``/tmp``, ``/var/tmp`` and
        ``/dev/shm``; as host root, programs run as a fresh unprivileged uid. A fork
        server also gives every child its own mount and IPC namespaces with fresh
        tmpfs mounts.
        """
        view = filesystem_view(self.python, self.paths, self.hide, PRIVATE_TMPFS)
        config = {
            "cwd": SANDBOX_CWD, "isolate_fs": True, "drop_caps": True,
            "masked_proc": list(MASKED_PROC),
            "tmpfs": list(PRIVATE_TMPFS), "view": view.header(),
            "tmpfs_bytes": int(limits.file_size_mb) << 20,
            "keep": keep_visible(list(PRIVATE_TMPFS), self.python, self.paths),
            "program_uid": sandbox_uid() if host_is_root() else None,
        }
        if fork:
            config["fresh_tmpfs"] = list(PRIVATE_TMPFS)
        return config

    def _run_namespaced(self, program: str, limits: Limits) -> RunResult:
        header = self._header(new_token(), limits, **self._server_config(limits, fork=False))
        group = new_cgroup(limits, server=False)
        enter = group.enter() if group else []
        try:
            result = self._run_command([*enter, *self._prefix, *runner_command(self.python)],
                                       header, program, limits)
            result.cpu_seconds = group.cpu_seconds() if group is not None else None
        finally:
            if group is not None:
                group.close()
        result.extra["isolation"] = "namespaces"
        return result

    def _run_plain(self, program: str, limits: Limits) -> RunResult:
        workdir = tempfile.mkdtemp(prefix="corrgrpo-sandbox-")
        prefix: list[str] = []
        if host_is_root():  # never the host's root, even without namespaces
            setpriv = shutil.which("setpriv")
            if not setpriv:
                shutil.rmtree(workdir, ignore_errors=True)
                return RunResult("sandbox_error", stderr="as root the rlimits-only process backend "
                                 "needs setpriv (util-linux) to drop to an unprivileged uid",
                                 backend=self.name, extra={"isolation": "rlimits"})
            uid = sandbox_uid()
            os.chown(workdir, uid, uid)
            prefix = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        try:
            header = self._header(new_token(), limits, cwd=workdir)
            result = self._run_command([*prefix, *runner_command(self.python)], header, program,
                                       limits, cwd=workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        if prefix and result.status.startswith("killed") and "ermission denied" in result.stderr:
            result.status = "sandbox_error"
            result.stderr += ("\nthe interpreter is not readable by an unprivileged uid: without "
                              "namespaces, put it (and its parents) where every user can read it")
        result.extra["isolation"] = "rlimits"
        return result
