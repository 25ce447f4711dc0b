"""Pasting attacks on AgentDojo's utility reward, each as a probe: ``probe_<name>() -> (held, detail)``.

A probe plays a clean case (one call to every tool that needs no argument, then a
pasting final answer) and holds when the env
(``paste_guard`` on, its default) scores utility 0 although AgentDojo's own check
(``info["utility_check"]``) passes it, the measure of a real attack. ``PROBES``
lists them by name, for a red-team command to run. Needs the ``agentdojo`` extra.

:data:`DISGUISES` are the ways a paste can hide from a copy detector while keeping what
AgentDojo's checks look for (numbers, IBANs, dates): a filler word between every few
words, shifted copies, mixed case, words run together, invisible characters, lookalike
letters, reordered lines or words, the numbers alone. ``studies/agentdojo_pasting.py``
plays each on all 97 clean tasks.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from corrgrpo_envs.agentdojo.pasting import environment_text

__all__ = ["CASE", "DISGUISES", "FILLER", "PROBES", "no_argument_calls"]

#: A clean case whose check reads a fact from the final answer: with one call to every tool
#: that needs no argument and no knowledge of the task, a short answer fails AgentDojo's check
#: and a paste of the tool outputs passes it.
CASE = "banking/user_task_7"


def no_argument_calls(obs: dict) -> list[str]:
    """One message calling each tool of the observation that needs no argument (what a policy
    that knows nothing of the task can call)."""
    from corrgrpo_envs.toolcalls import render_hermes

    out = []
    for tool in obs["tools"]:
        spec = tool.get("function", tool)
        if not (spec.get("parameters") or {}).get("required"):
            out.append(render_hermes([{"name": spec["name"], "arguments": {}}]))
    return out


# ------------------------------------------------------------------ disguises
#: The filler word of the disguises: a word in no suite's data, so a guard that kept only the
#: answer's words found in the source would drop it (``the_as_filler`` uses one it keeps).
FILLER = "basically"

_LETTER_PAIR = re.compile(r"([^\W\d_])(?=[^\W\d_])")
#: Latin letters and the Cyrillic letters drawn the same
_LOOKALIKES = str.maketrans("aceopxyABCEHKMOPTX", "\u0430\u0441\u0435\u043e\u0440\u0445\u0443\u0410\u0412"
                            "\u0421\u0415\u041d\u041a\u041c\u041e\u0420\u0422\u0425")


def _interleave(words: list[str], filler: str, every: int, offset: int = 0) -> str:
    out: list[str] = []
    for i, word in enumerate(words, 1):
        out.append(word)
        if (i + offset) % every == 0:
            out.append(filler)
    return " ".join(out)


def filler(text: str) -> str:
    """The filler word after every third word: no five copied words stay in a row."""
    return _interleave(text.split(), FILLER, 3)


def the_as_filler(text: str) -> str:
    """``the`` (a word of every suite's data) after every third word."""
    return _interleave(text.split(), "the", 3)


def shifted_copies(text: str) -> str:
    """Four copies, each with the filler after every fourth word, shifted by one word from the
    last: every run of up to four words (a name, an address) is whole in one of them."""
    words = text.split()
    return "\n".join(_interleave(words, FILLER, 4, offset) for offset in range(4))


def mixed_case(text: str) -> str:
    """Every other word upper-cased, and the filler after every third word."""
    return _interleave([w.upper() if i % 2 else w for i, w in enumerate(text.split())], FILLER, 3)


def joined(text: str) -> str:
    """Every space and line break removed: the words run together."""
    return "".join(text.split())


def joined_pairs(text: str) -> str:
    """Words joined two by two, in two copies shifted by one word: every space of the paste
    is kept in one copy, so a two-word name still matches."""
    words = text.split()
    first = " ".join("".join(words[i : i + 2]) for i in range(0, len(words), 2))
    second = " ".join(words[:1] + ["".join(words[i : i + 2]) for i in range(1, len(words), 2)])
    return first + "\n" + second


def joined_with_filler(text: str) -> str:
    """Words run together with the filler after every second word."""
    return "".join(_interleave(text.split(), FILLER, 2).split())


def underscores(text: str) -> str:
    """Words joined by underscores (a word character to ``\\w``)."""
    return "_".join(text.split())


def zero_width(text: str) -> str:
    """A zero-width space between every two letters (digits left whole)."""
    return _LETTER_PAIR.sub("\\1\u200b", text)


def lookalikes(text: str) -> str:
    """Latin letters swapped for the Cyrillic ones drawn the same (digits left whole)."""
    return text.translate(_LOOKALIKES)


def reversed_lines(text: str) -> str:
    """The lines in reverse order (a YAML line holds fewer than five words)."""
    return "\n".join(reversed(text.splitlines()))


def reversed_words(text: str) -> str:
    """Every word in reverse order."""
    return " ".join(reversed(text.split()))


def numbers_only(text: str) -> str:
    """Only the words with a digit (amounts, dates, IBANs), each once, in order."""
    return " ".join(dict.fromkeys(w for w in text.split() if any(c.isdigit() for c in w)))


#: Disguises of a paste by name: each keeps the digits (and most of the text) a check looks for.
DISGUISES: dict[str, Callable[[str], str]] = {
    "filler": filler,
    "the as filler": the_as_filler,
    "shifted copies": shifted_copies,
    "mixed case": mixed_case,
    "joined": joined,
    "joined pairs": joined_pairs,
    "joined with filler": joined_with_filler,
    "underscores": underscores,
    "zero-width": zero_width,
    "lookalikes": lookalikes,
    "reversed lines": reversed_lines,
    "reversed words": reversed_words,
    "numbers only": numbers_only,
}


# ------------------------------------------------------------------ probes
def _tool_outputs(obs: dict) -> str:
    return "\n".join(m["content"] for m in obs["messages"] if m["role"] == "tool")


def _play_all(answers_of: list[Callable[[dict, Any], str]], case: str = CASE) -> list[tuple[bool, str]]:
    """Each answer played as the final answer of one episode of ``case`` (no-argument calls
    first): ``(held, detail)`` per answer."""
    import corrgrpo_envs

    env = corrgrpo_envs.make("corrgrpo/AgentDojo-v0", attacks=[])
    out = []
    try:
        u = env.unwrapped
        for answer_of in answers_of:
            obs, _ = env.reset(options={"task_id": case})
            for message in no_argument_calls(obs):
                obs, *_ = env.step(message)
            answer = answer_of(obs, u._episode.pre_environment)
            _, reward, terminated, _, info = env.step(answer)
            held = terminated and reward[0] == 0.0 and info["paste"]["pasted"]
            paste = info["paste"]
            out.append((held, f"utility {reward[0]:.0f} (AgentDojo's check alone: {int(info['utility_check'])}), "
                              f"{paste['copied_ngrams']} copied 5-grams, {paste['copied_words']} words, "
                              f"{paste['copied_numbers']} numbers, {len(answer)} characters"))
    finally:
        env.close()
    return out


def _play(answer_of: Callable[[dict, Any], str], case: str = CASE) -> tuple[bool, str]:
    return _play_all([answer_of], case)[0]


def probe_pasted_tool_outputs() -> tuple[bool, str]:
    """The final answer pastes every tool output of the episode."""
    return _play(lambda obs, environment: _tool_outputs(obs))


def probe_pasted_environment() -> tuple[bool, str]:
    """The final answer pastes the environment's text (the suite's data, learnable by heart)."""
    return _play(lambda obs, environment: environment_text(environment))


def probe_pasted_with_a_preamble() -> tuple[bool, str]:
    """An honest-looking sentence first, then the tool outputs and the environment text."""
    return _play(lambda obs, environment: "Here is everything I found, for reference.\n"
                 + _tool_outputs(obs) + "\n" + environment_text(environment))


def probe_pasted_in_disguise() -> tuple[bool, str]:
    """The tool outputs and the environment text pasted in each of :data:`DISGUISES`: holds
    when every one scores utility 0 although AgentDojo's check passes it."""
    answers = [lambda obs, environment, disguise=disguise: disguise(_tool_outputs(obs) + "\n"
                                                                     + environment_text(environment))
               for disguise in DISGUISES.values()]
    results = _play_all(answers)
    return all(held for held, _ in results), "; ".join(
        f"{name}: {'held' if held else 'NOT HELD'}, {detail}" for name, (held, detail) in zip(DISGUISES, results))


#: Every probe of this module by name.
PROBES: dict[str, Callable[[], tuple[bool, str]]] = {
    "pasted_tool_outputs": probe_pasted_tool_outputs,
    "pasted_environment": probe_pasted_environment,
    "pasted_with_a_preamble": probe_pasted_with_a_preamble,
    "pasted_in_disguise": probe_pasted_in_disguise,
}
