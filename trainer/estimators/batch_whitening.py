"""The final batch normalisation of a combined advantage, as the authors' training stacks do it.

Estimators that combine per-reward advantages and then normalise over the batch (DARA, RVPO)
were run by their authors on two stacks that normalise differently:

- ``tokens``: verl's ``masked_whiten`` over the response tokens (the DARA repository's
  tool-calling stack): every token of a response carries the response's advantage, the mean and
  the sample variance (``T - 1`` for T tokens) are over all tokens of the batch, and the result is
  ``(x - mean) / sqrt(var + whiten_eps)``. Long responses weigh more. Without the responses' token
  counts every response counts as one token: the same formula over responses.
- ``responses``: ``(x - mean) / (std + eps)`` over responses, sample std (the DARA repository's
  math stack, and this package's GDPO);
- ``none``: no batch normalisation.

The normalisation is affine in the combined advantage, so it splits into per-reward parts exactly:
part k is ``(x_ik - mean x_k) * scale``, the means weighted as the normalisation weighs responses.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from trainer.estimators.parts import standardised

__all__ = ["NORMALISATIONS", "check_normalisation", "check_token_counts", "normalised"]

#: The final batch normalisations (module docstring).
NORMALISATIONS = ("tokens", "responses", "none")


def check_normalisation(normalise: str, estimator: str) -> str:
    """``normalise`` if it is one of :data:`NORMALISATIONS`, else ValueError naming ``estimator``."""
    if normalise not in NORMALISATIONS:
        raise ValueError(
            f"{estimator} option normalise must be 'tokens', 'responses' or 'none', got {normalise!r}"
        )
    return normalise


def check_token_counts(
    token_counts: Any, n: int, estimator: str, device: torch.device | None = None
) -> torch.Tensor | None:
    """``[N]`` float64 token counts of the responses on ``device``, or None; ValueError unless finite and > 0."""
    if token_counts is None:
        return None
    if isinstance(token_counts, torch.Tensor):
        counts = token_counts.detach().to(device=device, dtype=torch.float64)
    else:
        counts = torch.as_tensor(np.asarray(token_counts, dtype=np.float64), device=device)
    if counts.shape != (n,):
        raise ValueError(
            f"{estimator} option token_counts must have shape [N] = [{n}], got {tuple(counts.shape)}"
        )
    if not (torch.isfinite(counts).all() and (counts > 0).all()):
        raise ValueError(f"{estimator} option token_counts must be finite numbers > 0")
    return counts


def normalised(
    x: torch.Tensor,
    valid: torch.Tensor,
    normalise: str,
    *,
    token_counts: torch.Tensor | None = None,
    eps: float,
    whiten_eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Parts ``[N, K]`` of the batch-normalised total ``sum_k x_ik`` and the factor ``scale`` ``[]``.

    ``x`` ``[N, K]`` are the parts of the combined advantage; only the ``valid`` rows enter the
    batch statistics (the others are 0 and stay 0 up to the mean shift, which the caller masks).
    ``eps`` is the ``responses`` normalisation's, ``whiten_eps`` the ``tokens`` one's.
    """
    if normalise == "none":
        return x, x.new_ones(())
    if normalise == "responses":
        return standardised(x, valid, eps)
    weight = valid.to(x.dtype) if token_counts is None else torch.where(valid, token_counts, 0.0)
    tokens = weight.sum()
    mean = weight @ x / tokens.clamp(min=1.0)  # [K]; the mean of the total is its sum
    total = x.sum(dim=1) - mean.sum()
    # verl's Bessel correction is over tokens; one token alone has nothing to whiten
    var = (weight * total.square()).sum() / (tokens - 1.0) if tokens > 1 else x.new_zeros(())
    scale = 1.0 / torch.sqrt(var + whiten_eps)
    if not math.isfinite(float(scale)):  # whiten_eps = 0 on a constant batch
        scale = x.new_zeros(())
    return (x - mean) * scale, scale
