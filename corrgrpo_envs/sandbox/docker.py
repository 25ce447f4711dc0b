"""The ``docker`` backend: programs in locked-down containers, through the ``docker`` CLI.

Needs a Docker engine and an image with ``python3`` (default
:data:`DEFAULT_IMAGE`, built offline from Debian packages by
``bash scripts/docker_engine.sh``, which also installs and starts the engine).
Every container runs with no network, a read-only root, size-capped tmpfs
``/tmp``, ``/var/tmp`` and ``/dev/shm``, a private IPC namespace, memory (no
swap), pids and CPU limits, every capability dropped, ``no-new-privileges``,
and as a fresh unprivileged host uid
(:func:`~corrgrpo_envs.sandbox.hostuser.sandbox_uid`: containers share no
``RLIMIT_NPROC`` count and cannot signal one another). Docker keeps ``/proc/sys``
read-only and gives each container its own ``/dev``.

* ``reuse="auto"``/``"fork"``: one container per worker with a fork server as its
  pid 1 (:mod:`corrgrpo_envs.sandbox.forkserver`), reached over a unix socket in
  a host folder only that container's uid can enter, mounted read-only. Docker's
  seccomp profile and the dropped capabilities leave no namespaces to a
  server, so after each program it puts the writable folders back as they were
  (files, modes, extended attributes, modification times), checks System V IPC
  and ``/dev/mqueue`` and its own scheduling, limits and tracer, and quits when
  anything differs: a new container replaces it.
* ``reuse="fresh"``: one ``docker run --rm`` per program (slow: the engine's
  start-up, some 0.3-1 s, per program).

CPU time from outside (``cpu_seconds``) is not available: the engine, not this
process, is the containers' parent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading

from corrgrpo_envs.sandbox.base import (
    SANDBOX_CWD,
    Limits,
    RunResult,
    SandboxUnavailable,
    new_token,
    runner_command,
)
from corrgrpo_envs.sandbox.forkserver import ForkingSandbox, ForkServer, server_command
from corrgrpo_envs.sandbox.hostuser import sandbox_uid

__all__ = ["DEFAULT_IMAGE", "DockerSandbox", "docker_available"]

#: The image ``scripts/docker_engine.sh`` builds (Debian bookworm, python3 3.11); override
#: with ``CORRGRPO_DOCKER_IMAGE`` or ``image=``.
DEFAULT_IMAGE = os.environ.get("CORRGRPO_DOCKER_IMAGE", "corrgrpo/python:bookworm")

#: Memory a fork server itself needs inside its container, on top of the program's limit.
_SERVER_MB = 64

_HOW_TO = "run `bash scripts/docker_engine.sh` (installs docker.io, starts dockerd, builds the image)"
_CHECKED: dict[str, tuple[bool, str]] = {}
_CHECK_LOCK = threading.Lock()


def docker_available(image: str | None = None) -> tuple[bool, str]:
    """``(True, "")`` when the CLI is installed, an engine answers and ``image`` is present,
    else ``(False, reason)`` with what to do (checked once per image and process)."""
    image = image or DEFAULT_IMAGE
    with _CHECK_LOCK:
        if image not in _CHECKED:
            _CHECKED[image] = _check(image)
        return _CHECKED[image]


def _check(image: str) -> tuple[bool, str]:
    docker = shutil.which("docker")
    if not docker:
        return False, f"the docker CLI is not installed; {_HOW_TO}"
    try:
        version = subprocess.run([docker, "version", "--format", "{{.Server.Version}}"],
                                 capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"no docker engine answers ({exc}); {_HOW_TO}"
    if version.returncode != 0:
        return False, f"no docker engine answers ({version.stderr.strip()[-200:]}); {_HOW_TO}"
    inspect = subprocess.run([docker, "image", "inspect", "--format", "{{.Id}}", image],
                             capture_output=True, text=True, timeout=30)
    if inspect.returncode != 0:
        return False, (f"the image {image} is not present (no registry is needed: {_HOW_TO}, "
                       "or pass image= an image with python3)")
    return True, ""


class DockerSandbox(ForkingSandbox):
    """Programs in locked-down containers: a fork server per worker, or one container each.

    Args:
        limits: default :class:`Limits` (memory and processes also bound the container).
        image: an image with ``python3`` (default :data:`DEFAULT_IMAGE`).
        python: the interpreter inside the image.
        cpus: CPU quota per container.
        paths: folders *inside the image* appended to the program's ``sys.path``.
        reuse: ``auto``/``fork``: one container with a fork server per worker;
            ``fresh``: one container per program.
        max_programs: programs one fork server runs before it is replaced.
        hide: accepted for a common interface and unused: the container's file system is
            the image's, and no host folder is bound into it (but the fork server's
            read-only control-socket folder), so no host data file is there to hide.
    """

    name = "docker"
    fresh_cpu_visible = False  # the docker CLI's own CPU time says nothing about the program

    def __init__(self, limits: Limits | None = None, image: str | None = None,
                 python: str = "python3", cpus: float = 1.0, paths: list[str] | None = None,
                 reuse: str = "auto", max_programs: int = 1000, hide: list[str] | None = None):
        super().__init__(limits, python, paths, reuse, max_programs, hide)
        self.image = image or DEFAULT_IMAGE
        self.cpus = float(cpus)
        ok, reason = docker_available(self.image)
        if not ok:
            raise SandboxUnavailable(reason)
        self._docker = shutil.which("docker") or "docker"

    # ------------------------------------------------------------ containers
    def _run_args(self, limits: Limits, uid: int, name: str, extra_memory_mb: int = 0) -> list[str]:
        """``docker run`` and its isolation options, up to (and with) the image."""
        size = f"{int(limits.file_size_mb)}m"
        memory = f"{int(limits.memory_mb) + extra_memory_mb}m"
        tmpfs = f"rw,nosuid,nodev,size={size},mode=1777,uid={uid},gid={uid}"
        return [
            self._docker, "run", "--rm", "--name", name, "--network", "none", "--read-only",
            "--ipc", "none", "--tmpfs", f"/tmp:{tmpfs}", "--tmpfs", f"/var/tmp:{tmpfs}",
            "--tmpfs", f"/dev/shm:{tmpfs}", "--memory", memory, "--memory-swap", memory,
            "--pids-limit", str(int(limits.processes) + 8), "--cpus", f"{self.cpus:g}",
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--user", f"{uid}:{uid}",
            "--workdir", "/tmp", "--env", "HOME=/tmp", "--env", "LANG=C.UTF-8",
            "--log-driver", "none", "--label", "corrgrpo.sandbox=1",
        ]

    def _remove(self, name: str) -> None:
        subprocess.run([self._docker, "rm", "-f", name], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60, check=False)

    # ------------------------------------------------------------ fork servers
    def _fork_unsupported(self) -> str:
        return ""

    def _start_server(self, limits: Limits) -> ForkServer:
        uid = sandbox_uid()
        name = f"corrgrpo-fork-{new_token()[:16]}"
        folder = tempfile.mkdtemp(prefix="corrgrpo-docker-")
        os.chown(folder, uid, uid)  # only the container's uid (and root) can reach the socket
        os.chmod(folder, 0o700)
        config = {"workdir": SANDBOX_CWD}
        args = [*self._run_args(limits, uid, name, _SERVER_MB),
                "--volume", f"{folder}:/corrgrpo-ctl:ro", self.image]

        server = server_command(self.python, config, 0)
        server[-2] = "/corrgrpo-ctl/ctl"  # the control socket, as the container sees it

        def command(_where: int | str) -> list[str]:
            return [*args, *server]

        def cleanup() -> None:
            self._remove(name)
            shutil.rmtree(folder, ignore_errors=True)

        try:
            return ForkServer(command, self.name, start_timeout=120.0,
                              listen=os.path.join(folder, "ctl"), on_close=cleanup)
        except BaseException:
            cleanup()
            raise

    # ------------------------------------------------------------ runs
    def run(self, program: str, limits: Limits | None = None) -> RunResult:
        limits = limits or self.limits
        if self.forking:
            result = self._run_forked(program, limits)
            if result is not None:
                return result
        name = f"corrgrpo-run-{new_token()[:16]}"
        command = [*self._run_args(limits, sandbox_uid(), name), "--interactive", self.image,
                   *runner_command(self.python)]
        header = self._header(new_token(), limits, cwd=SANDBOX_CWD, make_cwd=True)
        result = self._run_command(command, header, program, limits, status_pipe=False)
        if result.status in ("timeout", "output_limit", "sandbox_error") \
                or result.status.startswith("killed"):
            self._remove(name)  # the CLI was killed or lost: the container may still run
        return result
