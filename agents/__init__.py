"""agents: policies that act in corrgrpo environments and report exact tokens and logprobs.

Every policy maps a batch of conversations to :class:`Action` objects::

    from agents import HFPolicy, SamplingParams, Episode, load_model

    model, tokenizer = load_model("tiny")          # offline, seconds, cached
    policy = HFPolicy(model, tokenizer)
    episodes = [Episode() for _ in observations]
    actions = policy.act(observations, SamplingParams(max_new_tokens=64), episodes=episodes)
    episodes[0].token_ids, episodes[0].loss_mask, episodes[0].logprobs

Backends: :class:`HFPolicy` (transformers), :class:`VLLMPolicy` (in-process vLLM,
imported lazily), :class:`OpenAIPolicy` (any OpenAI-compatible server),
:class:`CompletionsTokenPolicy` (token-exact, over vLLM servers' completions);
scripted: :class:`ReferencePolicy`, :class:`RandomPolicy`.
"""

from __future__ import annotations

from typing import Any

from agents.chat import ChatRenderer
from agents.episode import Episode
from agents.hf_policy import HFPolicy
from agents.models import build_anchor_model, build_tiny_model, load_model, load_tokenizer
from agents.openai_policy import CompletionsTokenPolicy, OpenAIPolicy, OpenAIRequestError
from agents.policy import Action, Policy, SamplingParams
from agents.scripted import RandomPolicy, ReferencePolicy
from agents.token_policy import TokenPolicy
from agents.toolcalls import (
    ParsedAnswer,
    ParsedMessage,
    ToolCall,
    parse_hermes,
    parse_rlla,
    render_hermes,
    render_rlla,
)

__all__ = [
    "Action",
    "ChatRenderer",
    "CompletionsTokenPolicy",
    "Episode",
    "HFPolicy",
    "OpenAIPolicy",
    "OpenAIRequestError",
    "ParsedAnswer",
    "ParsedMessage",
    "Policy",
    "RandomPolicy",
    "ReferencePolicy",
    "SamplingParams",
    "TokenPolicy",
    "ToolCall",
    "VLLMPolicy",
    "build_anchor_model",
    "build_tiny_model",
    "load_model",
    "load_tokenizer",
    "parse_hermes",
    "parse_rlla",
    "render_hermes",
    "render_rlla",
]


def __getattr__(name: str) -> Any:
    # vLLM is heavy and optional: import its policy only when asked for
    if name == "VLLMPolicy":
        from agents.vllm_policy import VLLMPolicy

        return VLLMPolicy
    raise AttributeError(f"module 'agents' has no attribute {name!r}")
