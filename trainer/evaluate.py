"""Evaluating a policy on a domain's metrics (pass@1, all-exact accuracy, utility/ASR...).

Each task of the split is played once (greedy by default) and the per-episode
records go to the environment's own ``metrics`` function.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.progress import Progress

import corrgrpo_envs
from agents.episode import Episode
from agents.hf_policy import HFPolicy
from agents.models import load_model
from agents.policy import Policy, SamplingParams
from corrgrpo_envs.vector import GroupedVectorEnv
from trainer.config import Config

__all__ = ["evaluate", "play_tasks"]


def play_tasks(
    venv: GroupedVectorEnv,
    policy: Policy,
    task_ids: list[str],
    sampling: SamplingParams,
    max_turns: int,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Play each task once (``venv`` has group size 1); returns per-episode records."""
    batch = venv.num_groups
    records: list[dict[str, Any]] = []
    with Progress(disable=not progress, transient=True) as bar:
        job = bar.add_task("eval", total=len(task_ids))
        for start in range(0, len(task_ids), batch):
            chunk = task_ids[start : start + batch]
            padded = chunk + [chunk[-1]] * (batch - len(chunk))
            obs, _ = venv.reset(task_ids=padded)
            episodes = [Episode(task_id=t) for t in padded]
            infos: list[dict] = [{} for _ in padded]
            texts = [""] * len(padded)
            for _ in range(max_turns):
                active = np.flatnonzero(venv.active)
                if active.size == 0:
                    break
                acts = policy.act([obs[i] for i in active], sampling, [episodes[i] for i in active])
                actions: list[str | None] = [None] * len(padded)
                for i, a in zip(active, acts):
                    actions[i] = a.text
                    texts[i] = a.text
                obs, _, _, _, step_infos = venv.step(actions)
                for i in active:
                    infos[i] = step_infos[i]
            for i, task_id in enumerate(chunk):
                comps = dict(zip(venv.reward_names, map(float, venv.returns[i])))
                records.append(
                    {"task_id": task_id, "reward_components": comps, "info": infos[i], "text": texts[i]}
                )
            bar.advance(job, len(chunk))
    return records


def evaluate(
    cfg: Config,
    checkpoint: str | Path | None = None,
    split: str = "eval",
    limit: int | None = None,
    greedy: bool = True,
    policy_kind: str = "model",
    batch_size: int = 16,
    progress: bool = True,
) -> dict[str, Any]:
    """Evaluate ``cfg``'s model (or ``checkpoint``) on a split; returns the metrics and records."""
    env_kwargs = {k: v for k, v in cfg.env.items() if k != "id"}
    env_kwargs["split"] = split
    env = corrgrpo_envs.make(cfg.env["id"], **env_kwargs).unwrapped
    task_ids = list(env.task_ids)[: limit or None]
    if policy_kind == "reference":
        from agents import ReferencePolicy

        policy: Policy = ReferencePolicy(env)
    elif policy_kind == "random":
        from agents import RandomPolicy

        policy = RandomPolicy(seed=cfg.train.seed)
    else:
        source = str(Path(checkpoint) / "model") if checkpoint else cfg.model.name_or_path
        if checkpoint and not Path(source).exists():
            source = str(checkpoint)
        kwargs: dict[str, Any] = {"dtype": getattr(torch, cfg.model.dtype)}
        if cfg.model.tokenizer_file and source == cfg.model.name_or_path:
            kwargs["tokenizer_file"] = cfg.model.tokenizer_file
        model, tokenizer = load_model(source, **kwargs)
        model.eval()
        policy = HFPolicy(model, tokenizer)
    sampling = SamplingParams(
        temperature=0.0 if greedy else cfg.rollout.temperature,
        top_p=1.0 if greedy else cfg.rollout.top_p,
        max_new_tokens=cfg.rollout.max_new_tokens,
        stop=tuple(cfg.rollout.stop),
    )
    venv = GroupedVectorEnv(
        cfg.env["id"],
        num_groups=min(batch_size, max(1, len(task_ids))),
        group_size=1,
        workers=cfg.rollout.reward_workers,
        executor=cfg.rollout.reward_executor,
        **env_kwargs,
    )
    t0 = time.perf_counter()
    torch.manual_seed(cfg.train.seed)
    with torch.no_grad():
        records = play_tasks(venv, policy, task_ids, sampling, cfg.rollout.max_turns, progress)
    venv.close()
    metrics = env.metrics(records)
    return {
        "env": cfg.env["id"],
        "split": split,
        "policy": policy_kind,
        "checkpoint": str(checkpoint) if checkpoint else None,
        "model": cfg.model.name_or_path,
        "tasks": len(task_ids),
        "greedy": greedy,
        "seconds": time.perf_counter() - t0,
        "metrics": metrics,
        "records": records,
    }
