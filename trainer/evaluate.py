"""Evaluating a policy on a domain's metrics (pass@1, all-exact accuracy, utility/ASR...).

Each task of the split is played once (greedy by default) and the per-episode
records go to the environment's own ``metrics`` function.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from rich.progress import Progress

from corrgrpo.agents.hf_policy import HFPolicy
from corrgrpo.agents.models import load_model
from corrgrpo.agents.policy import Policy, SamplingParams
from corrgrpo.trainer import setup
from corrgrpo.trainer.config import Config
from corrgrpo.trainer.rollout import play_episodes
from corrgrpo_envs.vector import GroupedVectorEnv

__all__ = ["evaluate", "play_tasks"]


def play_tasks(
    venv: GroupedVectorEnv,
    policy: Policy,
    task_ids: list[str],
    sampling: SamplingParams,
    max_turns: int,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Play each task once (``venv`` has group size 1); returns per-episode records.

    Tasks go ``venv.num_groups`` at a time through :func:`~corrgrpo.trainer.rollout.play_episodes`
    (the training loop's own rollout function); the last chunk is padded with repeats
    whose records are dropped.
    """
    size = venv.num_groups
    records: list[dict[str, Any]] = []
    with Progress(disable=not progress, transient=True) as bar:
        job = bar.add_task("eval", total=len(task_ids))
        for start in range(0, len(task_ids), size):
            chunk = task_ids[start : start + size]
            padded = chunk + [chunk[-1]] * (size - len(chunk))
            batch = play_episodes(venv, policy.act, padded, sampling, max_turns)
            for i, task_id in enumerate(chunk):
                comps = dict(zip(venv.reward_names, map(float, batch.rewards[i])))
                records.append(
                    {"task_id": task_id, "reward_components": comps, "info": batch.infos[i],
                     "text": batch.texts[i]}
                )
            bar.advance(job, len(chunk))
    return records


def _policy(cfg: Config, kind: str, checkpoint: str | Path | None, venv: GroupedVectorEnv) -> Policy:
    if kind == "reference":
        from corrgrpo.agents import ReferencePolicy

        return ReferencePolicy(venv)
    if kind == "random":
        from corrgrpo.agents import RandomPolicy

        return RandomPolicy(seed=cfg.train.seed)
    source = str(Path(checkpoint) / "model") if checkpoint else cfg.model.name_or_path
    if checkpoint and not Path(source).exists():
        source = str(checkpoint)
    kwargs: dict[str, Any] = {"dtype": getattr(torch, cfg.model.dtype)}
    if cfg.model.tokenizer_file and source == cfg.model.name_or_path:
        kwargs["tokenizer_file"] = cfg.model.tokenizer_file
    model, tokenizer = load_model(source, **kwargs)
    model.eval()
    return HFPolicy(model, tokenizer)


def evaluate(
    cfg: Config,
    checkpoint: str | Path | None = None,
    split: str = "eval",
    limit: int | None = None,
    greedy: bool = True,
    policy_kind: str = "model",
    batch_size: int = 16,
    progress: bool = True,
    task_ids: list[str] | None = None,
) -> dict[str, Any]:
    """Evaluate ``cfg``'s model (or ``checkpoint``) on a split; returns the metrics and records.

    ``task_ids`` (a subset of the split, e.g. a seeded sample) replaces the split's tasks
    in order; ``limit`` then keeps the first of them. The metrics are the environment's
    own: ``env.metrics(records)``.
    """
    size = max(1, min(batch_size, limit or len(task_ids or []) or batch_size))
    venv = setup.build_vector_env(cfg, num_groups=size, group_size=1, split=split)
    try:
        if task_ids is not None:
            unknown = sorted(set(task_ids) - set(venv.task_ids))
            if unknown:
                raise ValueError(f"task_ids: not in the {split} split: {', '.join(unknown[:5])}")
        task_ids = list(venv.task_ids if task_ids is None else task_ids)[: limit or None]
        policy = _policy(cfg, policy_kind, checkpoint, venv)
        t0 = time.perf_counter()
        torch.manual_seed(cfg.train.seed)
        with torch.no_grad():
            records = play_tasks(
                venv, policy, task_ids, setup.sampling_params(cfg, greedy=greedy),
                cfg.rollout.max_turns, progress,
            )
        seconds = time.perf_counter() - t0
        metrics = venv.call("metrics", records)
    finally:
        venv.close()
    return {
        "env": cfg.env.id,
        "split": split,
        "policy": policy_kind,
        "checkpoint": str(checkpoint) if checkpoint else None,
        "model": cfg.model.name_or_path,
        "tasks": len(task_ids),
        "greedy": greedy,
        "seconds": seconds,
        "metrics": metrics,
        "records": records,
    }


def non_finite(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, value)`` of every NaN or infinity in a JSON-like value (numpy scalars included)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from non_finite(v, f"{path}/{k}" if path else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from non_finite(v, f"{path}/{i}")
    elif not isinstance(value, (bool, str, type(None))):
        try:
            if not math.isfinite(float(value)):  # type: ignore[arg-type]
                yield path, value
        except (TypeError, ValueError):
            pass


def write_evaluation(result: dict[str, Any], out: str | Path) -> Path:
    """Write :func:`evaluate`'s result as JSON to ``out``.

    ValueError (nothing written) for a NaN or infinite value: JSON has none, and such a value
    is a broken env, not a score to write down.
    """
    bad = list(non_finite(result))
    if bad:
        shown = ", ".join(f"{path} = {value}" for path, value in bad[:5]) + (" ..." if len(bad) > 5 else "")
        raise ValueError(f"non-finite value(s) in the evaluation of {result['env']}: {shown}; nothing written")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2, default=str, allow_nan=False)
    return out
