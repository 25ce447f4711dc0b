"""Numeric tolerances derived from the dtype and the size of a reduction, not from one machine.

Two mathematically equal computations in floating point (a shared-prefix pass against a
plain one, two thread counts, two CPUs' kernels) add the same terms in different orders.
Each addition rounds by at most half a unit in the last place, and rounding errors of a
sum of ``n`` terms grow like ``sqrt(n)`` when they are independent (``n`` in the worst
case). A tolerance of ``eps * sqrt(n) * scale`` (times a small safety factor) therefore
holds on any CPU torch supports, while a wrong result (a missing term, a wrong mask) is off
by a sizeable fraction of ``scale`` and still fails.
"""

from __future__ import annotations

import math

import torch


def reduction_atol(dtype: torch.dtype, terms: int, scale: float, safety: float = 4.0) -> float:
    """The absolute tolerance for a sum of ``terms`` values of magnitude about ``scale`` in ``dtype``."""
    return safety * torch.finfo(dtype).eps * math.sqrt(max(int(terms), 1)) * float(scale)


def assert_close_after_reduction(
    actual: torch.Tensor, expected: torch.Tensor, terms: int, name: str = "", safety: float = 4.0
) -> None:
    """``actual`` equals ``expected`` within the rounding of a ``terms``-long reduction in their dtype.

    The scale is the largest magnitude in ``expected`` (the size of the terms the
    reduction added, as far as the result shows it).
    """
    assert actual.shape == expected.shape, (name, actual.shape, expected.shape)
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    atol = reduction_atol(expected.dtype, terms, scale, safety)
    worst = float((actual - expected).abs().max()) if expected.numel() else 0.0
    assert worst <= atol, (
        f"{name}: largest difference {worst:.3e} exceeds {atol:.3e} "
        f"(eps {torch.finfo(expected.dtype).eps:.2e} x sqrt({terms}) x scale {scale:.3e} x {safety})"
    )
