"""AgentDojo: agent utility versus security under prompt injection.

An episode is one AgentDojo case: a user task of a suite (workspace, travel,
banking, slack), optionally with an injection task whose attack text is planted
in the data the tools return. The agent acts in several turns with Hermes tool
calls; AgentDojo's own runtime executes them on the suite's state and AgentDojo's
own checks score the final state and answer.

``env.py`` the env, ``rewards.py`` the two rewards (``REWARD_NAMES``),
``datasets.py`` the case sources (``DATASETS``), ``metrics.py`` utility, attack
success rate and joint accuracy; ``cases.py``, ``attacks.py``, ``episode.py``
and ``clock.py`` hold the AgentDojo plumbing.

Nothing here imports ``agentdojo`` at module import time: the package pulls the
LLM client SDKs of every provider, so it is loaded only when an env is made or
cases are enumerated.
"""

from corrgrpo_envs.agentdojo.cases import (
    DEFAULT_ATTACKS,
    DEFAULT_BENCHMARK_VERSION,
    Case,
    enumerate_cases,
)
from corrgrpo_envs.agentdojo.datasets import DATASETS
from corrgrpo_envs.agentdojo.metrics import agentdojo_metrics
from corrgrpo_envs.agentdojo.rewards import REWARD_NAMES

__all__ = [
    "DATASETS",
    "REWARD_NAMES",
    "DEFAULT_ATTACKS",
    "DEFAULT_BENCHMARK_VERSION",
    "Case",
    "enumerate_cases",
    "agentdojo_metrics",
]
