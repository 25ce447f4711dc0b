"""The ``bwrap`` backend: bubblewrap around a fresh interpreter.

``bwrap`` (``apt-get install bubblewrap``) builds the sandbox before the
interpreter starts: the host's root bound read-only, private ``/tmp``,
``/var/tmp``, ``/dev`` and ``/proc``, the home folder hidden, new user, pid,
network, IPC and UTS namespaces, uid/gid 65534 inside, a new session, and the
sandbox dies with its parent. The runner then only sets resource limits.

With ``reuse="auto"`` (default) or ``"fork"``, each worker keeps one such sandbox
alive with a fork server inside (:mod:`corrgrpo_envs.sandbox.forkserver`) and
programs run in forked children; ``reuse="fresh"`` starts bubblewrap and a new
interpreter per program.
"""

from __future__ import annotations

import shutil
import threading

from corrgrpo_envs.sandbox.base import (
    SANDBOX_CWD,
    Limits,
    RunResult,
    SandboxUnavailable,
    new_token,
    runner_command,
)
from corrgrpo_envs.sandbox.forkserver import ForkingSandbox
from corrgrpo_envs.sandbox.process import hidden_paths, keep_visible

__all__ = ["BwrapSandbox", "bwrap_available"]

_PROBE: dict[str, bool] = {}
_PROBE_LOCK = threading.Lock()


def bwrap_available(python: str | None = None) -> bool:
    """Whether ``bwrap`` is installed and can start a sandbox here (probed once per interpreter)."""
    sandbox = BwrapSandbox(python=python, reuse="fresh", _probe=False)
    with _PROBE_LOCK:
        if sandbox.python not in _PROBE:
            ok = False
            if shutil.which("bwrap"):
                result = sandbox.run("print('ok')", Limits(timeout=10))
                ok = result.status == "ok" and result.stdout.strip() == "ok"
            _PROBE[sandbox.python] = ok
        return _PROBE[sandbox.python]


class BwrapSandbox(ForkingSandbox):
    """Programs inside bubblewrap: forked by a per-worker server, or a fresh ``python -I -S`` each.

    Args:
        limits: default :class:`Limits`.
        python: the interpreter (default: the current one).
        paths: folders appended to the program's ``sys.path``.
        uid: the (unprivileged) user id inside the sandbox.
        reuse: ``auto``/``fork``: one long-lived sandbox with a fork server per
            worker; ``fresh``: a new sandbox and interpreter per program.
        max_programs: programs one fork server runs before it is replaced.
    """

    name = "bwrap"
    fresh_cpu_visible = False  # bwrap does not reap the interpreter before it exits

    def __init__(self, limits: Limits | None = None, python: str | None = None,
                 paths: list[str] | None = None, uid: int = 65534, reuse: str = "auto",
                 max_programs: int = 1000, _probe: bool = True):
        super().__init__(limits, python, paths, reuse, max_programs)
        self.uid = int(uid)
        self._bwrap = shutil.which("bwrap")
        if _probe and not bwrap_available(self.python):
            raise SandboxUnavailable(
                "bubblewrap is not installed or cannot create namespaces here "
                "(apt-get install bubblewrap; user namespaces must be enabled)"
            )

    def command(self, limits: Limits) -> list[str]:
        """The full ``bwrap ... python -I -S -c RUNNER`` command line of a fresh run."""
        return [*self._server_prefix(limits), *runner_command(self.python)]

    def _server_prefix(self, limits: Limits) -> list[str]:
        """``bwrap`` and its options: everything before the interpreter."""
        if not self._bwrap:
            raise SandboxUnavailable("bwrap is not installed (apt-get install bubblewrap)")
        size = str(int(limits.file_size_mb) << 20)
        cmd = [
            self._bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/var/tmp",
        ]
        hidden = hidden_paths()
        for path in hidden:
            cmd += ["--tmpfs", path]
        for path in keep_visible(hidden, self.python, self.paths):
            cmd += ["--ro-bind", path, path]
        cmd += [
            "--dir", SANDBOX_CWD, "--chdir", SANDBOX_CWD,
            "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--uid", str(self.uid), "--gid", str(self.uid),
            "--new-session", "--die-with-parent", "--cap-drop", "ALL",
            "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
            "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8",
        ]
        return cmd

    def run(self, program: str, limits: Limits | None = None) -> RunResult:
        limits = limits or self.limits
        if self.forking:
            result = self._run_forked(program, limits)
            if result is not None:
                return result
        header = self._header(new_token(), limits, cwd=SANDBOX_CWD)
        return self._run_command(self.command(limits), header, program, limits)
