"""Suite-wide settings: hypothesis draws the same examples on every run.

A property test that found a new counterexample on each CI run would make the suite's
verdict depend on chance; ``derandomize`` seeds each test's draws from the test itself.
To search afresh while working on the math: ``HYPOTHESIS_PROFILE=explore pytest ...``.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("deterministic", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))
