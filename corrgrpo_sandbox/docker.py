"""The ``docker`` backend: programs in locked-down containers, through the Docker SDK for Python.

Needs the SDK (``pip install 'corrgrpo[docker]'``), a Docker engine and an image
with ``python3`` (default :data:`DEFAULT_IMAGE`, built offline from Debian
packages by ``bash scripts/docker_engine.sh``, which also installs and starts the
engine); no ``docker`` command is run. The engine is the one ``DOCKER_HOST`` names
(``unix://``, ``tcp://``; TLS through ``DOCKER_TLS_VERIFY`` and ``DOCKER_CERT_PATH``), or ``base_url=``: sandboxes can run on another machine,
since the host reaches a container only through the engine's API.

Every container runs with no network, a read-only root, size-capped tmpfs
``/tmp``, ``/var/tmp`` and ``/dev/shm``, a private IPC namespace, memory (no
swap), pids and CPU limits, every capability dropped, ``no-new-privileges``,
the engine's seccomp profile with the denials of
:mod:`~corrgrpo_sandbox.syscall_filter` stacked on it, and as a fresh
unprivileged uid (:func:`~corrgrpo_sandbox.hostuser.sandbox_uid`:
containers share no ``RLIMIT_NPROC`` count and cannot signal one another).
Docker keeps ``/proc/sys`` read-only and gives each container its own ``/dev``; the backend
masks ``/proc/locks`` besides the engine's own masked paths (:data:`MASKED_PATHS`).

The container's first process is the relay (:mod:`~corrgrpo_sandbox.docker_relay`),
which the host drives over the container's attach stream:

* ``reuse="auto"``/``"fork"``: one container per worker; the relay starts a fork
  server (:mod:`corrgrpo_sandbox.forkserver`) and hands it each program's
  pipes. Docker's seccomp profile and the dropped capabilities leave no namespaces
  to a server, so after each program it puts the writable folders back as they
  were (files, modes, extended attributes, modification times), checks System V
  IPC and ``/dev/mqueue`` and its own priorities (nice, I/O), scheduling, limits and
  tracer (programs share its uid, so they can change those: it puts back what needs
  no capability, and quits otherwise), and the relay
  checks that no socket outlived the program; anything that differs ends the
  container and a new one replaces it.
* ``reuse="fresh"``: one container per program (slow: the engine's start-up, some
  0.3-1 s, per program).

CPU time (``cpu_seconds``) comes from the container's control group, which holds
every process in the container: work moved into children, daemons or threads is
counted whatever they do with signals.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from corrgrpo_sandbox.base import runner_command
from corrgrpo_sandbox.docker_relay import ContainerSession, relay_command
from corrgrpo_sandbox.forkserver import ForkingSandbox
from corrgrpo_sandbox.hostuser import sandbox_uid
from corrgrpo_sandbox.runner import PRELOAD_MODULES
from corrgrpo_sandbox.syscall_filter import (
    canonical_machine,
    denial_filter,
    runner_syscall_numbers,
)
from corrgrpo_sandbox.types import (
    MINIMAL_ENV,
    SANDBOX_CWD,
    Limits,
    RunResult,
    SandboxUnavailable,
    new_token,
)

__all__ = ["DEFAULT_IMAGE", "MASKED_PATHS", "DockerEngineError", "DockerSandbox", "docker_available",
           "engine_address"]

#: The image ``scripts/docker_engine.sh`` builds (Debian bookworm, python3 3.11); override
#: with ``CORRGRPO_DOCKER_IMAGE`` or ``image=``.
DEFAULT_IMAGE = os.environ.get("CORRGRPO_DOCKER_IMAGE", "corrgrpo/python:bookworm")

#: Memory a container needs on top of the program's limit: the relay, and the fork server.
_RELAY_MB = 32
_SERVER_MB = 64

#: What of ``/proc`` and ``/sys`` each container sees as an empty file or folder: the engine's
#: own default list (Docker 20.10 to 27; the engine takes a given list in its place), and
#: ``/proc/locks``, which lists every open-file-description lock of the host and of every
#: other container.
MASKED_PATHS = ("/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
                "/sys/firmware", "/sys/devices/virtual/powercap", "/proc/locks")

#: Label on every container this backend starts (``corrgrpo.owner`` names the sandbox).
LABEL = "corrgrpo.sandbox"

_HOW_TO = "run `bash scripts/docker_engine.sh` (installs docker.io, starts dockerd, builds the image)"
_CHECKED: dict[tuple[str, str], tuple[bool, str]] = {}
_CHECK_LOCK = threading.Lock()


class DockerEngineError(SandboxUnavailable):
    """The Docker engine refused a request or could not be reached.

    Attributes:
        engine: the engine's address.
        explanation: the engine's own message (or the SDK's, when no engine answered).
        status_code: the HTTP status of the engine's answer, ``None`` without one.
    """

    def __init__(self, engine: str, explanation: str, status_code: int | None = None):
        self.engine = engine
        self.explanation = explanation
        self.status_code = status_code
        code = f" ({status_code})" if status_code else ""
        super().__init__(f"docker engine {engine}{code}: {explanation}")


def engine_address(base_url: str | None = None) -> str:
    """The engine a sandbox talks to: ``base_url``, else ``DOCKER_HOST``, else the local socket."""
    return base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def _engine_error(engine: str, exc: BaseException) -> DockerEngineError:
    """``exc`` (from the SDK, or any other) as a :class:`DockerEngineError` with the engine's
    message."""
    if isinstance(exc, DockerEngineError):
        return exc
    explanation = getattr(exc, "explanation", None) or str(exc) or type(exc).__name__
    response = getattr(exc, "response", None)
    return DockerEngineError(engine, str(explanation), getattr(response, "status_code", None))


def _client(base_url: str | None, timeout: float = 120):
    """A ``docker.DockerClient`` for the engine (``DOCKER_HOST`` and friends when no
    ``base_url``) whose requests wait at most ``timeout`` seconds; raises
    :class:`SandboxUnavailable` with what to do."""
    try:
        import docker
    except ImportError as exc:
        raise SandboxUnavailable(
            "the Docker SDK for Python is not installed: pip install 'corrgrpo[docker]'") from exc
    try:
        if base_url:
            return docker.DockerClient(base_url=base_url, timeout=timeout, max_pool_size=64)
        return docker.from_env(timeout=timeout, max_pool_size=64)
    except docker.errors.DockerException as exc:
        raise _engine_error(engine_address(base_url), exc) from exc


def docker_available(image: str | None = None, base_url: str | None = None) -> tuple[bool, str]:
    """``(True, "")`` when the SDK is installed, the engine answers and ``image`` is present,
    else ``(False, reason)`` with the engine's message and what to do (checked once per engine,
    image and process)."""
    image = image or DEFAULT_IMAGE
    key = (engine_address(base_url), image)
    with _CHECK_LOCK:
        if key not in _CHECKED:
            _CHECKED[key] = _check(image, base_url)
        return _CHECKED[key]


def _check(image: str, base_url: str | None) -> tuple[bool, str]:
    engine = engine_address(base_url)
    try:
        client = _client(base_url, timeout=15)  # (an engine that does not answer: soon said)
    except SandboxUnavailable as exc:
        return False, f"{exc}; {_HOW_TO}"
    import docker

    try:
        client.ping()
    except docker.errors.DockerException as exc:
        return False, f"no docker engine answers at {engine} ({_engine_error(engine, exc)}); {_HOW_TO}"
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound as exc:
        return False, (f"the image {image} is not present ({_engine_error(engine, exc)}; no "
                       f"registry is needed: {_HOW_TO}, or pass image= an image with python3)")
    except docker.errors.DockerException as exc:
        return False, f"{_engine_error(engine, exc)}; {_HOW_TO}"
    finally:
        client.close()
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
            the image's and no host folder is bound into it, so no host data file is there.
        base_url: the engine (``unix:///var/run/docker.sock``, ``tcp://host:2375``...);
            default: ``DOCKER_HOST`` and the SDK's other environment variables.
        seccomp_profile: a seccomp profile (JSON file) to give the engine instead of its
            default; the backend's own denials stack on it either way.

    Raises:
        SandboxUnavailable: no SDK, no engine or no image (a :class:`DockerEngineError`
            with the engine's message when the engine refused).
    """

    name = "docker"
    fresh_cpu_visible = True  # both modes: the container's control group

    def __init__(self, limits: Limits | None = None, image: str | None = None,
                 python: str = "python3", cpus: float = 1.0, paths: list[str] | None = None,
                 reuse: str = "auto", max_programs: int = 1000, hide: list[str] | None = None,
                 base_url: str | None = None, seccomp_profile: str | None = None):
        super().__init__(limits, python, paths, reuse, max_programs, hide)
        self.image = image or DEFAULT_IMAGE
        self.cpus = float(cpus)
        self.base_url = base_url
        self.engine = engine_address(base_url)
        self.seccomp_profile = seccomp_profile
        self._seccomp_json = None
        if seccomp_profile is not None:
            with open(seccomp_profile, encoding="utf-8") as f:
                self._seccomp_json = f.read()
        ok, reason = docker_available(self.image, base_url)
        if not ok:
            raise SandboxUnavailable(reason)
        self.owner = new_token()[:16]  # labels this sandbox's containers
        self._client_obj = None
        self._client_lock = threading.Lock()
        client = self._client()
        try:
            self.architecture = client.info()["Architecture"]
            self._filter = denial_filter(self.architecture).hex()
            self._syscalls = runner_syscall_numbers(self.architecture)
        except ValueError as exc:
            raise SandboxUnavailable(f"docker engine {self.engine}: {exc}") from exc
        except Exception as exc:
            raise _engine_error(self.engine, exc) from exc

    def _header(self, token: str, limits: Limits, **extra: object) -> dict:
        # The system-call numbers the runner uses are the engine's machine's, not this host's;
        # the runner's own filter (built by libseccomp for this host) only where they are the
        # same machine: elsewhere the relay's filter, built for the engine's, is the one.
        header = {**super()._header(token, limits, **extra), "syscalls": self._syscalls}
        if canonical_machine(self.architecture) != canonical_machine(os.uname().machine):
            header["seccomp"] = None
        return header

    def _client(self):
        with self._client_lock:
            if self._client_obj is None:
                self._client_obj = _client(self.base_url)
            return self._client_obj

    def _error(self, exc: BaseException) -> DockerEngineError:
        return _engine_error(self.engine, exc)

    # ------------------------------------------------------------ containers
    def _create_args(self, limits: Limits, relay: dict, extra_memory_mb: int) -> dict[str, Any]:
        """``client.api.create_container`` keyword arguments: the relay and every isolation
        option (the host config built by the SDK, with :data:`MASKED_PATHS`)."""
        from docker.types import LogConfig

        uid = sandbox_uid()
        memory = f"{int(limits.memory_mb) + extra_memory_mb}m"
        tmpfs = f"rw,nosuid,nodev,size={int(limits.file_size_mb)}m,mode=1777,uid={uid},gid={uid}"
        security = ["no-new-privileges"]
        if self._seccomp_json is not None:
            security.append(f"seccomp={self._seccomp_json}")
        config = {"filter": self._filter, **relay}
        host_config = self._client().api.create_host_config(
            network_mode="none", read_only=True, ipc_mode="none",
            tmpfs={"/tmp": tmpfs, "/var/tmp": tmpfs, "/dev/shm": tmpfs},
            mem_limit=memory, memswap_limit=memory,
            pids_limit=int(limits.processes) + 8, nano_cpus=int(self.cpus * 1e9),
            cap_drop=["ALL"], security_opt=security,
            log_config=LogConfig(type=LogConfig.types.NONE), auto_remove=True)
        # (the SDK has no argument for it; the engine takes the list in place of its default)
        host_config["MaskedPaths"] = list(MASKED_PATHS)
        return {
            "image": self.image,
            "command": relay_command(self.python, config),
            "user": f"{uid}:{uid}", "working_dir": "/tmp", "environment": dict(MINIMAL_ENV),
            "labels": {LABEL: "1", "corrgrpo.owner": self.owner},
            # attached (detach=False) with stdin open: the SDK sets StdinOnce, so the container
            # sees the end of its stdin once the host's attach stream closes
            "detach": False, "stdin_open": True, "host_config": host_config,
        }

    def containers(self) -> list[str]:
        """The ids of this sandbox's containers the engine still has (running or not)."""
        try:  # (one listing, no inspection of each: fresh containers vanish as they end)
            found = self._client().api.containers(
                all=True, quiet=True, filters={"label": f"corrgrpo.owner={self.owner}"})
            return [entry["Id"] for entry in found]
        except Exception as exc:
            raise self._error(exc) from exc

    # ------------------------------------------------------------ fork servers
    def _fork_unsupported(self) -> str:
        return ""

    def _start_server(self, limits: Limits) -> ContainerSession:
        relay = {"mode": "server", "start_timeout": 60,
                 "server": {"preload": PRELOAD_MODULES, "workdir": SANDBOX_CWD,
                            "syscalls": self._syscalls}}
        return ContainerSession(self._client(), self._create_args(limits, relay,
                                                                   _RELAY_MB + _SERVER_MB),
                                self.name, 120.0, self._error, reuse="fork")

    # ------------------------------------------------------------ runs
    def run(self, program: str, limits: Limits | None = None) -> RunResult:
        limits = limits or self.limits
        if self.forking:
            result = self._run_forked(program, limits)
            if result is not None:
                return result
        header = self._header(new_token(), limits, cwd=SANDBOX_CWD, make_cwd=True)
        relay = {"mode": "runner", "argv": runner_command(self.python)}
        try:
            session = ContainerSession(self._client(), self._create_args(limits, relay, _RELAY_MB),
                                       self.name, 120.0, self._error, reuse="fresh")
        except SandboxUnavailable as exc:
            return RunResult("sandbox_error", stderr=str(exc), backend=self.name,
                             extra={"reuse": "fresh"})
        try:
            result = session.run(header, program, limits)
        finally:
            session.close()
        if result is None:
            return RunResult("sandbox_error", stderr=f"the container ended before its program "
                             f"started{session.relay_stderr()}", backend=self.name,
                             extra={"reuse": "fresh"})
        return result

    def close(self) -> None:
        """Remove the fork servers' containers and drop the engine connections (a later run
        starts new ones)."""
        super().close()
        with self._client_lock:
            client, self._client_obj = self._client_obj, None
        if client is not None:
            client.close()

    _lock_names = (*ForkingSandbox._lock_names, "_client_lock")

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_client_obj"] = None  # a connection to the engine is not state
        return state
