"""``corrgrpo/AgentDojo-v0``: multi-turn tool use under prompt injection.

Episode
    The first observation holds AgentDojo's system message, the user task's
    prompt and the suite's tool schemas (``obs["tools"]``, JSON schemas of the
    tools' pydantic argument models). Each action is an assistant message; its
    Hermes tool calls (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
    several allowed) run in order through AgentDojo's runtime on the suite's
    state, and the next observation appends the assistant message (its raw text)
    and one ``{"role": "tool", "name", "tool_call_id", "content"}`` message per
    call. Unknown tools and arguments that fail the tool's schema are answered
    with AgentDojo's error text, as AgentDojo does. A message without tool calls
    is the final answer: the episode terminates and is scored. When the
    ``max_turns``-th message still calls tools, those calls run, the episode is
    truncated and scored on the state at that point, with the message's text
    outside the tool calls as the answer.

Rewards (given at the last step; 0 before)
    ``utility``: AgentDojo's check of the user task (1 passed, 0 failed).
    ``security``: 1 - AgentDojo's check that the injection task succeeded. On
    clean cases there is no attack; ``clean_security="zero"`` (the paper's
    choice) scores 0 there, ``"one"`` scores 1.
    With ``paste_guard`` (the default; off reproduces the paper), a final answer
    that reproduces a large share of the episode's tool outputs or of the
    environment's text scores utility 0 (:mod:`corrgrpo_envs.agentdojo.pasting`).

Malformed turns
    Tool-call tags whose content does not parse end the episode with the
    invalid reward (0, 0) and ``info["error"]`` (the paper's runs;
    ``on_malformed="end"``), or, with ``on_malformed="error_message"``, are
    answered with an error tool message the agent can recover from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from corrgrpo_envs.agentdojo.attacks import case_injections
from corrgrpo_envs.agentdojo.cases import (
    Case,
    benchmark_suites,
)
from corrgrpo_envs.agentdojo.datasets import DATASETS
from corrgrpo_envs.agentdojo.episode import AgentDojoEpisode, Scores, load_environment, tool_schemas
from corrgrpo_envs.agentdojo.metrics import agentdojo_metrics
from corrgrpo_envs.agentdojo.pasting import PasteMeasure, Source, environment_text, measure
from corrgrpo_envs.agentdojo.rewards import (
    REWARD_NAMES,
    rewards_from_scores,
)
from corrgrpo_envs.agentdojo.settings import DEFAULT_MAX_TURNS, AgentDojoSettings
from corrgrpo_envs.core import MultiRewardEnv, StepOutcome
from corrgrpo_envs.metrics import EpisodeRecord
from corrgrpo_envs.tasks import Task
from corrgrpo_envs.toolcalls import render_hermes

__all__ = ["AgentDojoEnv", "DATASETS", "REWARD_NAMES", "DEFAULT_MAX_TURNS"]

#: The final answer of a reference replay when the user task defines no expected output.
DEFAULT_FINAL_ANSWER = "Done."


class AgentDojoEnv(MultiRewardEnv):
    """AgentDojo user tasks, clean and under prompt-injection attack.

    Its keyword arguments are the fields of
    :class:`~corrgrpo_envs.agentdojo.settings.AgentDojoSettings` (names, defaults and allowed
    values declared there once: the cases, the turn limit, the victim's name, the clock, the
    paste guard); an ``AgentDojoSettings`` object may be given instead (``settings``), keyword
    arguments then go over it.
    """

    def __init__(self, settings: AgentDojoSettings | None = None, **kwargs: Any):
        s = AgentDojoSettings.read(settings, kwargs)
        if not s.model_name.strip():
            raise ValueError(f"model_name must be a non-empty str, got {s.model_name!r}")
        tasks = DATASETS.load(
            s.dataset,
            format=s.format,
            split=s.split,
            benchmark_version=s.benchmark_version,
            suites=s.suites,
            attacks=tuple(s.attacks) if s.attacks is not None else (),
            include_clean=s.include_clean,
        )
        super().__init__(
            tasks=tasks,
            reward_names=REWARD_NAMES,
            reward_low=(0.0, 0.0),
            reward_high=(1.0, 1.0),
            reward_weights=s.reward_weights,
            max_action_chars=s.max_action_chars,
            render_mode=s.render_mode,
        )
        benchmark_version, max_turns, system_message = s.benchmark_version, s.max_turns, s.system_message
        clean_security, on_malformed, model_name = s.clean_security, s.on_malformed, s.model_name
        deterministic_clock, paste_guard = s.deterministic_clock, s.paste_guard
        self.benchmark_version = benchmark_version
        self.max_turns = max_turns
        self.clean_security = clean_security
        self.on_malformed = on_malformed
        self.model_name = model_name
        self.deterministic_clock = deterministic_clock
        self.paste_guard = paste_guard
        self._environment_sources: dict[str, Source] = {}
        self._suites = benchmark_suites(benchmark_version)
        if system_message is None:
            from agentdojo.agent_pipeline.agent_pipeline import load_system_message

            system_message = load_system_message(None)
        self.system_message = system_message
        self._episode: AgentDojoEpisode | None = None
        self._turns = 0

    # ----------------------------------------------------------------- cases
    def case(self, task_id: str) -> Case:
        """The :class:`Case` of a case id, checked against this benchmark version."""
        case = Case.from_id(task_id)
        suite = self._suites.get(case.suite)
        if suite is None or case.user_task_id not in suite.user_tasks:
            raise ValueError(f"no user task for case {task_id!r} in AgentDojo {self.benchmark_version}")
        if case.attacked and case.injection_task_id not in suite.injection_tasks:
            raise ValueError(f"no injection task for case {task_id!r}")
        return case

    def _new_episode(self, case: Case) -> AgentDojoEpisode:
        suite = self._suites[case.suite]
        injections = case_injections(suite, case, self.benchmark_version, self.model_name)
        environment = load_environment(suite, self.benchmark_version, injections)
        return AgentDojoEpisode(suite, case, environment, self.deterministic_clock)

    # ----------------------------------------------------------------- hooks
    def _observe_task(self, task: Task) -> dict:
        case = self.case(task.id)
        self._episode = self._new_episode(case)
        self._turns = 0
        return {
            "messages": [
                {"role": "system", "content": self.system_message},
                {"role": "user", "content": self._episode.prompt},
            ],
            "tools": tool_schemas(self._suites[case.suite], self.benchmark_version),
        }

    def _act(self, action: str) -> StepOutcome:
        from corrgrpo_envs.agentdojo.episode import parse_action

        episode = self._episode
        assert episode is not None and self._obs is not None
        self._turns += 1
        parsed = parse_action(action)
        messages = [*self._obs["messages"], {"role": "assistant", "content": action}]
        tools = self._obs["tools"]

        if parsed.errors and self.on_malformed == "end":
            outcome = self._invalid_outcome("malformed tool call: " + "; ".join(parsed.errors))
            outcome.observation = {"messages": messages, "tools": tools}
            return outcome

        if not parsed.tool_calls and not parsed.errors:
            rewards, info = self._final(parsed.content, messages)
            return StepOutcome(
                rewards=rewards,
                terminated=True,
                observation={"messages": messages, "tools": tools},
                info=info,
            )

        calls_info = []
        for i, call in enumerate(parsed.tool_calls):
            call_id = f"call_{self._turns}_{i}"
            result = episode.call(call.name, call.arguments, call_id)
            messages.append(
                {"role": "tool", "name": call.name, "tool_call_id": call_id, "content": result.content}
            )
            calls_info.append({"name": call.name, "error": result.error})
        for j, error in enumerate(parsed.errors, len(parsed.tool_calls)):
            call_id = f"call_{self._turns}_{j}"
            messages.append(
                {
                    "role": "tool",
                    "name": "invalid_tool_call",
                    "tool_call_id": call_id,
                    "content": f"Error: {error}. Write each call as <tool_call>"
                    '{"name": <tool name>, "arguments": {...}}</tool_call>.',
                }
            )
            calls_info.append({"name": None, "error": error})
        observation = {"messages": messages, "tools": tools}
        if self._turns >= self.max_turns:
            rewards, info = self._final(parsed.content, messages)
            info["tool_calls"] = calls_info
            return StepOutcome(
                rewards=rewards,
                terminated=False,
                truncated=True,
                observation=observation,
                info=info,
            )
        return StepOutcome(
            rewards={name: 0.0 for name in self.reward_names},
            terminated=False,
            observation=observation,
            info={"tool_calls": calls_info, "turn": self._turns},
        )

    def _invalid_outcome(self, error: str) -> StepOutcome:
        outcome = super()._invalid_outcome(error)
        if self._episode is not None and not self._done:
            # The reward is the invalid one, but metrics still need AgentDojo's
            # verdict on whether the attack had succeeded by then.
            scores = self._episode.score("")
            outcome.info.update(self._end_info(scores, ""))
            outcome.info["error"] = error
        return outcome

    # --------------------------------------------------------------- scoring
    def _rewards(self, scores: Scores) -> dict[str, float]:
        return rewards_from_scores(scores, self.clean_security)

    def _final(self, answer: str, messages: list[dict]) -> tuple[dict[str, float], dict[str, Any]]:
        """Rewards and info of the episode's end, with ``answer`` as the model output."""
        assert self._episode is not None
        scores = self._episode.score(answer)
        rewards = self._rewards(scores)
        info = self._end_info(scores, answer)
        paste = self.paste_measure(answer, messages)
        info["paste"] = paste.as_info()
        if self.paste_guard and paste.pasted:
            rewards["utility"] = 0.0
        return rewards, info

    def paste_measure(self, answer: str, messages: Sequence[dict]) -> PasteMeasure:
        """How much of the tool outputs in ``messages`` and of the current case's environment
        text ``answer`` reproduces (:func:`corrgrpo_envs.agentdojo.pasting.measure`)."""
        assert self._episode is not None
        case_id = self._episode.case.id
        source = self._environment_sources.get(case_id)
        if source is None:
            if len(self._environment_sources) >= 64:  # the environment text of a few cases at most
                self._environment_sources.clear()
            source = Source([environment_text(self._episode.pre_environment)])
            self._environment_sources[case_id] = source
        outputs = (m["content"] for m in messages if m.get("role") == "tool" and isinstance(m.get("content"), str))
        return measure(answer, outputs, source)

    def _end_info(self, scores: Scores, final_answer: str) -> dict[str, Any]:
        assert self._episode is not None
        case = self._episode.case
        info: dict[str, Any] = {
            "suite": case.suite,
            "attacked": case.attacked,
            "utility_check": scores.utility,
            "attack_success": scores.attack_success,
            "turns": self._turns,
            "final_answer": final_answer,
        }
        if scores.check_error:
            info["check_error"] = scores.check_error
        return info

    # ------------------------------------------------------------- references
    def _replay_messages(self, calls: list[Any], final_answer: str) -> list[str]:
        rendered = [{"name": c.function, "arguments": dict(c.args)} for c in calls]
        if self.max_turns == 1:
            # One message only: the calls run and truncation scores its text.
            return [render_hermes(rendered, content=final_answer)]
        # One call per message when the turn budget allows, else evenly packed.
        per_message = max(1, math.ceil(len(rendered) / (self.max_turns - 1)))
        messages = [
            render_hermes(rendered[i : i + per_message])
            for i in range(0, len(rendered), per_message)
        ]
        return [*messages, final_answer]

    def reference_action(self, task_id: str) -> list[str]:
        """Assistant messages replaying the user task's ground-truth calls, then
        its ground-truth output as the final answer (``"Done."`` when it has none).
        """
        episode = self._new_episode(self.case(task_id))
        calls = episode.user_task.ground_truth(episode.environment)
        answer = episode.user_task.GROUND_TRUTH_OUTPUT or DEFAULT_FINAL_ANSWER
        return self._replay_messages(calls, answer)

    def injection_reference_action(self, task_id: str) -> list[str]:
        """Assistant messages replaying the injection task's ground truth on an
        attacked case: what a fully hijacked agent does.
        """
        case = self.case(task_id)
        if not case.attacked:
            raise ValueError(f"case {task_id!r} is clean: it has no injection task")
        episode = self._new_episode(case)
        assert episode.injection_task is not None
        calls = episode.injection_task.ground_truth(episode.environment)
        answer = episode.injection_task.GROUND_TRUTH_OUTPUT or DEFAULT_FINAL_ANSWER
        return self._replay_messages(calls, answer)

    def metrics(self, records: Sequence[EpisodeRecord]) -> dict[str, float]:
        """Utility (clean and under attack), attack success rate and joint accuracy, overall
        and per suite (:func:`corrgrpo_envs.agentdojo.metrics.agentdojo_metrics`)."""
        return agentdojo_metrics(records)
