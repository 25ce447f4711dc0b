"""Real OpenEnv servers on localhost for the tests: ``corrgrpo serve`` or any ASGI app under uvicorn."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[1]


def die_with_parent() -> None:
    """In a child, before it runs: the kernel sends it SIGTERM when the process that started it
    ends, however it ends, so a killed test run (or pytest worker) leaves no server behind (Linux's
    ``PR_SET_PDEATHSIG``; elsewhere nothing). The signal follows the *thread* that started the
    child, so only a server started from the main thread is bound (one restarted by a fault
    injector's thread would end with that thread)."""
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class Server:
    """One server process; ``url`` is its ``openenv://`` address, ``base`` its HTTP one.

    ``env`` adds variables to the server's environment (a value of ``None`` removes one).
    """

    def __init__(
        self, argv: list[str], port: int, log: Path, env: dict[str, str | None] | None = None, cwd: Path | None = None
    ):
        self.argv, self.port, self.log, self.cwd = argv, port, log, cwd or ROOT
        self.extra_env = env or {}
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"openenv://127.0.0.1:{self.port}"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> Server:
        """Start the process without waiting for it to answer."""
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               "OMP_NUM_THREADS": "1", **self.extra_env}
        env = {k: v for k, v in env.items() if v is not None}  # None in ``env`` unsets a variable
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         preexec_fn=die_with_parent if _main_thread() else None)
        return self

    def start(self, timeout: float = 120.0) -> Server:
        """Start the process (unless launched) and wait until ``/health`` answers."""
        if self.proc is None or self.proc.poll() is not None:
            self.launch()
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.argv} exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.base}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server {self.argv} did not answer /health in {timeout}s:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        """Kill the process at once (a crashed machine)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def pause(self) -> None:
        """Stop the process without closing its sockets (a hung server)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def corrgrpo_serve(env: str, *env_args: str, tmp: Path, port: int | None = None, options: tuple[str, ...] = ()) -> Server:
    """``corrgrpo serve ENV ARGS`` on a free port (not started)."""
    port = port or free_port()
    argv = [sys.executable, "-m", "corrgrpo.trainer.cli", "serve", env, *env_args, "--port", str(port), *options]
    return Server(argv, port, tmp / f"serve-{port}.log")


def uvicorn_app(app: str, tmp: Path, port: int | None = None, app_dir: Path | None = None) -> Server:
    """``uvicorn module:app`` on a free port (not started): a server none of corrgrpo's code runs."""
    port = port or free_port()
    argv = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    if app_dir is not None:
        argv += ["--app-dir", str(app_dir)]
    return Server(argv, port, tmp / f"uvicorn-{port}.log")
