"""Chat-template rendering that never re-tokenizes earlier turns.

The first prompt of an episode is the chat template applied to the
observation's messages (with the tool schemas and the generation prompt).
On a later turn, only the messages appended since the last assistant message
are rendered: the template is applied to the conversation with and without
them, and only the new suffix string is tokenized. Between the generated
completion and that suffix comes the template's end-of-assistant-turn text
(``<|im_end|>\\n`` for ChatML) minus what the model already generated (its EOS).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from corrgrpo.agents.episode import Episode

__all__ = ["ChatRenderer"]

_SENTINEL = "\u2063corrgrpo-assistant-content\u2063"


class ChatRenderer:
    """Turns observations into prompt token ids through a tokenizer's chat template."""

    def __init__(self, tokenizer: Any):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.turn_end = self._assistant_turn_end()
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_ids = {eos} if isinstance(eos, int) else set(eos or [])

    # ----------------------------------------------------------------- text
    def render(
        self, messages: Sequence[dict], tools: Sequence[dict] | None, add_generation_prompt: bool
    ) -> str:
        """The chat template applied to ``messages`` (and ``tools``), as a string."""
        text = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )
        if not isinstance(text, str):  # some versions wrap single conversations in a list
            text = text[0]
        return text

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with no special tokens added (templates carry their own)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _assistant_turn_end(self) -> str:
        convo = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}]
        text = self.render(convo, None, add_generation_prompt=False)
        at = text.rfind(_SENTINEL)
        return text[at + len(_SENTINEL) :] if at >= 0 else ""

    # ---------------------------------------------------------------- tokens
    def first_prompt(self, obs: dict) -> list[int]:
        """Prompt ids for a conversation seen for the first time."""
        return self.encode(self.render(obs["messages"], obs.get("tools"), True))

    def continuation(self, obs: dict, episode: Episode) -> tuple[list[int], list[dict]]:
        """Ids to append to ``episode`` before its next completion, and the conversation rendered.

        The new messages are those after the last assistant message of ``obs``;
        when the observation does not echo the assistant's replies, those after
        the conversation the episode rendered last.
        """
        messages = list(obs["messages"])
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
        if last >= 0:
            base, new = messages[: last + 1], messages[last + 1 :]
        else:
            known = [m for m in episode.messages if m.get("role") != "assistant"]
            if messages[: len(known)] != known:
                raise ValueError(
                    "observation neither contains the assistant's reply nor extends the "
                    "previous conversation; cannot append it without re-tokenizing"
                )
            base, new = episode.messages, messages[len(known) :]
        tools = obs.get("tools")
        prefix = self.render(base, tools, add_generation_prompt=False)
        full = self.render(list(base) + list(new), tools, add_generation_prompt=True)
        if not full.startswith(prefix):
            raise ValueError(
                "the chat template renders earlier turns differently once new messages follow; "
                "appending tokens would not match the template"
            )
        glue = self.turn_end
        last_turn = episode.turns[-1] if episode.turns else None
        if last_turn is not None and last_turn.completion_ids:
            tail_id = last_turn.completion_ids[-1]
            if tail_id in self.eos_ids:
                generated = self.tokenizer.decode([tail_id], skip_special_tokens=False)
                if glue.startswith(generated):
                    glue = glue[len(generated) :]
        return self.encode(glue + full[len(prefix) :]), list(base) + list(new)
