"""The toy domain: rewards of very different scales and correlations (``corrgrpo/ScaleDominance-v0``).

``env.py`` the env, ``rewards.py`` the reward functions and names, ``datasets.py``
the prompts, ``metrics.py`` the evaluation metrics.
"""

from corrgrpo_envs.toy.datasets import DATASETS
from corrgrpo_envs.toy.env import ScaleDominanceEnv
from corrgrpo_envs.toy.metrics import toy_metrics
from corrgrpo_envs.toy.rewards import REWARD_NAMES, score_anchor_text, score_text

__all__ = ["ScaleDominanceEnv", "DATASETS", "REWARD_NAMES", "score_anchor_text", "score_text", "toy_metrics"]
