"""agents: policies that act in corrgrpo environments and report exact tokens and logprobs.

Every policy maps a batch of conversations to :class:`Action` objects::

    from corrgrpo.agents import HFPolicy, SamplingParams, Episode, load_model

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

import importlib
from typing import TYPE_CHECKING, Any

# Each name is imported from its module on first use: ``import agents`` (or a light module of
# it, such as ``corrgrpo.agents.policy``) then costs no torch or transformers import, so a command can
# check its config before paying for them.
_HOMES = {
    "ChatRenderer": "corrgrpo.agents.chat",
    "Episode": "corrgrpo.agents.episode",
    "HFPolicy": "corrgrpo.agents.hf_policy",
    "build_anchor_model": "corrgrpo.agents.models",
    "build_tiny_model": "corrgrpo.agents.models",
    "load_model": "corrgrpo.agents.models",
    "load_tokenizer": "corrgrpo.agents.models",
    "CompletionsTokenPolicy": "corrgrpo.agents.openai_policy",
    "OpenAIPolicy": "corrgrpo.agents.openai_policy",
    "OpenAIRequestError": "corrgrpo.agents.openai_policy",
    "Action": "corrgrpo.agents.policy",
    "Policy": "corrgrpo.agents.policy",
    "SamplingParams": "corrgrpo.agents.policy",
    "RandomPolicy": "corrgrpo.agents.scripted",
    "ReferencePolicy": "corrgrpo.agents.scripted",
    "TokenPolicy": "corrgrpo.agents.token_policy",
    "ParsedAnswer": "corrgrpo.agents.toolcalls",
    "ParsedMessage": "corrgrpo.agents.toolcalls",
    "ToolCall": "corrgrpo.agents.toolcalls",
    "parse_hermes": "corrgrpo.agents.toolcalls",
    "parse_rlla": "corrgrpo.agents.toolcalls",
    "render_hermes": "corrgrpo.agents.toolcalls",
    "render_rlla": "corrgrpo.agents.toolcalls",
    "VLLMPolicy": "corrgrpo.agents.vllm_policy",  # vLLM is heavy and optional
}

if TYPE_CHECKING:
    from corrgrpo.agents.chat import ChatRenderer
    from corrgrpo.agents.episode import Episode
    from corrgrpo.agents.hf_policy import HFPolicy
    from corrgrpo.agents.models import (
        build_anchor_model,
        build_tiny_model,
        load_model,
        load_tokenizer,
    )
    from corrgrpo.agents.openai_policy import (
        CompletionsTokenPolicy,
        OpenAIPolicy,
        OpenAIRequestError,
    )
    from corrgrpo.agents.policy import Action, Policy, SamplingParams
    from corrgrpo.agents.scripted import RandomPolicy, ReferencePolicy
    from corrgrpo.agents.token_policy import TokenPolicy
    from corrgrpo.agents.toolcalls import (
        ParsedAnswer,
        ParsedMessage,
        ToolCall,
        parse_hermes,
        parse_rlla,
        render_hermes,
        render_rlla,
    )
    from corrgrpo.agents.vllm_policy import VLLMPolicy

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
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'corrgrpo.agents' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
