"""Supervised data as token-exact episodes: the same tokens an RL rollout would have.

Every example becomes an :class:`agents.Episode` built the way a policy builds
one in RL: the first prompt is the chat template applied to the conversation so
far (with the tool schemas and the generation prompt), each assistant turn is
appended as "generated" tokens (the canonical tokens of its text plus EOS, loss
mask 1), and whatever follows (tool results, the next user turn) is appended as
context through :class:`agents.ChatRenderer` (loss mask 0). So supervised
training sees exactly the token ids and masks that ``corrgrpo train`` would.

Two sources:

* :func:`env_examples`: an environment's own reference answers on a split,
  played through the env (``GroupedVectorEnv``, the trainer's rollout function)
  by :class:`TeacherForcedPolicy` over :class:`agents.ReferencePolicy`; multi-turn
  envs work as in RL (the env's tool outputs come back as context);
* :func:`file_examples`: JSON / JSON-lines files of conversations, either
  OpenAI-style ``{"messages": [...], "tools": [...]}`` (assistant ``tool_calls``
  are rendered by the tokenizer's chat template) or the RLLA SFT format
  ``{"instruction", "input", "output"}``. A malformed record is an
  :class:`SFTDataError` naming the file, the record and the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from corrgrpo.agents.chat import ChatRenderer
from corrgrpo.agents.episode import Episode
from corrgrpo.agents.policy import Action, SamplingParams
from corrgrpo.agents.scripted import ReferencePolicy
from corrgrpo.agents.token_policy import TokenPolicy

__all__ = [
    "SFTDataError",
    "TeacherForcedPolicy",
    "DataStats",
    "env_examples",
    "file_examples",
    "conversation_episode",
    "read_records",
    "record_conversation",
    "truncate",
]

ROLES = ("system", "user", "assistant", "tool")


class SFTDataError(ValueError):
    """A supervised record is malformed (the message names file, record and field)."""


# ------------------------------------------------------------------------ the policy
class TeacherForcedPolicy(TokenPolicy):
    """A token policy that "generates" given assistant texts: their tokens plus EOS.

    Args:
        tokenizer: the model's tokenizer (with its chat template).
        texts: ``(observations, episodes) -> [assistant text]`` for each turn.

    Prompts and later-turn context come from :class:`~corrgrpo.agents.token_policy.TokenPolicy`,
    as for the sampling policies, so an episode's tokens are those an RL rollout
    that produced the same texts would have. A completion is the text's tokens
    (no special tokens added) followed by the tokenizer's EOS, as a model that
    stopped by itself emits; its log-probabilities are 0.
    """

    def __init__(
        self, tokenizer: Any, texts: Callable[[Sequence[dict], Sequence[Episode]], list[str]]
    ):
        super().__init__(tokenizer)
        eos = tokenizer.eos_token_id
        if not isinstance(eos, int):
            raise ValueError("the tokenizer has no EOS token: cannot mark where a turn ends")
        self.eos_id = eos
        self._texts = texts
        self._pending: list[str] | None = None

    @classmethod
    def from_reference(cls, tokenizer: Any, env: Any) -> TeacherForcedPolicy:
        """Plays each task's reference answer (``agents.ReferencePolicy`` over ``env``)."""
        reference = ReferencePolicy(env)

        def texts(observations: Sequence[dict], episodes: Sequence[Episode]) -> list[str]:
            # copies: ReferencePolicy records its turns on the episodes it is given
            shadows = [Episode(task_id=e.task_id, turns=list(e.turns)) for e in episodes]
            return [a.text for a in reference.act(observations, episodes=shadows)]

        return cls(tokenizer, texts)

    def completion_ids(self, text: str) -> list[int]:
        """The ids of an assistant turn whose text is ``text``: its tokens, then EOS."""
        return self.renderer.encode(text) + [self.eos_id]

    def act(
        self,
        observations: Sequence[dict],
        sampling: SamplingParams | None = None,
        episodes: Sequence[Episode] | None = None,
        **kwargs: Any,
    ) -> list[Action]:
        if episodes is None:
            raise ValueError("TeacherForcedPolicy needs the episodes (it reads their task and turn)")
        self._pending = self._texts(observations, episodes)
        try:
            return super().act(observations, sampling, episodes)
        finally:
            self._pending = None

    def generate(self, prompts: Sequence[list[int]], sampling: SamplingParams) -> list[Action]:
        assert self._pending is not None and len(self._pending) == len(prompts)
        actions = []
        for prompt, text in zip(prompts, self._pending):
            ids = self.completion_ids(text)
            actions.append(
                Action(text=text, prompt_ids=list(prompt), completion_ids=ids, logprobs=[0.0] * len(ids))
            )
        return actions


# ------------------------------------------------------------------------ env source
@dataclass
class DataStats:
    """What a data source produced (logged with the run)."""

    examples: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    truncated: int = 0
    dropped: int = 0
    reference_reward: list[float] | None = None
    reward_names: list[str] | None = None

    def to_dict(self, prefix: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            f"{prefix}/examples": self.examples,
            f"{prefix}/tokens": self.tokens,
            f"{prefix}/trained_tokens": self.trained_tokens,
            f"{prefix}/truncated": self.truncated,
            f"{prefix}/dropped": self.dropped,
        }
        if self.reference_reward is not None and self.reward_names is not None:
            for name, value in zip(self.reward_names, self.reference_reward):
                out[f"{prefix}/reference_reward/{name}"] = value
        return out


def env_examples(
    env_id: str,
    env_kwargs: dict[str, Any],
    tokenizer: Any,
    max_turns: int = 1,
    limit: int | None = None,
    chunk: int = 64,
) -> tuple[list[Episode], DataStats]:
    """The reference answers of every task of the env (``env_kwargs`` holds its split), as episodes.

    Tasks are played ``chunk`` at a time through a ``GroupedVectorEnv`` of group
    size 1 by :class:`TeacherForcedPolicy` over the env's ``reference_action``,
    with the trainer's rollout function; the rewards the references earn are
    returned in the stats (a check that the references are what the env wants).
    """
    import corrgrpo_envs
    from corrgrpo.trainer.rollout import collect_groups
    from corrgrpo_envs.vector import GroupedVectorEnv

    probe = corrgrpo_envs.make(env_id, **env_kwargs).unwrapped
    task_ids = list(probe.task_ids)[: limit or None]
    probe.close()
    if not task_ids:
        raise SFTDataError(f"env {env_id} with {env_kwargs}: no tasks in this split")
    size = max(1, min(chunk, len(task_ids)))
    venv = GroupedVectorEnv(env_id, num_groups=size, group_size=1, **env_kwargs)
    try:
        policy = TeacherForcedPolicy.from_reference(tokenizer, venv)
        episodes: list[Episode] = []
        rewards = []
        for start in range(0, len(task_ids), size):
            part = task_ids[start : start + size]
            padded = part + [part[-1]] * (size - len(part))  # the env batch has a fixed size
            batch = collect_groups(
                venv,
                policy,
                padded,
                first_group_id=start,
                sampling=SamplingParams(temperature=0.0, max_new_tokens=1),
                max_turns=max_turns,
            )
            episodes.extend(batch.episodes[: len(part)])
            rewards.append(batch.rewards[: len(part)])
        names = list(venv.reward_names)
    finally:
        venv.close()
    for e in episodes:
        if e.completion_length == 0:
            raise SFTDataError(f"env {env_id}: task {e.task_id} produced no assistant turn")
    stats = DataStats(reward_names=names, reference_reward=np.concatenate(rewards).mean(0).tolist())
    return episodes, stats


# ----------------------------------------------------------------------- file source
def read_records(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """``(where, record)`` pairs of a ``.jsonl`` file (one object per line) or a ``.json``
    file (a list of objects); ``where`` is ``"<file>: line N"`` (1-based) for JSON lines,
    ``"<file>: record N"`` (0-based position) for a JSON list."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SFT data file not found: {path}")
    text = path.read_text(encoding="utf-8")
    records: list[tuple[int, Any]] = []
    kind = "line"
    if path.suffix == ".jsonl" or (path.suffix != ".json" and not text.lstrip().startswith("[")):
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append((lineno, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise SFTDataError(f"{path}: line {lineno}: not JSON ({exc.msg})") from None
        kind = "line"
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SFTDataError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(data, list):
            raise SFTDataError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
        records = list(enumerate(data))
        kind = "record"
    out = []
    for number, rec in records:
        where = f"{path}: {kind} {number}"
        if not isinstance(rec, dict):
            raise SFTDataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        out.append((where, rec))
    return out


def _tool_call(call: Any, field: str) -> dict[str, Any]:
    """An OpenAI-style tool call with its arguments as a mapping."""
    if not isinstance(call, dict):
        raise SFTDataError(f"{field}: expected an object, got {type(call).__name__}")
    fn = call.get("function", call)
    where = f"{field}.function" if "function" in call else field
    if not isinstance(fn, dict):
        raise SFTDataError(f"{where}: expected an object with 'name' and 'arguments'")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise SFTDataError(f"{where}.name: expected a non-empty string, got {name!r}")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            raise SFTDataError(f"{where}.arguments: not a JSON object: {args[:60]!r}") from None
    if not isinstance(args, dict):
        raise SFTDataError(f"{where}.arguments: expected an object, got {type(args).__name__}")
    return {"type": "function", "function": {"name": name, "arguments": args}}


def _message(m: Any, field: str) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise SFTDataError(f"{field}: expected an object, got {type(m).__name__}")
    role = m.get("role")
    if role not in ROLES:
        raise SFTDataError(f"{field}.role: {role!r} is not one of {', '.join(ROLES)}")
    content = m.get("content")
    calls = m.get("tool_calls")
    if calls is not None and role != "assistant":
        raise SFTDataError(f"{field}.tool_calls: only assistant messages make tool calls")
    if content is None and not (role == "assistant" and calls):
        raise SFTDataError(f"{field}.content: missing (a string is needed)")
    if content is not None and not isinstance(content, str):
        raise SFTDataError(f"{field}.content: expected a string, got {type(content).__name__}")
    out: dict[str, Any] = {"role": role, "content": content or ""}
    if calls is not None:
        if not isinstance(calls, list):
            raise SFTDataError(f"{field}.tool_calls: expected a list, got {type(calls).__name__}")
        out["tool_calls"] = [_tool_call(c, f"{field}.tool_calls[{i}]") for i, c in enumerate(calls)]
    for key in ("name", "tool_call_id"):
        if isinstance(m.get(key), str):
            out[key] = m[key]
    return out


def record_conversation(rec: dict[str, Any], where: str) -> tuple[list[dict], list[dict] | None]:
    """``(messages, tools)`` of one record (either format), validated; errors start with ``where``."""
    try:
        if "messages" in rec:
            msgs = rec["messages"]
            if not isinstance(msgs, list) or not msgs:
                raise SFTDataError("messages: expected a non-empty list of messages")
            messages = [_message(m, f"messages[{i}]") for i, m in enumerate(msgs)]
            tools = rec.get("tools")
            if tools is not None:
                if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
                    raise SFTDataError("tools: expected a list of JSON-schema objects")
        elif "instruction" in rec or "output" in rec:
            from corrgrpo_envs.toolcall.prompts import tools_from_system_prompt

            for key in ("instruction", "output"):
                if not isinstance(rec.get(key), str):
                    raise SFTDataError(f"{key}: expected a string (RLLA SFT record)")
            if not isinstance(rec.get("input", ""), str):
                raise SFTDataError("input: expected a string (RLLA SFT record)")
            # the tool-calling env renders these records the same way (system, user, tools)
            messages = [
                {"role": "system", "content": rec["instruction"]},
                {"role": "user", "content": rec.get("input", "")},
                {"role": "assistant", "content": rec["output"]},
            ]
            tools = tools_from_system_prompt(rec["instruction"]) or None
        else:
            raise SFTDataError(
                f"expected 'messages' (OpenAI chat format) or 'instruction'/'input'/'output' "
                f"(RLLA SFT); got keys {sorted(rec)}"
            )
        if not any(m["role"] == "assistant" for m in messages):
            raise SFTDataError("messages: no assistant message to learn from")
        if messages[0]["role"] == "assistant":
            raise SFTDataError("messages[0].role: the conversation cannot start with the assistant")
    except SFTDataError as exc:
        raise SFTDataError(f"{where}: {exc}") from None
    return messages, tools


def _assistant_text(renderer: ChatRenderer, before: list[dict], message: dict, tools, field: str) -> str:
    """What the template writes for ``message`` after ``before``, without its end-of-turn text.

    This is the text a policy generates for that turn: the content, and the tool
    calls in the template's own syntax.
    """
    prompt = renderer.render(before, tools, add_generation_prompt=True)
    full = renderer.render(list(before) + [message], tools, add_generation_prompt=False)
    if not full.startswith(prompt):
        raise SFTDataError(
            f"{field}: the chat template renders the conversation before this message differently "
            "once the message follows, so its tokens cannot be appended"
        )
    text = full[len(prompt) :]
    end = renderer.turn_end
    if end and text.endswith(end):
        text = text[: -len(end)]
    elif end and end.strip() and text.endswith(end.rstrip()):
        text = text[: -len(end.rstrip())]
    for call in message.get("tool_calls") or []:
        if call["function"]["name"] not in text:
            raise SFTDataError(
                f"{field}.tool_calls: the tokenizer's chat template does not render tool calls "
                "(use a template that does, or write the calls into the content)"
            )
    return text


def conversation_episode(
    renderer: ChatRenderer, messages: list[dict], tools: list[dict] | None, where: str = "record"
) -> Episode:
    """One conversation as an episode: each assistant message a trained turn, the rest context."""
    texts: list[str] = []
    turns: list[int] = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    try:
        for i in turns:
            texts.append(_assistant_text(renderer, messages[:i], messages[i], tools, f"messages[{i}]"))
    except SFTDataError as exc:
        raise SFTDataError(f"{where}: {exc}") from None
    policy = TeacherForcedPolicy(renderer.tokenizer, lambda obs, eps: [texts[eps[0].num_turns]])
    episode = Episode(task_id=where)
    for i in turns:
        # the observation holds the assistant's earlier turns as the template renders them
        obs = {"messages": messages[:i], "tools": tools or []}
        try:
            policy.act([obs], episodes=[episode])
        except ValueError as exc:
            raise SFTDataError(f"{where}: messages[{i}]: {exc}") from None
    return episode


def file_examples(paths: Sequence[str | Path], tokenizer: Any) -> tuple[list[Episode], DataStats]:
    """Every record of the files, as episodes (``task_id``: ``"<file>:<line or record>"``)."""
    renderer = ChatRenderer(tokenizer)
    episodes = []
    for path in paths:
        for where, rec in read_records(path):
            messages, tools = record_conversation(rec, where)
            episodes.append(conversation_episode(renderer, messages, tools, where))
    if not episodes:
        raise SFTDataError(f"no records in {', '.join(map(str, paths))}")
    return episodes, DataStats()


def truncate(episodes: list[Episode], max_length: int | None) -> int:
    """Cut episodes longer than ``max_length`` tokens (in place); returns how many were cut."""
    if not max_length:
        return 0
    cut = 0
    for e in episodes:
        if len(e.token_ids) > max_length:
            del e.token_ids[max_length:], e.loss_mask[max_length:], e.logprobs[max_length:]
            cut += 1
    return cut


def summarize(episodes: Sequence[Episode], stats: DataStats) -> DataStats:
    """``stats`` with the counts of ``episodes`` filled in."""
    stats.examples = len(episodes)
    stats.tokens = sum(len(e.token_ids) for e in episodes)
    # the first token is never a target: only tokens after it count as trained
    stats.trained_tokens = sum(sum(e.loss_mask[1:]) for e in episodes)
    return stats
