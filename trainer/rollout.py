"""Playing grouped episodes: P tasks x G rollouts through a policy or rollout engine.

Multi-turn episodes run turn by turn until every member has finished or
``max_turns`` is reached; members finish at different turns and keep their
token-exact trajectories (``agents.Episode``). :func:`play_episodes` is the one
such loop: training, evaluation and tests all use it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from corrgrpo.agents.episode import Episode
from corrgrpo.agents.policy import Action, Policy, SamplingParams
from corrgrpo_envs.vector import GroupedVectorEnv

__all__ = [
    "RolloutBatch",
    "collect_groups",
    "informative_groups",
    "longest_turn",
    "overlong_penalty",
    "play_episodes",
]


@dataclass
class RolloutBatch:
    """The rollouts of some groups.

    ``rewards``: float32 ``[n, K]`` episode reward vectors; ``group_ids``:
    int64 ``[n]`` (global group index); ``episodes``: token trajectories;
    ``raw_rewards``: the vectors before reward gates, when gates changed them.
    """

    episodes: list[Episode]
    rewards: np.ndarray
    group_ids: np.ndarray
    task_ids: list[str]
    infos: list[dict]
    texts: list[str]
    generate_seconds: float = 0.0
    reward_seconds: float = 0.0
    turns: list[int] = field(default_factory=list)
    raw_rewards: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.episodes)

    @staticmethod
    def concat(batches: Sequence[RolloutBatch]) -> RolloutBatch:
        return RolloutBatch(
            episodes=[e for b in batches for e in b.episodes],
            rewards=np.concatenate([b.rewards for b in batches]),
            group_ids=np.concatenate([b.group_ids for b in batches]),
            task_ids=[t for b in batches for t in b.task_ids],
            infos=[i for b in batches for i in b.infos],
            texts=[t for b in batches for t in b.texts],
            generate_seconds=sum(b.generate_seconds for b in batches),
            reward_seconds=sum(b.reward_seconds for b in batches),
            turns=[t for b in batches for t in b.turns],
            raw_rewards=None if all(b.raw_rewards is None for b in batches) else np.concatenate(
                [b.rewards if b.raw_rewards is None else b.raw_rewards for b in batches]
            ),
        )

    def select_groups(self, keep: np.ndarray) -> RolloutBatch:
        """The members of the groups whose ids are in ``keep``."""
        mask = np.isin(self.group_ids, keep)
        idx = np.flatnonzero(mask)
        return RolloutBatch(
            episodes=[self.episodes[i] for i in idx],
            rewards=self.rewards[idx],
            group_ids=self.group_ids[idx],
            task_ids=[self.task_ids[i] for i in idx],
            infos=[self.infos[i] for i in idx],
            texts=[self.texts[i] for i in idx],
            generate_seconds=self.generate_seconds,
            reward_seconds=self.reward_seconds,
            turns=[self.turns[i] for i in idx],
            raw_rewards=None if self.raw_rewards is None else self.raw_rewards[idx],
        )


def overlong_penalty(lengths: np.ndarray, max_length: int, buffer: int) -> np.ndarray:
    """DAPO's overlong shaping: 0 up to ``max_length - buffer``, linear to -1 at ``max_length``.

    ``lengths``: ``[n]`` lengths in tokens, measured against the same budget as ``max_length``
    (the trainer passes each episode's longest turn and the per-turn ``max_new_tokens``);
    returns float32 ``[n]``.
    """
    start = max_length - buffer
    over = (start - lengths.astype(np.float64)) / max(buffer, 1)
    out = np.where(lengths <= start, 0.0, np.where(lengths <= max_length, over, -1.0))
    return out.astype(np.float32)


def longest_turn(episode: Episode) -> int:
    """Tokens of the episode's longest generated turn (each turn has the same budget)."""
    return max((len(a.completion_ids) for a in episode.turns), default=0)


def informative_groups(batch: RolloutBatch) -> RolloutBatch:
    """Groups whose RAW reward vectors are not all equal (DAPO's dynamic sampling)."""
    keep = []
    for g in np.unique(batch.group_ids):
        r = batch.rewards[batch.group_ids == g]
        if not np.all(np.isclose(r, r[:1], equal_nan=True)):
            keep.append(g)
    return batch.select_groups(np.asarray(keep, dtype=np.int64))


Generate = Callable[[Sequence[dict], SamplingParams, Sequence[Episode]], Sequence[Action]]


def play_episodes(
    venv: GroupedVectorEnv,
    generate: Generate,
    task_ids: Sequence[str],
    sampling: SamplingParams,
    max_turns: int,
    *,
    first_group_id: int = 0,
    groups_per_generate: int | None = None,
    seed_for: Callable[[int], int] | None = None,
) -> RolloutBatch:
    """Play ``len(task_ids)`` groups of ``venv.group_size`` episodes to the end, turn by turn.

    The one multi-turn loop of the project (training, evaluation and tests use it).
    ``venv`` must have ``num_groups == len(task_ids)``; ``generate(observations, sampling,
    episodes)`` is a policy's ``act`` or a rollout engine's ``generate``. Members finish at
    different turns and keep their token-exact trajectories. Generation runs in chunks of
    ``groups_per_generate`` groups, each sampled with the seed ``seed_for(first global group
    id of the chunk)`` so that sampling does not depend on how groups are spread over
    processes (the seed goes to the policy through ``SamplingParams.seed``).
    """
    G = venv.group_size
    n = len(task_ids) * G
    obs, _ = venv.reset(task_ids=list(task_ids))
    episodes = [Episode(task_id=task_ids[i // G]) for i in range(n)]
    texts = [""] * n
    infos: list[dict] = [{} for _ in range(n)]
    turns = [0] * n
    gen_s = rew_s = 0.0
    chunk = (groups_per_generate or len(task_ids)) * G
    for _turn in range(max_turns):
        active = np.flatnonzero(venv.active)
        if active.size == 0:
            break
        actions: list[str | None] = [None] * n
        t0 = time.perf_counter()
        for start in range(0, n, chunk):
            idx = [i for i in active if start <= i < start + chunk]
            if not idx:
                continue
            chunk_sampling = sampling
            if seed_for is not None:
                # every backend seeds from SamplingParams.seed (HF: the torch RNG; vLLM: per request)
                chunk_sampling = dataclasses.replace(sampling, seed=seed_for(first_group_id + start // G))
            acts = generate([obs[i] for i in idx], chunk_sampling, [episodes[i] for i in idx])
            for i, a in zip(idx, acts):
                actions[i] = a.text
                texts[i] = a.text
                turns[i] += 1
        t1 = time.perf_counter()
        obs, _, _, _, step_infos = venv.step(actions)
        rew_s += time.perf_counter() - t1
        gen_s += t1 - t0
        for i in active:
            infos[i] = step_infos[i]
    return RolloutBatch(
        episodes=episodes,
        rewards=np.asarray(venv.returns, dtype=np.float32).copy(),
        group_ids=first_group_id + np.arange(n, dtype=np.int64) // G,
        task_ids=[task_ids[i // G] for i in range(n)],
        infos=infos,
        texts=texts,
        generate_seconds=gen_s,
        reward_seconds=rew_s,
        turns=turns,
    )


def collect_groups(
    venv: GroupedVectorEnv,
    policy: Policy,
    task_ids: Sequence[str],
    first_group_id: int,
    sampling: SamplingParams,
    max_turns: int,
    groups_per_generate: int | None = None,
    seed_for: Callable[[int], int] | None = None,
) -> RolloutBatch:
    """:func:`play_episodes` with a policy (its ``act`` generates the turns)."""
    return play_episodes(
        venv, policy.act, task_ids, sampling, max_turns, first_group_id=first_group_id,
        groups_per_generate=groups_per_generate, seed_for=seed_for,
    )
