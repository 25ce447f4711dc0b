"""Token-exact record of one rollout.

An :class:`Episode` is the sequence a trainer scores: every token the policy
was conditioned on or generated, in order, with a loss mask (1 on generated
tokens) and the sampling log-probabilities aligned to it. Turns are appended,
never re-tokenized, so the ids the trainer sees are exactly the ids sampled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corrgrpo.agents.policy import Action

__all__ = ["Episode"]


@dataclass
class Episode:
    """One rollout as tokens.

    Attributes:
        token_ids: the whole sequence (first prompt, completions, tool/env messages).
        loss_mask: 1 on tokens the policy generated, 0 on prompt and env/tool tokens.
        logprobs: aligned to ``token_ids``; the sampling log-probability on generated
            tokens, 0.0 where the mask is 0.
        prompt_length: number of tokens of the first prompt.
        turns: the actions, in order.
        task_id: the env task this rollout plays (scripted policies read it).
        messages: the conversation as last rendered, with the policy's replies appended;
            later turns render only what comes after it.
    """

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    turns: list[Action] = field(default_factory=list)
    task_id: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def completion_length(self) -> int:
        """Number of generated (mask 1) tokens."""
        return sum(self.loss_mask)

    def __len__(self) -> int:
        return len(self.token_ids)

    def append_context(self, ids: list[int]) -> None:
        """Append tokens the policy did not generate (prompt, tool results): mask 0."""
        if not self.token_ids:
            self.prompt_length = len(ids)
        self.token_ids.extend(int(i) for i in ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def append_action(self, action: Action) -> None:
        """Append a generated turn whose ``prompt_ids`` must equal this episode's tokens."""
        if action.prompt_ids != self.token_ids:
            raise ValueError("action.prompt_ids must equal the episode's tokens so far")
        if len(action.logprobs) != len(action.completion_ids):
            raise ValueError(
                f"{len(action.logprobs)} logprobs for {len(action.completion_ids)} completion tokens"
            )
        self.token_ids.extend(int(i) for i in action.completion_ids)
        self.loss_mask.extend([1] * len(action.completion_ids))
        self.logprobs.extend(float(x) for x in action.logprobs)
        self.turns.append(action)

    def to_dict(self) -> dict[str, Any]:
        """Plain lists, e.g. for JSON dumps of rollouts."""
        return {
            "task_id": self.task_id,
            "token_ids": list(self.token_ids),
            "loss_mask": list(self.loss_mask),
            "logprobs": list(self.logprobs),
            "prompt_length": self.prompt_length,
            "num_turns": self.num_turns,
            "completion_length": self.completion_length,
            "texts": [a.text for a in self.turns],
        }
