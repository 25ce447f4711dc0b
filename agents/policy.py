"""The policy interface: what acting in a corrgrpo environment returns.

A :class:`Policy` maps a batch of observations (chat conversations) to a batch
of :class:`Action` objects. Token-level policies report the exact token ids they
were conditioned on and sampled, and the log-probability of every sampled
token, so a trainer never has to re-tokenize text (which changes ids at turn
boundaries) and can correct for sampling/training mismatch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from corrgrpo.agents.episode import Episode

__all__ = ["SamplingParams", "Action", "Policy", "FinishReason"]

FinishReason = Literal["stop", "length"]


@dataclass
class SamplingParams:
    """How to sample one assistant turn.

    Attributes:
        temperature: softmax temperature; ``0`` means greedy decoding.
        top_p: nucleus-sampling mass (``1.0`` disables it).
        max_new_tokens: most tokens generated per turn.
        stop: stop strings; generation ends at the first one (it is not part of ``Action.text``).
        seed: makes sampling reproducible for the whole batch when set.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop: Sequence[str] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if int(self.max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(self.stop)
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty str, got {self.stop!r}")


@dataclass
class Action:
    """One generated assistant turn.

    Attributes:
        text: the assistant message handed to the environment (no special tokens,
            no stop string).
        prompt_ids: the whole context this turn was generated from.
        completion_ids: the sampled tokens, including the EOS token when the model
            stopped by itself (so a trainer teaches it to stop); when a stop string
            ended the turn, up to and including the token that completed it.
        logprobs: one per completion token: the log-probability of the sampled
            token under the sampling model's raw distribution, i.e. the
            log-softmax of its logits at temperature 1, before temperature and
            top-p are applied. This is what an importance-sampling ratio against
            the trained policy needs.
        finish_reason: ``"stop"`` (EOS or stop string) or ``"length"`` (hit
            ``max_new_tokens``).
        info: extra per-backend details (e.g. the server's raw tool calls).
    """

    text: str
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason = "stop"
    info: dict[str, Any] = field(default_factory=dict)


class Policy(ABC):
    """Acts on a batch of conversations.

    ``act(observations, sampling, episodes)``: when ``episodes`` is given (one per
    observation), token-level policies extend each :class:`~corrgrpo.agents.episode.Episode`
    in place: the new prompt tokens (mask 0), then the completion (mask 1).
    """

    @abstractmethod
    def act(
        self,
        observations: Sequence[dict],
        sampling: SamplingParams | None = None,
        episodes: Sequence[Episode] | None = None,
        **kwargs: Any,
    ) -> list[Action]:
        """One assistant turn for each observation ``{"messages": [...], "tools": [...]}``."""

    @property
    def tokenizer(self) -> Any:
        """The tokenizer whose ids ``Action``s report (``None`` for text-only policies)."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (servers, engines)."""


def check_batch(observations: Sequence[dict], episodes: Sequence[Any] | None) -> None:
    """Raise ``ValueError`` unless observations are conversations and episodes match them."""
    if isinstance(observations, dict):
        raise ValueError("observations must be a sequence of observations, not a single dict")
    for i, obs in enumerate(observations):
        if not isinstance(obs, dict) or not isinstance(obs.get("messages"), list):
            raise ValueError(f"observation {i} must be a dict with a 'messages' list")
    if episodes is not None and len(episodes) != len(observations):
        raise ValueError(f"got {len(episodes)} episodes for {len(observations)} observations")
