"""The code domain's evaluation metrics: pass@1 per data set, the efficiency share, mean rewards."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from corrgrpo_envs.code.rewards import REWARD_NAMES
from corrgrpo_envs.metrics import EpisodeRecord

__all__ = ["code_metrics"]


def code_metrics(records: Iterable[EpisodeRecord]) -> dict[str, float]:
    """pass@1 per data set (``pass@1/<dataset>``) and their mean (``pass@1``), the
    efficiency share, and each reward's mean (``mean/<name>``).

    ``efficiency_share`` is the share of correct answers that ran faster than
    their reference, among those whose CPU time was counted; ``efficiency_timed`` is
    the share of correct answers whose CPU time was counted (0 where the sandbox has
    no control group to count it: efficiency is then unavailable, not 0). Records are
    ``{"task_id", "reward_components", "info"}``; ``info["dataset"]`` names the data
    set (default ``"code"``).
    """
    records = list(records)
    if not records:
        return {}
    by_dataset: dict[str, list[float]] = defaultdict(list)
    sums: dict[str, float] = defaultdict(float)
    correct = faster = timed = 0
    for record in records:
        comps = record.get("reward_components", {})
        info = record.get("info", {}) or {}
        ok = float(comps.get("correct", 0.0))
        by_dataset[str(info.get("dataset", "code"))].append(ok)
        for name in REWARD_NAMES:
            sums[name] += float(comps.get(name, 0.0))
        if ok >= 1.0:
            correct += 1
            if str(info.get("efficiency", "")).startswith("unavailable"):
                continue
            timed += 1
            faster += bool(info.get("faster_than_reference", False))
    out = {f"pass@1/{name}": sum(v) / len(v) for name, v in sorted(by_dataset.items())}
    out["pass@1"] = sum(out.values()) / len(out)
    out["efficiency_share"] = faster / timed if timed else 0.0
    out["efficiency_timed"] = timed / correct if correct else 0.0
    for name in REWARD_NAMES:
        out[f"mean/{name}"] = sums[name] / len(records)
    return out
