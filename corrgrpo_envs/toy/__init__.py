"""The toy domain: rewards of very different scales and correlations (``corrgrpo/ScaleDominance-v0``)."""

from corrgrpo_envs.toy.env import ScaleDominanceEnv, score_anchor_text, score_text

__all__ = ["ScaleDominanceEnv", "score_anchor_text", "score_text"]
