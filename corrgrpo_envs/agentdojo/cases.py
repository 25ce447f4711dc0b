"""AgentDojo cases: which user task, which injection task, which attack.

A case id is ``"{suite}/{user_task_id}"`` for a clean case (no injection) and
``"{suite}/{user_task_id}/{injection_task_id}/{attack}"`` for a case under
attack. Enumerating cases only lists the suites' task ids: no environment is
loaded until an episode starts on a case.

The train/eval split groups the cases by user task, as the paper does: the key
``"{suite}:{user_task_id}"`` goes to eval when
``int(sha256(key).hexdigest()[:8], 16) / 2**32 < 0.2``, so the clean case and
every attacked case of one user task land on the same side.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from corrgrpo_envs.tasks import Task, TaskSource

__all__ = [
    "DEFAULT_ATTACKS",
    "DEFAULT_BENCHMARK_VERSION",
    "Case",
    "benchmark_suites",
    "known_attacks",
    "enumerate_cases",
    "case_source",
]

#: The benchmark version of the paper's runs (agentdojo 0.1.35's latest).
DEFAULT_BENCHMARK_VERSION = "v1.2.2"
#: The two attacks of the paper's runs.
DEFAULT_ATTACKS: tuple[str, ...] = ("important_instructions", "tool_knowledge")
#: Attacks of AgentDojo's registry that cannot run unattended.
_INTERACTIVE_ATTACKS = frozenset({"manual"})

_TASK_NUMBER = re.compile(r"_(\d+)$")


@dataclass(frozen=True)
class Case:
    """One AgentDojo case; ``injection_task_id`` and ``attack`` are both None for a clean case."""

    suite: str
    user_task_id: str
    injection_task_id: str | None = None
    attack: str | None = None

    def __post_init__(self) -> None:
        if (self.injection_task_id is None) != (self.attack is None):
            raise ValueError("a case has both an injection task and an attack, or neither")
        for part in (self.suite, self.user_task_id, self.injection_task_id, self.attack):
            if part is not None and (not part or "/" in part):
                raise ValueError(f"case id parts must be non-empty and free of '/', got {part!r}")

    @property
    def id(self) -> str:
        if self.injection_task_id is None:
            return f"{self.suite}/{self.user_task_id}"
        return f"{self.suite}/{self.user_task_id}/{self.injection_task_id}/{self.attack}"

    @property
    def attacked(self) -> bool:
        return self.injection_task_id is not None

    @property
    def split_key(self) -> str:
        """The key hashed for the train/eval split: the user task, so families never straddle."""
        return f"{self.suite}:{self.user_task_id}"

    @classmethod
    def from_id(cls, case_id: str) -> Case:
        """Parse ``"suite/user_task"`` or ``"suite/user_task/injection_task/attack"``."""
        parts = str(case_id).split("/")
        if len(parts) == 2:
            return cls(parts[0], parts[1])
        if len(parts) == 4:
            return cls(parts[0], parts[1], parts[2], parts[3])
        raise ValueError(
            f"AgentDojo case id must be 'suite/user_task_id' or "
            f"'suite/user_task_id/injection_task_id/attack', got {case_id!r}"
        )

    def to_task(self, benchmark_version: str) -> Task:
        data: dict[str, Any] = {
            "benchmark_version": benchmark_version,
            "suite": self.suite,
            "user_task_id": self.user_task_id,
            "injection_task_id": self.injection_task_id,
            "attack": self.attack,
        }
        return Task(id=self.id, data=data)


def _task_order(task_id: str) -> tuple[int, str]:
    match = _TASK_NUMBER.search(task_id)
    return (int(match.group(1)) if match else 1 << 30, task_id)


def benchmark_suites(benchmark_version: str = DEFAULT_BENCHMARK_VERSION) -> dict[str, Any]:
    """AgentDojo's ``{suite name: TaskSuite}`` of a benchmark version (imports agentdojo)."""
    from agentdojo.task_suite.load_suites import _SUITES, get_suites

    # _SUITES is a defaultdict: an unknown version silently yields no suites.
    if benchmark_version not in _SUITES:
        raise ValueError(
            f"unknown AgentDojo benchmark version {benchmark_version!r}; known: {sorted(_SUITES)}"
        )
    return dict(get_suites(benchmark_version))


def known_attacks() -> list[str]:
    """Names of the attacks in AgentDojo's registry that run unattended."""
    import agentdojo.attacks  # noqa: F401  (registers the built-in attacks)
    from agentdojo.attacks.attack_registry import ATTACKS

    return sorted(set(ATTACKS) - _INTERACTIVE_ATTACKS)


def enumerate_cases(
    benchmark_version: str = DEFAULT_BENCHMARK_VERSION,
    suites: Sequence[str] | None = None,
    attacks: Sequence[str] = DEFAULT_ATTACKS,
    include_clean: bool = True,
) -> list[Case]:
    """Every case of the selected suites: per user task, its clean case then each
    injection task x attack, in AgentDojo's task-number order. Cheap: loads no environment.
    """
    available = benchmark_suites(benchmark_version)
    names = list(available) if suites is None else list(_as_list(suites, "suites"))
    unknown = [s for s in names if s not in available]
    if unknown:
        raise ValueError(
            f"unknown suite(s) {unknown} in AgentDojo {benchmark_version}; known: {list(available)}"
        )
    attack_names = list(_as_list(attacks, "attacks"))
    if attack_names:
        registry = known_attacks()
        bad = [a for a in attack_names if a not in registry]
        if bad:
            raise ValueError(f"unknown or interactive attack(s) {bad}; known: {registry}")
    if len(set(attack_names)) != len(attack_names):
        raise ValueError(f"attacks must be distinct, got {attack_names}")
    if not include_clean and not attack_names:
        raise ValueError("no cases: include_clean=False and no attacks")
    cases: list[Case] = []
    for name in names:
        suite = available[name]
        injection_ids = sorted(suite.injection_tasks, key=_task_order)
        for user_id in sorted(suite.user_tasks, key=_task_order):
            if include_clean:
                cases.append(Case(name, user_id))
            for injection_id in injection_ids:
                for attack in attack_names:
                    cases.append(Case(name, user_id, injection_id, attack))
    return cases


def _as_list(value: str | Iterable[str], what: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    items = list(value)
    if not all(isinstance(v, str) for v in items):
        raise ValueError(f"{what} must be names (str), got {items!r}")
    return items


def case_source(
    cases: Iterable[Case],
    benchmark_version: str = DEFAULT_BENCHMARK_VERSION,
    name: str = "agentdojo",
    eval_fraction: float = 0.2,
) -> TaskSource:
    """A :class:`TaskSource` of cases, split by user task (``"suite:user_task_id"``)."""
    return TaskSource(
        [c.to_task(benchmark_version) for c in cases],
        name=name,
        split_key=lambda t: f"{t['suite']}:{t['user_task_id']}",
        eval_fraction=eval_fraction,
    )
