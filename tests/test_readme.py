"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_readme_tour_runs_and_scores_the_maxima():
    tour = _python_blocks()[0]
    scope: dict = {}
    exec(compile(tour, "README.md", "exec"), scope)
    assert scope["env"].unwrapped.reward_names == ("function_name", "parameter", "values", "format")
    np.testing.assert_allclose(scope["reward"], [0.5, 1.0, 1.5, 1.0])


def test_readme_custom_env_registers_and_steps():
    block = next(b for b in _python_blocks() if "PoliteEnv" in b)
    block = block.replace("myorg/Polite-v0", "readmetest/Polite-v0")
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    env = scope["env"]
    obs, info = env.reset(seed=0)
    _, reward, terminated, _, info = env.step("Hello there!")
    assert terminated and reward.tolist() == [1.0, 1.0]
    assert info["reward_components"] == {"polite": 1.0, "brief": 1.0}
