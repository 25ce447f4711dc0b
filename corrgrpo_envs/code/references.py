"""Reference runtimes for the ``efficiency`` reward, measured once and cached.

A reference's time is the mean :func:`measured_seconds` (the CPU time the kernel
counted, read outside the program) of several runs of its program in the same
sandbox and harness the candidates run in. Results are cached
as one small JSON file per program under
``<cache>/<machine-hash>/<program-hash>.json``, where ``<cache>`` is
``$CORRGRPO_CODE_REFS`` or ``~/.cache/corrgrpo/code_refs``: a time measured on
one machine is never compared with a candidate's time on another.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import threading
from pathlib import Path

from corrgrpo_sandbox import Limits, RunResult, Sandbox
from corrgrpo_sandbox.cgroups import cpu_accounting

__all__ = ["ReferenceTimes", "default_cache_dir", "machine_hash", "measured_seconds", "timing_kind",
           "CACHE_ENV_VAR"]

CACHE_ENV_VAR = "CORRGRPO_CODE_REFS"


def default_cache_dir() -> Path:
    """``$CORRGRPO_CODE_REFS`` or ``~/.cache/corrgrpo/code_refs``."""
    env = os.environ.get(CACHE_ENV_VAR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "corrgrpo" / "code_refs"


def machine_hash(backend: str = "") -> str:
    """12 hex digits naming this machine (host, CPU model and count, Python) and backend."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    key = "|".join([platform.node(), platform.machine(), cpu, str(os.cpu_count()),
                    platform.python_version(), backend])
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def measured_seconds(result: RunResult) -> float | None:
    """A run's time: the CPU time the kernel counted in the control group of its processes;
    ``None`` where the sandbox has no such group (then efficiency is unavailable: the host's
    wall time or a rusage is a number the program can lower, with parallel processes or a
    child whose CPU time the kernel never adds to its parent's)."""
    return result.cpu_seconds


def timing_kind(sandbox: Sandbox) -> str:
    """What a measured time depends on besides the machine: backend, reuse mode, clock."""
    forking = bool(getattr(sandbox, "forking", False))
    clock = (cpu_accounting() or "none") if forking or sandbox.fresh_cpu_visible else "none"
    return f"{sandbox.name}:{'fork' if forking else 'fresh'}:{clock}:calls-v1"


class ReferenceTimes:
    """Measures and caches the runtime of reference programs.

    Args:
        sandbox: where references run (the same sandbox as the candidates).
        cache_dir: root of the cache (default :func:`default_cache_dir`).
        runs: how many runs are averaged.
    """

    def __init__(self, sandbox: Sandbox, cache_dir: str | Path | None = None, runs: int = 3):
        if runs < 1:
            raise ValueError(f"runs must be >= 1, got {runs}")
        self.sandbox = sandbox
        root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.folder = root / machine_hash(timing_kind(sandbox))
        self.runs = int(runs)
        self._memory: dict[str, dict] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    @staticmethod
    def key(program: str) -> str:
        return hashlib.sha256(program.encode("utf-8")).hexdigest()[:24]

    def cached(self, program: str) -> dict | None:
        """The cached record ``{"seconds", "passed", "runs", ...}`` or ``None``."""
        key = self.key(program)
        if key in self._memory:
            return self._memory[key]
        path = self.folder / f"{key}.json"
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        self._memory[key] = record
        return record

    def seconds(self, program: str, task_id: str = "", limits: Limits | None = None) -> float | None:
        """The reference's mean runtime, measured now if not cached; ``None`` if it fails its tests
        or its CPU time is unavailable here."""
        key = self.key(program)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # one measurement per program even when many threads ask at once
            record = self.cached(program)
            if record is None:
                record = self.measure(program, task_id, limits)
        return record["seconds"] if record["passed"] else None

    def measure(self, program: str, task_id: str = "", limits: Limits | None = None) -> dict:
        """Run the reference ``runs`` times, store and return its record."""
        times, passed = [], True
        for _ in range(self.runs):
            result = self.sandbox.run(program, limits)
            if not result.passed:
                passed = False
                break
            times.append(measured_seconds(result))
        timed = [t for t in times if t is not None]
        if passed and len(timed) < len(times):  # no CPU time here: nothing to cache
            return {"task_id": task_id, "passed": True, "runs": len(times), "seconds": None,
                    "backend": self.sandbox.name}
        record = {
            "task_id": task_id, "passed": passed, "runs": len(timed),
            "seconds": sum(timed) / len(timed) if timed else 0.0, "backend": self.sandbox.name,
        }
        self._store(self.key(program), record)
        return record

    def _store(self, key: str, record: dict) -> None:
        self._memory[key] = record
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(record, f)
            os.replace(tmp, self.folder / f"{key}.json")
        except OSError:
            pass  # a read-only cache only costs re-measuring
