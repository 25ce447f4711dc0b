"""The ``bwrap`` backend: bubblewrap around a fresh interpreter.

``bwrap`` (``apt-get install bubblewrap``) builds the sandbox before the
interpreter starts: a new root with only the allow-list view of the host
(:mod:`corrgrpo_sandbox.view`: system folders, a minimal ``/etc``, the
interpreter, the extra ``paths``, each bound read-only; the ``hide`` paths
inside them covered; nothing else of the host), a private ``/dev`` with
only ``null``, ``zero``, ``random`` and ``urandom`` (read-only, plus a
size-capped ``/dev/shm``), a private ``/proc`` (bubblewrap keeps ``/proc/sys``
read-only; ``/proc/locks`` cannot be opened), size-capped private ``/tmp`` and ``/var/tmp``, new user, pid, network, IPC and UTS namespaces,
uid/gid 65534 inside, a new session, and the sandbox dies with its parent. The
program (fresh) or the fork server is the namespace's pid 1: there is no
bubblewrap init a program could ptrace.

As the host's root, bubblewrap itself runs as a fresh unprivileged host uid
(:func:`~corrgrpo_sandbox.hostuser.sandbox_uid`), so uid 65534 inside maps
to that uid, never to root. The folders the interpreter needs (it may live
under ``/root`` or ``/tmp``) are first bound, by root in a private mount
namespace, under a world-readable staging tmpfs, and bubblewrap binds them from
there read-only at their own paths.

With ``reuse="auto"`` (default) or ``"fork"``, each worker keeps one such sandbox
alive with a fork server inside (:mod:`corrgrpo_sandbox.forkserver`) and
programs run in forked children, each in its own mount and IPC namespaces;
``reuse="fresh"`` starts bubblewrap and a new interpreter per program.
"""

from __future__ import annotations

import os
import shlex
import shutil
import threading

from corrgrpo_sandbox.base import runner_command
from corrgrpo_sandbox.cgroups import (
    PROGRAM_GROUP,
    SERVER_CPU_MOUNT,
    SandboxCgroup,
    new_cgroup,
)
from corrgrpo_sandbox.forkserver import ForkingSandbox
from corrgrpo_sandbox.hostuser import host_is_root, sandbox_uid
from corrgrpo_sandbox.process import MASKED_PROC, PRIVATE_TMPFS, keep_visible
from corrgrpo_sandbox.types import SANDBOX_CWD, Limits, RunResult, SandboxUnavailable, new_token
from corrgrpo_sandbox.view import filesystem_view, interpreter_roots

__all__ = ["BwrapSandbox", "bwrap_available", "bwrap_unavailable_reason"]

_PROBE: dict[str, str] = {}
_PROBE_LOCK = threading.Lock()

#: Capability numbers -> names for bubblewrap's --cap-add (what a fork server keeps).
_CAP_NAMES = {0: "CAP_CHOWN", 1: "CAP_DAC_OVERRIDE", 3: "CAP_FOWNER", 5: "CAP_KILL",
              6: "CAP_SETGID", 7: "CAP_SETUID", 8: "CAP_SETPCAP", 21: "CAP_SYS_ADMIN"}

#: Where, as root, the interpreter's folders are staged for bubblewrap (first free one).
_STAGING = ("/mnt", "/media", "/srv", "/opt")


def bwrap_unavailable_reason(python: str | None = None) -> str:
    """``""`` when bubblewrap works here for ``python``, else exactly why not (probed once)."""
    sandbox = BwrapSandbox(python=python, reuse="fresh", _probe=False)
    with _PROBE_LOCK:
        if sandbox.python not in _PROBE:
            reason = ""
            if not shutil.which("bwrap"):
                reason = "bubblewrap is not installed (apt-get install bubblewrap)"
            else:
                try:
                    result = sandbox.run("print('ok')", Limits(timeout=10))
                except SandboxUnavailable as exc:
                    reason = str(exc)
                else:
                    if result.status != "ok" or result.stdout.strip() != "ok":
                        reason = (f"a probe program inside bubblewrap got {result.status!r}: "
                                  f"{(result.stderr.strip() or result.stdout.strip())[-400:]!r}")
            _PROBE[sandbox.python] = reason
        return _PROBE[sandbox.python]


def bwrap_available(python: str | None = None) -> bool:
    """Whether ``bwrap`` is installed and can start a sandbox here (probed once per interpreter)."""
    return not bwrap_unavailable_reason(python)


def _staging_folder(staged: list[str]) -> str:
    """A folder of :data:`_STAGING` that holds none of the ``staged`` ones."""
    staging = next((d for d in _STAGING if os.path.isdir(d) and not any(
        k == d or k.startswith(d + "/") for k in staged)), "")
    if not staging:
        raise SandboxUnavailable(f"no folder to stage the interpreter in (one of {_STAGING})")
    return staging


def _dev_options() -> list[str]:
    """A private ``/dev``: the host's device nodes a program may use, nothing else."""
    dev = ["--size", "65536", "--tmpfs", "/dev"]
    for name in ("null", "zero", "random", "urandom"):
        dev += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        dev += ["--symlink", target, f"/dev/{name}"]
    return dev


class BwrapSandbox(ForkingSandbox):
    """Programs inside bubblewrap: forked by a per-worker server, or a fresh ``python -I -S`` each.

    Args:
        limits: default :class:`Limits`.
        python: the interpreter (default: the current one).
        paths: folders appended to the program's ``sys.path`` (and bound into its view).
        uid: the (unprivileged) user id inside the sandbox.
        reuse: ``auto``/``fork``: one long-lived sandbox with a fork server per
            worker; ``fresh``: a new sandbox and interpreter per program.
        max_programs: programs one fork server runs before it is replaced.
        hide: files and folders to cover inside the allowed ones (data sets, caches),
            besides :func:`~corrgrpo_sandbox.view.default_hidden`.
    """

    name = "bwrap"

    def __init__(self, limits: Limits | None = None, python: str | None = None,
                 paths: list[str] | None = None, uid: int = 65534, reuse: str = "auto",
                 max_programs: int = 1000, hide: list[str] | None = None,
                 _probe: bool = True):
        super().__init__(limits, python, paths, reuse, max_programs, hide)
        self.uid = int(uid)
        self._bwrap = shutil.which("bwrap")
        if _probe:
            reason = bwrap_unavailable_reason(self.python)
            if reason:
                raise SandboxUnavailable(f"the bwrap sandbox cannot run here: {reason}")

    def command(self, limits: Limits) -> list[str]:
        """The full ``bwrap ... python -I -S -c RUNNER`` command line of a fresh run."""
        return [*self._prefix(limits, fork=False), *runner_command(self.python)]

    def _server_prefix(self, limits: Limits) -> list[str]:
        return self._prefix(limits, fork=True)

    def _server_launch(self, limits: Limits, group: SandboxCgroup | None) -> tuple[list[str], dict]:
        """The server's bubblewrap, with its control group bound at ``SERVER_CPU_MOUNT`` and
        handed to the host uid bubblewrap runs as (only the files moving a child takes)."""
        uid = sandbox_uid() if host_is_root() else None
        config = self._server_config(limits)
        program = group.program_group(uid) if group is not None else None
        cpu_bind = None
        if program is not None and group is not None and group.cpu is not None:
            cpu_bind = (str(group.cpu.folder), SERVER_CPU_MOUNT)
            config.update(cpu_group=f"{SERVER_CPU_MOUNT}/{PROGRAM_GROUP}",
                          cpu_file=program.usage_file, cpu_mount=SERVER_CPU_MOUNT)
        return self._prefix(limits, fork=True, uid=uid, cpu_bind=cpu_bind), config

    def _server_config(self, limits: Limits) -> dict:
        """The server keeps what it needs to give each child fresh mount and IPC namespaces."""
        return {"drop_caps": True, "fresh_tmpfs": list(PRIVATE_TMPFS),
                "tmpfs_bytes": int(limits.file_size_mb) << 20, "keep": self._keeps()}

    def _keeps(self) -> list[str]:
        """Folders the program must see under a fork child's fresh tmpfs (``/tmp``)."""
        return keep_visible(list(PRIVATE_TMPFS), self.python, self.paths)

    def _prefix(self, limits: Limits, fork: bool, uid: int | None = None,
                cpu_bind: tuple[str, str] | None = None) -> list[str]:
        """``bwrap`` and its options (behind a root-only staging step as root): all before python.

        The new root holds only the allow-list view (:mod:`corrgrpo_sandbox.view`),
        each folder bound read-only on its own; the ``hide`` paths inside them are
        covered after the binds.
        """
        if not self._bwrap:
            raise SandboxUnavailable("bwrap is not installed (apt-get install bubblewrap)")
        size = str(int(limits.file_size_mb) << 20)
        as_root = host_is_root()
        view = filesystem_view(self.python, self.paths, self.hide, PRIVATE_TMPFS)
        # As root the interpreter's folders and ``paths`` are staged (their parents may be
        # root-only, and bubblewrap runs as an unprivileged uid); system folders are bound as is.
        own = {os.path.realpath(p) for p in [*interpreter_roots(self.python), *self.paths]} \
            | {os.path.abspath(p) for p in [*interpreter_roots(self.python), *self.paths]}
        staged = [b for b in view.binds if as_root and b in own]
        staging = _staging_folder(staged) if staged else ""
        steps: list[tuple[str, list[str]]] = []
        for path in view.binds:
            source = f"{staging}/{staged.index(path)}" if path in staged else path
            steps.append((path, ["--ro-bind", source, path]))
        for path, target in view.links:
            steps.append((path, ["--symlink", target, path]))
        for point in PRIVATE_TMPFS:
            steps.append((point, ["--size", size, "--perms", "1777", "--tmpfs", point]))
        steps += [("/dev", _dev_options()), ("/proc", ["--proc", "/proc"])]
        # every open-file-description lock of the host and of other sandboxes is listed there
        # (a nodev bind of /dev/null: the file cannot be opened)
        steps += [(path, ["--ro-bind", "/dev/null", path]) for path in MASKED_PROC]
        cmd = [self._bwrap]
        for _, options in sorted(steps, key=lambda s: s[0].split("/")):
            cmd += options
        cmd += ["--remount-ro", "/dev"]
        if cpu_bind is not None:  # writable: the server moves each child into its sub-group
            cmd += ["--bind", cpu_bind[0], cpu_bind[1]]
        for path in view.hide_dirs:
            cmd += ["--size", "4096", "--perms", "0755", "--tmpfs", path, "--remount-ro", path]
        for path in view.hide_files:  # (a nodev bind: the file cannot be opened at all)
            cmd += ["--ro-bind", "/dev/null", path]
        cmd += [
            "--dir", SANDBOX_CWD, "--chdir", SANDBOX_CWD, "--remount-ro", "/",
            "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--uid", str(self.uid), "--gid", str(self.uid),
            "--new-session", "--die-with-parent", "--as-pid-1",
        ]
        if fork:
            for cap in sorted(_CAP_NAMES):
                cmd += ["--cap-add", _CAP_NAMES[cap]]
        else:
            cmd += ["--cap-drop", "ALL"]
        cmd += [
            "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
            "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8",
        ]
        if not as_root:
            return cmd
        return [*_root_staging(staging, staged, sandbox_uid() if uid is None else uid), *cmd]

    def run(self, program: str, limits: Limits | None = None) -> RunResult:
        limits = limits or self.limits
        if self.forking:
            result = self._run_forked(program, limits)
            if result is not None:
                return result
        header = self._header(new_token(), limits, cwd=SANDBOX_CWD)
        group = new_cgroup(limits, server=False)  # the whole sandbox's memory and process cap
        try:
            result = self._run_command([*(group.enter() if group else []), *self.command(limits)],
                                       header, program, limits)
            result.cpu_seconds = group.cpu_seconds() if group is not None else None
            return result
        finally:
            if group is not None:
                group.close()


def _root_staging(staging: str, keeps: list[str], uid: int) -> list[str]:
    """As root: a private mount namespace where ``keeps`` are bound under ``staging``, then
    ``bwrap`` runs as the unprivileged host ``uid`` (so nothing in the sandbox is root)."""
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    if not unshare or not setpriv:
        raise SandboxUnavailable("as root the bwrap backend needs unshare and setpriv (util-linux)")
    lines = ["set -e"]
    if keeps:
        lines.append(f"mount -t tmpfs -o size=65536,mode=755 corrgrpo-staging {shlex.quote(staging)}")
        for i, path in enumerate(keeps):
            lines.append(f"mkdir {staging}/{i} && mount --bind {shlex.quote(path)} {staging}/{i}")
    lines.append(f'exec {setpriv} --reuid={uid} --regid={uid} --clear-groups -- "$@"')
    return [unshare, "--mount", "--propagation", "private", "/bin/sh", "-c", "\n".join(lines),
            "corrgrpo-bwrap"]
