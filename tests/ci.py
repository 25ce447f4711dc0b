"""An optional part a test needs is missing: skip with the reason, or fail under CI.

A developer's quick loop may lack a venv or an extra; CI (``CI=true``, ``1`` or ``yes``) builds
them all, so there a missing part is a failure and no test skips silently.
"""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Skip with ``reason``, or fail under CI, where every optional part is built."""
    if in_ci():
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)
