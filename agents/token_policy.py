"""Shared episode bookkeeping for policies that sample tokens from a local model."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from corrgrpo.agents.chat import ChatRenderer
from corrgrpo.agents.episode import Episode
from corrgrpo.agents.policy import Action, Policy, SamplingParams, check_batch

__all__ = ["TokenPolicy", "record_turns"]


class TokenPolicy(Policy):
    """A policy that renders prompts with a chat template and samples token ids.

    Subclasses implement :meth:`generate` on prompt ids; this class builds the
    prompts (first turn: the whole conversation; later turns: the episode's
    tokens plus the new messages only) and extends the episodes.
    """

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        self.renderer = ChatRenderer(tokenizer)

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @abstractmethod
    def generate(self, prompts: Sequence[list[int]], sampling: SamplingParams) -> list[Action]:
        """Sample one completion per prompt (ids); ``Action.prompt_ids`` is the prompt."""

    def prompt_ids(self, observations: Sequence[dict], episodes: Sequence[Episode] | None) -> list[list[int]]:
        """The context each observation's next turn is generated from (extends ``episodes``)."""
        check_batch(observations, episodes)
        prompts = []
        for i, obs in enumerate(observations):
            episode = episodes[i] if episodes is not None else None
            if episode is None:
                prompts.append(self.renderer.first_prompt(obs))
                continue
            if not episode.token_ids:
                episode.append_context(self.renderer.first_prompt(obs))
                episode.messages = list(obs["messages"])
            else:
                delta, conversation = self.renderer.continuation(obs, episode)
                episode.append_context(delta)
                episode.messages = conversation
            prompts.append(list(episode.token_ids))
        return prompts

    def act(
        self,
        observations: Sequence[dict],
        sampling: SamplingParams | None = None,
        episodes: Sequence[Episode] | None = None,
        **kwargs: Any,
    ) -> list[Action]:
        sampling = sampling or SamplingParams()
        prompts = self.prompt_ids(observations, episodes)
        actions = self.generate(prompts, sampling) if prompts else []
        record_turns(episodes, actions)
        return actions


def record_turns(episodes: Sequence[Episode] | None, actions: Sequence[Action]) -> None:
    """Append each generated turn to its episode: its tokens (trained) and its message."""
    if episodes is None:
        return
    for episode, action in zip(episodes, actions):
        episode.append_action(action)
        episode.messages = episode.messages + [{"role": "assistant", "content": action.text}]
