"""The code-generation domain: ``corrgrpo/Code-v0`` and its data sets.

``env.py`` the env, ``rewards.py`` the seven rewards (``REWARD_NAMES``),
``datasets.py`` the task sources (``DATASETS``), ``metrics.py`` pass@1 and the
efficiency share; ``verdicts.py`` decides pass/fail on the host from the values
the candidate returned; ``references.py`` caches reference runtimes.
"""

from corrgrpo_envs.code.datasets import DATASETS
from corrgrpo_envs.code.metrics import code_metrics
from corrgrpo_envs.code.rewards import DEFAULT_WEIGHTS, REWARD_NAMES

__all__ = ["DATASETS", "REWARD_NAMES", "DEFAULT_WEIGHTS", "code_metrics"]
