"""Where a run's numbers go: ``metrics.jsonl``, TensorBoard and ``samples.jsonl``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["RunLogger", "read_metrics"]


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


class RunLogger:
    """Appends one JSON object per step to ``metrics.jsonl``; scalars also go to TensorBoard."""

    def __init__(self, output_dir: str | Path, tensorboard: bool = True, enabled: bool = True):
        self.dir = Path(output_dir)
        self.enabled = enabled
        self._tb = None
        if not enabled:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(self.dir / "tensorboard"))
            except ImportError:  # tensorboard is optional at run time
                self._tb = None

    def truncate_after(self, step: int) -> None:
        """Drop records of steps > ``step`` (a resumed run rewrites them)."""
        path = self.dir / "metrics.jsonl"
        if not self.enabled or not path.exists():
            return
        kept = [r for r in read_metrics(self.dir) if r["step"] <= step]
        with open(path, "w", encoding="utf-8") as f:
            for r in kept:
                f.write(json.dumps(r) + "\n")

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(_jsonable(record)) + "\n")
        if self._tb is not None:
            step = int(record["step"])
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
                    if math.isfinite(float(value)):
                        self._tb.add_scalar(key, float(value), step)
            self._tb.flush()

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        if not self.enabled or not samples:
            return
        with open(self.dir / "samples.jsonl", "a", encoding="utf-8") as f:
            for s in samples:
                f.write(json.dumps(_jsonable({"step": step, **s}), ensure_ascii=False) + "\n")

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl``, in order."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {run_dir} a run folder?")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
