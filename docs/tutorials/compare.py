"""Each estimator's final rewards over seeds: mean and spread of the last 5 steps' means."""

import json
import statistics
from pathlib import Path

KEYS = ["reward/weighted/mean", "reward/digits/mean", "reward/has_a/mean", "reward/word_with_a/mean"]


def final(run: Path, key: str, last: int = 5) -> float:
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return statistics.fmean(s[key] for s in steps[-last:])


print(f"{'estimator':10s}" + "".join(f"{k.split('/')[1]:>14s}" for k in KEYS))
for estimator in ("grpo", "corrgrpo", "gdpo"):
    runs = sorted(Path("runs").glob(f"quickstart-{estimator}-s*"))
    cells = []
    for key in KEYS:
        values = [final(run, key) for run in runs]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        cells.append(f"{statistics.fmean(values):8.2f} ±{spread:4.2f}")
    print(f"{estimator:10s}" + "".join(f"{c:>14s}" for c in cells))
