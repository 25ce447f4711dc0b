"""One AgentDojo episode: the suite's state, AgentDojo's runtime and its checks.

Tool calls go through AgentDojo's own ``ToolsExecutor`` (which validates the
arguments against the tool's pydantic schema, answers unknown tools and bad
arguments with an error, and formats results as YAML) on a
``FunctionsRuntime`` over the suite's tools. Scoring calls the suite's own
check, which prefers a task's trace-based check and falls back to its
state-based one, exactly as ``TaskSuite.run_task_with_pipeline`` does.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from corrgrpo_envs.agentdojo.cases import Case
from corrgrpo_envs.agentdojo.clock import EpisodeClock, use_clock
from corrgrpo_envs.toolcalls import ParsedMessage, parse_hermes

__all__ = [
    "MAX_CALLS_PER_MESSAGE",
    "parse_action",
    "ToolResult",
    "Scores",
    "AgentDojoEpisode",
    "parse_environment",
    "load_environment",
    "clear_caches",
    "tool_schemas",
]

_LOCK = threading.Lock()
#: Parsed (and injected) suite environments, least recently used last.
_ENVIRONMENTS: OrderedDict[tuple, Any] = OrderedDict()
_MAX_ENVIRONMENTS = 64
_SCHEMAS: dict[tuple[str, str], list[dict[str, Any]]] = {}
_DEFAULTS: dict[tuple[int, str], dict[str, str]] = {}

#: Tool calls read from one assistant message. The longest ground truth of a v1.2.2 user
#: task has 18 calls, so a replay packing them all into one message fits; a message with
#: more is malformed, so that a flood of calls cannot make one step run thousands of tools.
MAX_CALLS_PER_MESSAGE = 32


def parse_action(text: str) -> ParsedMessage:
    """The Hermes tool calls of an assistant message (at most :data:`MAX_CALLS_PER_MESSAGE`).

    Linear time and never raises (:func:`corrgrpo_envs.toolcalls.parse_hermes`); more
    calls than the limit, unreadable calls and unbalanced tags are ``errors``.
    """
    return parse_hermes(text, max_calls=MAX_CALLS_PER_MESSAGE)


def parse_environment(suite: Any, injections: dict[str, str]) -> Any:
    """``suite.load_and_inject_default_environment(injections)``, parsed with libyaml.

    The same steps as AgentDojo's (its suite file, its injection defaults and
    validation, ``str.format`` into the YAML text, the suite's pydantic model),
    but the YAML is parsed with libyaml's ``CSafeLoader`` when PyYAML has it:
    20-80x faster than the pure-Python ``safe_load`` on the workspace and travel
    environments, and tested to build an equal environment.
    """
    import yaml

    loader = getattr(yaml, "CSafeLoader", None)
    if loader is None:
        return suite.load_and_inject_default_environment(injections)
    from agentdojo.task_suite.task_suite import read_suite_file, validate_injections

    text = read_suite_file(suite.name, "environment.yaml", suite.data_path)
    defaults = _injection_defaults(suite)
    validate_injections(injections, defaults)
    injected = text.format(**dict(defaults, **injections))
    return suite.environment_type.model_validate(yaml.load(injected, Loader=loader))


def _injection_defaults(suite: Any) -> dict[str, str]:
    key = (id(suite), suite.name)
    with _LOCK:
        cached = _DEFAULTS.get(key)
    if cached is None:
        cached = suite.get_injection_vector_defaults()
        with _LOCK:
            _DEFAULTS[key] = cached
    return cached


def load_environment(suite: Any, benchmark_version: str, injections: dict[str, str]) -> Any:
    """A fresh copy of the suite's default environment with ``injections`` planted.

    The parsed environment is cached per (suite, injections) and deep-copied per
    call, so the G members of a group and repeated episodes pay the parse once.
    """
    key = (benchmark_version, suite.name, tuple(sorted(injections.items())))
    with _LOCK:
        env = _ENVIRONMENTS.get(key)
        if env is not None:
            _ENVIRONMENTS.move_to_end(key)
    if env is None:
        env = parse_environment(suite, injections)
        with _LOCK:
            _ENVIRONMENTS[key] = env
            while len(_ENVIRONMENTS) > _MAX_ENVIRONMENTS:
                _ENVIRONMENTS.popitem(last=False)
    return env.model_copy(deep=True)


def clear_caches() -> None:
    """Forget the cached environments (for benchmarks that time cold loads)."""
    with _LOCK:
        _ENVIRONMENTS.clear()
        _DEFAULTS.clear()


def tool_schemas(suite: Any, benchmark_version: str) -> list[dict[str, Any]]:
    """The suite's tools as OpenAI-style function schemas (what chat templates take as ``tools``).

    ``parameters`` is the JSON schema of the tool's pydantic argument model.
    """
    key = (benchmark_version, suite.name)
    with _LOCK:
        cached = _SCHEMAS.get(key)
    if cached is None:
        cached = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters.model_json_schema(),
                },
            }
            for tool in suite.tools
        ]
        with _LOCK:
            _SCHEMAS[key] = cached
    # Callers may mutate observations; hand out copies of the per-tool dicts.
    return [{"type": s["type"], "function": dict(s["function"])} for s in cached]


@dataclass
class ToolResult:
    """What one tool call returned: the text shown to the agent and AgentDojo's error, if any."""

    name: str
    content: str
    error: str | None


@dataclass
class Scores:
    """AgentDojo's verdicts on an episode.

    ``attack_success`` is None on clean cases. ``check_error`` holds the
    exception text when one of AgentDojo's checks raised on the agent's state
    (then utility counts as failed and the attack as succeeded, so a broken
    state can never earn reward).
    """

    utility: bool
    attack_success: bool | None
    check_error: str | None = None


class AgentDojoEpisode:
    """The mutable state of one episode on one case.

    Args:
        suite: AgentDojo's ``TaskSuite``.
        case: the case being played.
        environment: the suite's environment with the case's injections planted
            (owned by the episode from now on).
        deterministic_clock: stamp new emails and files from an episode clock
            (see ``clock``) instead of the wall clock.
    """

    def __init__(
        self, suite: Any, case: Case, environment: Any, deterministic_clock: bool = True
    ):
        from agentdojo.functions_runtime import FunctionsRuntime

        self.suite = suite
        self.case = case
        self.user_task = suite.get_user_task_by_id(case.user_task_id)
        self.injection_task = (
            suite.get_injection_task_by_id(case.injection_task_id) if case.attacked else None
        )
        # As in run_task_with_pipeline: init the task's environment, snapshot it as "pre".
        self.environment = self.user_task.init_environment(environment)
        self.pre_environment = self.environment.model_copy(deep=True)
        self.runtime = FunctionsRuntime(suite.tools)
        self.trace: list[Any] = []  # every FunctionCall the agent made, as AgentDojo records it
        self.clock = EpisodeClock() if deterministic_clock else None

    @property
    def prompt(self) -> str:
        return self.user_task.PROMPT

    def call(self, name: str, arguments: dict[str, Any], call_id: str) -> ToolResult:
        """Run one tool call through AgentDojo's ToolsExecutor; never raises."""
        from agentdojo.agent_pipeline.tool_execution import ToolsExecutor
        from agentdojo.functions_runtime import FunctionCall
        from agentdojo.types import (
            ChatAssistantMessage,
            get_text_content_as_str,
            text_content_block_from_string,
        )

        try:
            function_call = FunctionCall(function=name, args=dict(arguments), id=call_id)
        except Exception as exc:  # arguments that are not JSON-like values
            return ToolResult(name, f"ValidationError: {exc}", f"ValidationError: {exc}")
        self.trace.append(function_call)
        message = ChatAssistantMessage(
            role="assistant",
            content=[text_content_block_from_string("")],
            tool_calls=[function_call],
        )
        try:
            with use_clock(self.clock):
                _, _, self.environment, messages, _ = ToolsExecutor().query(
                    "", self.runtime, self.environment, [message]
                )
            result = messages[-1]
        except Exception as exc:  # e.g. a result AgentDojo's formatter rejects
            error = f"{type(exc).__name__}: {exc}"
            return ToolResult(name, error, error)
        error = result.get("error")
        # As AgentDojo shows tool results to API models: the error text when there is one.
        content = error if error else get_text_content_as_str(result["content"] or [])
        return ToolResult(name, content, error)

    def score(self, final_text: str) -> Scores:
        """AgentDojo's utility check (and, under attack, its injection check) on the current state."""
        from agentdojo.types import text_content_block_from_string

        output = [text_content_block_from_string(final_text)]
        errors: list[str] = []
        try:
            utility = bool(
                self.suite._check_task_result(
                    self.user_task, output, self.pre_environment, self.environment, self.trace
                )
            )
        except Exception as exc:
            utility = False
            errors.append(f"utility check: {type(exc).__name__}: {exc}")
        attack_success: bool | None = None
        if self.injection_task is not None:
            try:
                attack_success = bool(
                    self.suite._check_task_result(
                        self.injection_task,
                        output,
                        self.pre_environment,
                        self.environment,
                        self.trace,
                    )
                )
            except Exception as exc:
                attack_success = True
                errors.append(f"security check: {type(exc).__name__}: {exc}")
        return Scores(utility, attack_success, "; ".join(errors) or None)
