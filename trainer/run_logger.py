"""Where a run's numbers go: ``metrics.jsonl``, ``samples.jsonl`` and the experiment trackers.

The trackers (TensorBoard, Weights & Biases, MLflow, Trackio, ...: ``train.report_to``) are
Accelerate's; :class:`RunLogger` hands each record's finite scalars to a ``send`` function
(``Accelerator.log``) after writing it to ``metrics.jsonl``, which is always written.

``metrics.jsonl`` holds one JSON object per step, steps increasing. A run killed
while appending may leave a torn last line: readers drop it with a warning, and
the logger rewrites the file without it before appending again.

A run says how it continues its folder before it starts its trackers (which open files there):
a fresh start calls :meth:`RunLogger.start_fresh`, which moves an earlier run's
``metrics.jsonl``, ``samples.jsonl`` and ``tensorboard/`` aside to ``<name>.old-<UTC time>``
(said in a warning) rather than mixing them with the new ones; a resumed run calls
:meth:`RunLogger.truncate_after`, which keeps the records (metrics and samples) up to the
checkpoint's step, and then appends after them. A logger told neither decides at its first
record: one at a step not after the file's last step is a fresh start.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["RunLogger", "TrackerStartError", "read_metrics", "scalars"]

log = logging.getLogger(__name__)

METRICS = "metrics.jsonl"
SAMPLES = "samples.jsonl"
TENSORBOARD = "tensorboard"


class TrackerStartError(RuntimeError):
    """A tracker of ``train.report_to`` failed to start; the message is one line naming it."""

    @classmethod
    def of(cls, exc: BaseException, trackers: list[str]) -> TrackerStartError:
        """The error for ``exc``, raised while starting ``trackers``: the tracker whose package
        raised it (all of them when that is not known) and the first line of its message."""
        package = type(exc).__module__.split(".")[0]
        named = [t for t in trackers if t == package] or trackers
        first = (str(exc).strip().splitlines() or [""])[0]
        return cls(
            f"train.report_to: {', '.join(named)} failed to start: {type(exc).__name__}: {first} "
            "(fix its settings, or drop it from train.report_to)"
        )


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _read_records(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """The records of a JSON-lines file and whether it is clean (no torn last line, ends in a newline).

    A last line that does not parse is dropped with a warning; any other bad line
    raises ``ValueError`` naming the file and line.
    """
    data = path.read_bytes()
    lines = data.split(b"\n")
    numbered = [(i + 1, raw) for i, raw in enumerate(lines) if raw.strip()]
    records: list[dict[str, Any]] = []
    clean = not data or data.endswith(b"\n")
    for k, (lineno, raw) in enumerate(numbered):
        try:
            record = json.loads(raw.decode("utf-8", errors="replace"))
            if not isinstance(record, dict):
                raise ValueError(f"expected a JSON object, got {type(record).__name__}")
        except ValueError as exc:
            if k == len(numbered) - 1:
                log.warning("%s: dropping the torn last line %d (%s)", path, lineno, exc)
                return records, False
            raise ValueError(f"{path}:{lineno}: not a JSON object record ({exc})") from None
        records.append(record)
    return records, clean


def _write_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace ``path`` with ``records``, atomically (temporary file, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a record, but its step (what a tracker plots)."""
    return {
        key: float(value) for key, value in record.items()
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
        and math.isfinite(float(value))
    }


class RunLogger:
    """Appends one JSON object per step to ``metrics.jsonl``; its scalars also go to ``send``.

    Args:
        output_dir: the run folder.
        enabled: whether this process writes (the main process).
        send: ``send(scalars, step)`` after each record, e.g. ``Accelerator.log``; ``None``: none.
            A public attribute: a run sets it once it has started its trackers, which it does
            after deciding how it continues the folder (:meth:`truncate_after`, :meth:`start_fresh`).
    """

    def __init__(self, output_dir: str | Path, enabled: bool = True,
                 send: Callable[[dict[str, float], int], None] | None = None):
        self.dir = Path(output_dir)
        self.enabled = enabled
        self.send = send
        self._started = False  # whether this run has decided how it continues the folder
        if enabled:
            self.dir.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------ starting
    def truncate_after(self, step: int) -> None:
        """Keep the records of steps <= ``step`` in ``metrics.jsonl`` and ``samples.jsonl``
        (a resumed run rewrites the later ones)."""
        self._started = True
        if not self.enabled:
            return
        for name in (METRICS, SAMPLES):
            path = self.dir / name
            if not path.exists():
                continue
            records, clean = _read_records(path)
            kept = [r for r in records if not isinstance(r.get("step"), (int, float)) or r["step"] <= step]
            if len(kept) != len(records) or not clean:
                _write_records(path, kept)
            if len(kept) != len(records):
                log.warning("%s: resuming after step %d, dropped %d later records", path, step, len(records) - len(kept))

    def start_fresh(self) -> list[Path]:
        """Move an earlier run's metrics, samples and TensorBoard folder aside; returns where they went."""
        self._started = True
        if not self.enabled:
            return []
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        moved = []
        for name in (METRICS, SAMPLES, TENSORBOARD):
            src = self.dir / name
            if not src.exists():
                continue
            dst = self.dir / f"{name}.old-{stamp}"
            n = 1
            while dst.exists():
                n += 1
                dst = self.dir / f"{name}.old-{stamp}-{n}"
            os.replace(src, dst)
            moved.append(dst)
        if moved:
            log.warning(
                "%s: a fresh run in a folder with an earlier run's logs: moved them aside to %s",
                self.dir, ", ".join(p.name for p in moved),
            )
        return moved

    def _begin(self, step: int) -> None:
        """Before the first write: a fresh start moves old logs aside, a torn file is repaired."""
        if self._started:
            return
        self._started = True
        path = self.dir / METRICS
        if not path.exists():
            return
        records, clean = _read_records(path)
        steps = [r["step"] for r in records if isinstance(r.get("step"), (int, float))]
        if steps and step <= max(steps):
            self.start_fresh()
        elif not clean:
            _write_records(path, records)

    # ------------------------------------------------------------- writing
    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        step = int(record["step"])
        self._begin(step)
        with open(self.dir / METRICS, "a", encoding="utf-8") as f:
            f.write(json.dumps(_jsonable(record)) + "\n")
        if self.send is not None:
            self.send(scalars(record), step)

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        if not self.enabled or not samples:
            return
        self._begin(step)
        with open(self.dir / SAMPLES, "a", encoding="utf-8") as f:
            for s in samples:
                f.write(json.dumps(_jsonable({"step": step, **s}), ensure_ascii=False) + "\n")

    def close(self) -> None:
        """Nothing to release: each record is appended and closed as it is written."""


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl``, in order (a torn last line is dropped with a warning)."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a run folder?")
    return _read_records(path)[0]
