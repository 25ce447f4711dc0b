"""The names of the ways a loss turns per-token terms into one number.

The modes themselves are :func:`corrgrpo.trainer.losses.aggregate`; the names live here, apart from
torch, so that a config is checked (``algorithm.loss_agg_mode``) before torch is imported.
"""

from __future__ import annotations

__all__ = ["AGG_MODES"]

#: ``token-mean`` (every token counts once), ``seq-mean-token-sum`` (each sequence's sum),
#: ``seq-mean-token-mean`` (each sequence's mean), ``seq-mean-token-sum-norm`` (each sequence's
#: sum over the longest completion allowed: Dr. GRPO's constant normaliser).
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
