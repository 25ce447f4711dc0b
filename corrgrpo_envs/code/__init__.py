"""The code-generation domain: ``corrgrpo/Code-v0`` and its data sets."""

from corrgrpo_envs.code.datasets import DATASETS

__all__ = ["DATASETS"]
