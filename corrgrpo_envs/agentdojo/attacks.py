"""Attacks from AgentDojo's registry, built without an LLM pipeline.

AgentDojo builds an attack against a target pipeline, and several attacks
(``important_instructions``, ``tool_knowledge``, the DoS family) address the
victim model by a name derived from the pipeline's name; an unknown name raises.
We have no pipeline (the policy is trained outside AgentDojo), so the attack is
built against a stub pipeline named ``"local"`` (AgentDojo's name for a locally
served model, which maps to ``"Local model"``), and the model name written into
the attack text is then set to ``model_name`` (default ``"Local model"``, what
AgentDojo itself writes when it attacks a local model).
"""

from __future__ import annotations

import threading
from typing import Any

from corrgrpo_envs.agentdojo.cases import Case

__all__ = ["DEFAULT_MODEL_NAME", "load_attack", "case_injections", "clear_caches"]

#: The victim's name in the attack text: AgentDojo's own name for a local model.
DEFAULT_MODEL_NAME = "Local model"
#: A pipeline name that AgentDojo's model-name table knows (maps to "Local model").
_STUB_PIPELINE_NAME = "local"

_LOCK = threading.Lock()
_ATTACKS: dict[tuple[str, str, str, str], Any] = {}
_INJECTIONS: dict[tuple[str, str, str], dict[str, str]] = {}
_CANDIDATES: dict[tuple[str, str, str], list[str]] = {}


def _stub_pipeline() -> Any:
    from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement

    class StubPipeline(BasePipelineElement):
        """Stands in for the attacked pipeline; attacks only read its ``name``."""

        name = _STUB_PIPELINE_NAME

        def query(self, query, runtime, env=None, messages=(), extra_args=None):  # type: ignore[override]
            raise NotImplementedError("the stub pipeline only names the attacked model")

    return StubPipeline()


def load_attack(
    suite: Any, benchmark_version: str, attack: str, model_name: str = DEFAULT_MODEL_NAME
) -> Any:
    """AgentDojo's attack ``attack`` on ``suite`` (cached: its injection candidates are memoised)."""
    key = (benchmark_version, suite.name, attack, model_name)
    with _LOCK:
        cached = _ATTACKS.get(key)
    if cached is not None:
        return cached
    import agentdojo.attacks  # noqa: F401  (registers the built-in attacks)
    from agentdojo.attacks.attack_registry import load_attack as agentdojo_load_attack
    from agentdojo.attacks.base_attacks import BaseAttack

    built = agentdojo_load_attack(attack, suite, _stub_pipeline())
    if hasattr(built, "model_name"):
        built.model_name = model_name
    if type(built).get_injection_candidates is BaseAttack.get_injection_candidates:
        # Which injection vectors a user task's ground truth reads does not depend on
        # the attack: compute it once per user task for all attacks.
        built.get_injection_candidates = _SharedCandidates(built, benchmark_version)
    with _LOCK:
        return _ATTACKS.setdefault(key, built)


class _SharedCandidates:
    """AgentDojo's ``get_injection_candidates`` of one attack, memoised across attacks."""

    def __init__(self, attack: Any, benchmark_version: str):
        self.attack = attack
        self.benchmark_version = benchmark_version

    def __call__(self, user_task: Any) -> list[str]:
        from agentdojo.attacks.base_attacks import BaseAttack

        key = (self.benchmark_version, self.attack.task_suite.name, user_task.ID)
        with _LOCK:
            cached = _CANDIDATES.get(key)
        if cached is None:
            cached = BaseAttack.get_injection_candidates.__wrapped__(self.attack, user_task)
            with _LOCK:
                _CANDIDATES[key] = cached
        return list(cached)


def clear_caches() -> None:
    """Forget built attacks, injection candidates and injections (for cold benchmarks)."""
    with _LOCK:
        _ATTACKS.clear()
        _INJECTIONS.clear()
        _CANDIDATES.clear()


def case_injections(
    suite: Any, case: Case, benchmark_version: str, model_name: str = DEFAULT_MODEL_NAME
) -> dict[str, str]:
    """The ``{injection vector: text}`` AgentDojo plants for an attacked case (``{}`` when clean)."""
    if not case.attacked:
        return {}
    key = (benchmark_version, case.id, model_name)
    with _LOCK:
        cached = _INJECTIONS.get(key)
    if cached is not None:
        return dict(cached)
    attack = load_attack(suite, benchmark_version, case.attack, model_name)
    user_task = suite.get_user_task_by_id(case.user_task_id)
    injection_task = suite.get_injection_task_by_id(case.injection_task_id)
    injections = dict(attack.attack(user_task, injection_task))
    with _LOCK:
        _INJECTIONS[key] = injections
    return dict(injections)
