"""Reading what an OpenEnv server sends: its reward spec, task listing, action schema and the
parts of a reset or step, each checked (a malformed part is refused with one message saying
what it is); and the text an observation shows or an action carries.

Pure functions: nothing here talks to a server (:mod:`~corrgrpo_envs.integrations.openenv_discovery`
does, and :mod:`~corrgrpo_envs.integrations.openenv_rewards` checks a step's rewards with them).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from corrgrpo_envs.integrations.openenv_remote import RemoteEnvError, RemoteRewardError, _BadAnswer
from corrgrpo_envs.spaces import Conversation

__all__ = ["FLOAT32_MAX", "mcp_tool_call"]

#: Rewards, bounds and weights are stored as float32: a larger finite value would become inf.
FLOAT32_MAX = float(np.finfo(np.float32).max)
_FIX = (
    "set env.reward_names (and env.reward_low / env.reward_high) in the config to the components to expect"
)


# ------------------------------------------------------------------ numbers and specs
def _number(value: Any, what: str, allow_infinite: bool = False) -> float:
    """``value`` as a float that float32 holds as the same kind of number, or ``ValueError`` saying why.

    NaN is refused, infinities unless ``allow_infinite`` (an unbounded bound), and finite
    values beyond float32's range (they would be stored as infinities).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} is {value!r:.80}, not a number")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        raise ValueError(
            f"{what} = an integer of {value.bit_length()} bits is beyond float32's range "
            f"(±{FLOAT32_MAX:.3g})"
        ) from None
    if math.isnan(number) or (math.isinf(number) and not allow_infinite):
        raise ValueError(f"{what} is {number}")
    if math.isfinite(number) and abs(number) > FLOAT32_MAX:
        raise ValueError(
            f"{what} = {number:.6g} is beyond float32's range (±{FLOAT32_MAX:.3g}); "
            "the env stores float32"
        )
    return number


def _bounds(
    names: Sequence[str], low: Sequence[Any], high: Sequence[Any], where: str
) -> tuple[list[float], list[float]]:
    """Checked bounds: one per name, numbers float32 holds (±inf: unbounded), low <= high."""
    k = len(names)
    for key, given in (("reward_low", low), ("reward_high", high)):
        if len(given) != k:
            raise ValueError(
                f"{where}: {key} has {len(given)} values for the {k} components {list(names)}"
            )
    lo = [_number(v, f"{where}: reward_low of {n!r}", allow_infinite=True) for n, v in zip(names, low)]
    hi = [_number(v, f"{where}: reward_high of {n!r}", allow_infinite=True) for n, v in zip(names, high)]
    for n, a, b in zip(names, lo, hi):
        if a > b:
            raise ValueError(f"{where}: component {n!r} has reward_low {a:g} above reward_high {b:g}")
    return lo, hi


def _spec(published: Any, where: str) -> list[tuple[str, Any, Any, Any]]:
    """A server's ``[{name, low, high, weight}, ...]`` as tuples, or ``ValueError``."""
    if not isinstance(published, list) or not all(
        isinstance(r, Mapping) and isinstance(r.get("name"), str) for r in published
    ):
        raise ValueError(f"{where}: reward_components is not a list of {{name, low, high, weight}}")
    return [
        (r["name"], r.get("low", -math.inf), r.get("high", math.inf), r.get("weight", 1.0))
        for r in published
    ]


def _task_ids(listed: Any) -> list[str]:
    """The ids of OpenEnv's task listing (``{"tasks": [{"id": ...} | id, ...]}``)."""
    tasks = listed.get("tasks") if isinstance(listed, Mapping) else None
    if not isinstance(tasks, list):
        raise _BadAnswer("a task listing without a list of tasks")
    ids = []
    for t in tasks:
        tid = t.get("id") if isinstance(t, Mapping) else t
        if not isinstance(tid, (str, int)) or isinstance(tid, bool):
            raise _BadAnswer(f"a task listing with a task {t!r:.80}")
        ids.append(str(tid))
    return ids


# ------------------------------------------------------------------ resets and steps
def _metadata(result: Any) -> Mapping[str, Any]:
    meta = result.metadata
    if meta is None:
        meta = result.observation.get("metadata")
    if meta is None:
        return {}
    if not isinstance(meta, Mapping):
        raise _BadAnswer(f"metadata that is not an object ({type(meta).__name__})")
    return meta


def _checked(result: Any) -> Any:
    """A reset/step result whose parts have OpenEnv's types (else :class:`_BadAnswer`)."""
    if not isinstance(result.observation, Mapping):
        raise _BadAnswer(f"an observation that is not an object ({type(result.observation).__name__})")
    _metadata(result)
    if not isinstance(result.done, bool):
        raise _BadAnswer(f"done = {result.done!r:.40}, not a boolean")
    obs = result.observation
    if "messages" in obs and not Conversation().contains(
        {"messages": obs["messages"], "tools": obs.get("tools", [])}
    ):
        raise _BadAnswer("messages that are not a conversation")
    return result


def _components_in(meta: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """Where a step's named components are, and them (``None``: the step has only its scalar)."""
    for key in ("reward_components", "rubric_scores"):
        if isinstance(meta.get(key), Mapping) and meta[key]:  # an empty map names nothing
            return f"metadata[{key!r}]", meta[key]
    return None


def _lie(where: str, reason: str) -> RemoteRewardError:
    """A reward that breaks the declared components, at ``where`` (server and task)."""
    return RemoteRewardError(f"{where}: {reason}", reason)


# ------------------------------------------------------------- text and actions
def _text_field(action_schema: Mapping[str, Any], server: str) -> str:
    """The action's one required string field (``message`` for ``corrgrpo serve``, ``openenv init``)."""
    props = action_schema.get("properties", {})
    props = props if isinstance(props, Mapping) else {}
    required = action_schema.get("required", [])
    required = [k for k in (required if isinstance(required, list) else []) if k != "metadata"]
    strings = [
        k for k in (required or list(props))
        if isinstance(props.get(k), Mapping) and props[k].get("type") == "string"
    ]
    if len(strings) == 1:
        return str(strings[0])
    raise RemoteEnvError(
        f"OpenEnv server {server}: cannot tell which action field takes the text "
        f"(string fields: {strings or 'none'}); set action_field in the env config"
    )


def _observation_text(observation: Mapping[str, Any], field: str | None) -> str:
    """What a third-party observation says, as a user message."""
    if field is not None:
        return str(observation.get(field, ""))
    shown = {k: v for k, v in observation.items() if k not in ("metadata", "reward", "done")}
    if not shown and isinstance(observation.get("metadata"), Mapping) and observation["metadata"]:
        shown = dict(observation["metadata"])
    if len(shown) == 1:
        return str(next(iter(shown.values())))
    return "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v)}" for k, v in shown.items())


_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def mcp_tool_call(text: str) -> dict[str, Any] | None:
    """An MCP ``call_tool`` action from a tool call written in the text, or ``None`` when there is none.

    The call is the first JSON object ``{"name": ..., "arguments": {...}}`` (``parameters``
    is read as ``arguments``) inside ``<tool_call>...</tool_call>`` (the form the tool-call
    domain and Qwen-style templates write), or the whole text when it is that object.
    """
    blocks = _TOOL_CALL.findall(text) or [text]
    for block in blocks:
        for line in [block.strip(), *block.strip().splitlines()]:
            try:
                call = json.loads(line)
            except (json.JSONDecodeError, ValueError):
                continue
            if isinstance(call, Mapping) and isinstance(call.get("name"), str):
                args = call.get("arguments", call.get("parameters", {}))
                if isinstance(args, Mapping):
                    return {"type": "call_tool", "tool_name": call["name"], "arguments": dict(args)}
    return None
