"""Read a run's metrics.jsonl: one JSON object per step."""

import json
from pathlib import Path

run = Path("runs/quickstart-corrgrpo-s0")
steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
first, last = steps[0], steps[-1]
nan = float("nan")  # a diagnostic is missing at a step where no group's rewards varied
for key in ("reward/weighted/mean", "reward/digits/mean", "reward/has_a/mean", "c_q/median",
            "k_eff/mean", "cov_share/digits", "update_norm"):
    print(f"{key:22s} step {first['step']}: {first.get(key, nan):8.3f}   "
          f"step {last['step']}: {last.get(key, nan):8.3f}")
