"""The ``docker`` backend: a warm pool of locked-down containers.

Needs the ``docker`` Python SDK (extra ``corrgrpo[docker]``) and a reachable
engine. Each container runs ``sleep infinity`` with no network, a read-only
root, a size-capped ``/tmp`` tmpfs, memory, pids and CPU limits, every
capability dropped and ``no-new-privileges``, as user 65534. A program runs as
one ``docker exec`` of ``python -I -S`` under ``timeout -s KILL``; containers
are reused, one program at a time each.
"""

from __future__ import annotations

import base64
import queue
import threading
import time

from corrgrpo_envs.sandbox.base import (
    SANDBOX_CWD,
    Limits,
    RunResult,
    Sandbox,
    SandboxUnavailable,
    _parse_status,
    _split_status_from_stderr,
    new_token,
)
from corrgrpo_envs.sandbox.calls import channel_text
from corrgrpo_envs.sandbox.runner import RUNNER_SOURCE

__all__ = ["DockerSandbox", "docker_available"]

# Inside the container the program arrives in an environment variable (exec has no stdin here).
_LOADER = (
    "import os,sys,io,base64;"
    "d=base64.b64decode(os.environ.pop('CORRGRPO_PAYLOAD'));"
    "sys.stdin=io.TextIOWrapper(io.BytesIO(d));"
    "exec(compile(base64.b64decode(os.environ.pop('CORRGRPO_RUNNER')).decode(),'<runner>','exec'))"
)


def docker_available() -> tuple[bool, str]:
    """``(True, "")`` when the SDK is installed and an engine answers, else ``(False, reason)``."""
    try:
        import docker
    except ImportError:
        return False, "the docker SDK is not installed (pip install 'corrgrpo[docker]')"
    try:
        client = docker.from_env(timeout=5)
        client.ping()
    except Exception as exc:  # the SDK raises many kinds; all mean "no engine"
        return False, f"no docker engine reachable ({type(exc).__name__}: {exc})"
    return True, ""


class DockerSandbox(Sandbox):
    """Programs run by ``docker exec`` in a pool of warm, locked-down containers.

    Args:
        limits: default :class:`Limits` (memory and pids become container limits).
        image: an image with ``python3`` and coreutils' ``timeout``.
        containers: how many warm containers to keep (programs in flight at once).
        python: the interpreter inside the image.
        cpus: CPU quota per container.
    """

    name = "docker"

    def __init__(self, limits: Limits | None = None, image: str = "python:3.11-slim",
                 containers: int = 2, python: str = "python3", cpus: float = 1.0,
                 paths: list[str] | None = None):
        super().__init__(limits, python, paths)
        ok, reason = docker_available()
        if not ok:
            raise SandboxUnavailable(reason)
        import docker

        self._client = docker.from_env()
        self.image = image
        self.cpus = cpus
        self._free: queue.Queue = queue.Queue()
        self._all: list = []
        self._lock = threading.Lock()
        for _ in range(max(1, int(containers))):
            self._free.put(self._start_container())

    def _start_container(self):
        limits = self.limits
        container = self._client.containers.run(
            self.image, ["sleep", "infinity"], detach=True, auto_remove=True,
            network_disabled=True, read_only=True, user="65534:65534",
            mem_limit=f"{limits.memory_mb}m", memswap_limit=f"{limits.memory_mb}m",
            pids_limit=limits.processes, nano_cpus=int(self.cpus * 1e9),
            cap_drop=["ALL"], security_opt=["no-new-privileges"],
            tmpfs={"/tmp": f"size={limits.file_size_mb}m,mode=1777"}, working_dir="/tmp",
        )
        with self._lock:
            self._all.append(container)
        return container

    def run(self, program: str, limits: Limits | None = None) -> RunResult:
        limits = limits or self.limits
        token = new_token()
        header = self._header(token, limits, cwd=SANDBOX_CWD)
        payload = repr(header).encode() + b"\n" + program.encode("utf-8", "replace")
        container = self._free.get()
        start = time.perf_counter()
        try:
            code, (out, err) = container.exec_run(
                ["timeout", "-s", "KILL", str(limits.timeout), self.python, "-I", "-S", "-c", _LOADER],
                environment={
                    "CORRGRPO_PAYLOAD": base64.b64encode(payload).decode(),
                    "CORRGRPO_RUNNER": base64.b64encode(RUNNER_SOURCE.encode()).decode(),
                },
                demux=True, user="65534:65534",
            )
        except Exception as exc:
            self._free.put(container)
            return RunResult("sandbox_error", stderr=str(exc), backend=self.name)
        self._free.put(container)
        wall = time.perf_counter() - start
        out = (out or b"")[: limits.output_bytes].decode("utf-8", "replace")
        err = (err or b"").decode("utf-8", "replace")
        channel, err = _split_status_from_stderr(err, token)
        status, seconds = _parse_status(channel, token)
        status = status or "killed"
        if code == 137 and wall >= limits.timeout:
            status = "timeout"
        # No CPU time from outside here (cpu_seconds None): timing falls back to the wall time.
        return RunResult(status, out, err[: limits.output_bytes], seconds, wall, code, self.name,
                         channel=channel_text(channel, token))

    def close(self) -> None:
        with self._lock:
            containers, self._all = self._all, []
        for container in containers:
            try:
                container.remove(force=True)
            except Exception:
                pass
