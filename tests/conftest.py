"""Suite-wide settings: hypothesis draws the same examples on every run.

A property test that found a new counterexample on each CI run would make the suite's
verdict depend on chance; ``derandomize`` seeds each test's draws from the test itself.
To search afresh while working on the math: ``HYPOTHESIS_PROFILE=explore pytest ...``.
Neither profile has a per-example deadline (hypothesis's default is 200 ms of wall time,
which a loaded 2-core machine breaks); the per-test timeout catches a hang instead.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("deterministic", derandomize=True, database=None, deadline=None)
settings.register_profile("explore", derandomize=False, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))
