"""A rich progress bar showing the key numbers of each training step."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Column

__all__ = ["TrainProgress"]


class TrainProgress:
    """Context manager; ``update(step, record)`` advances the bar and shows rewards and the
    mean seconds per step of this run."""

    def __init__(self, total: int, enabled: bool = True, start: int = 0):
        self.enabled = enabled
        # On a narrow terminal the numbers wrap onto the next line(s): none is cut, and the bar
        # and the step count keep their width. The numbers are plain text: a reward's name is
        # the env's, never markup.
        fixed = Column(no_wrap=True)
        self._progress = Progress(
            TextColumn("[bold]train", table_column=fixed),
            BarColumn(bar_width=16, table_column=Column(no_wrap=True, width=16)),
            MofNCompleteColumn(table_column=fixed),
            TimeRemainingColumn(table_column=fixed),
            TextColumn("{task.fields[info]}", markup=False, table_column=Column(overflow="fold", ratio=1)),
            expand=True,
            console=Console(stderr=True),
            disable=not enabled,
        )
        self._task = self._progress.add_task("train", total=total, completed=start, info="")
        self._seconds, self._timed = 0.0, 0  # this run's step times (a resumed run's own steps)

    def __enter__(self) -> TrainProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._progress.__exit__(*exc)

    @property
    def seconds_per_step(self) -> float:
        """The mean ``time/step`` of the steps shown so far (0 before the first): one slow step
        (the first, a checkpoint's) moves it little, where the last step's time would jump."""
        return self._seconds / self._timed if self._timed else 0.0

    def numbers(self, record: dict[str, Any]) -> str:
        """The step's numbers as shown: the weighted reward, CorrGRPO's median multiplier and
        the mean step time first (they fit beside the bar at 80 columns), then each component."""
        parts = [f"R={record.get('reward/weighted/mean', float('nan')):.3f}"]
        if "c_q/median" in record:
            parts.append(f"c_q={record['c_q/median']:.2f}")
        parts.append(f"{self.seconds_per_step:.2f}s/step")
        for key, value in record.items():
            if key.startswith("reward/") and key.endswith("/mean") and "weighted" not in key:
                parts.append(f"{key[7:-5]}={value:.2f}")
        return " ".join(parts)

    def update(self, step: int, record: dict[str, Any]) -> None:
        """Advance to ``step`` and show ``record``'s numbers (its ``time/step`` joins the mean)."""
        if isinstance(record.get("time/step"), (int, float)):
            self._seconds += float(record["time/step"])
            self._timed += 1
        self._progress.update(self._task, completed=step, info=self.numbers(record))
