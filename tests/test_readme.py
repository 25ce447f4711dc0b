"""The README's examples run as written, and its example env trains and evaluates through the CLI."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)


def _polite_block() -> str:
    # a test id, so that docs/envs.md's own myorg/Polite-v0 is left alone
    return next(b for b in _blocks("python") if "PoliteEnv" in b).replace("myorg/Polite-v0", "readmetest/Polite-v0")


def test_readme_tour_runs_and_scores_the_maxima():
    tour = _blocks("python")[0]
    scope: dict = {}
    exec(compile(tour, "README.md", "exec"), scope)
    assert scope["env"].unwrapped.reward_names == ("function_name", "parameter", "values", "format")
    np.testing.assert_allclose(scope["reward"], [0.5, 1.0, 1.5, 1.0])


def test_readme_custom_env_registers_and_steps():
    scope: dict = {}
    exec(compile(_polite_block(), "README.md", "exec"), scope)
    env = scope["env"]
    obs, info = env.reset(seed=0)
    _, reward, terminated, _, info = env.step("Hello there!")
    assert terminated and reward.tolist() == [1.0, 1.0]
    assert info["reward_components"] == {"polite": 1.0, "brief": 1.0}
    u = env.unwrapped
    assert u.reference_action("greet-1") == ["Hello, Alan!"]
    records = [
        {"task_id": "greet-0", "reward_components": {"polite": 1.0, "brief": 1.0}, "info": {}, "text": "Hello"},
        {"task_id": "greet-1", "reward_components": {"polite": 0.0, "brief": 1.0}, "info": {}, "text": "Yo"},
    ]
    assert u.metrics(records) == {"polite": 0.5, "brief": 1.0, "total": 1.0}  # weights 1, 0.5


@pytest.mark.filterwarnings("ignore:.*Overriding environment readmetest/Polite-v0")  # the block ran before
def test_readme_custom_env_trains_and_evaluates_through_the_cli(tmp_path, monkeypatch):
    """The README's env as ``mypkg/envs.py`` and its YAML: ``corrgrpo train`` then ``corrgrpo eval``."""
    from trainer.cli import main

    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "envs.py").write_text(_polite_block(), encoding="utf-8")
    # the README runs the command from the folder holding mypkg/, with no PYTHONPATH
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # main() puts the working directory first
    monkeypatch.delitem(sys.modules, "mypkg", raising=False)
    monkeypatch.delitem(sys.modules, "mypkg.envs", raising=False)
    config = next(b for b in _blocks("yaml") if "PoliteEnv" in b)
    assert yaml.safe_load(config)["env"]["id"] == "mypkg.envs:PoliteEnv"
    path = tmp_path / "polite.yaml"
    path.write_text(config, encoding="utf-8")
    tiny = ["algorithm.group_size=2", "algorithm.prompts_per_step=2", "rollout.max_new_tokens=4",
            "train.progress=false", "train.tensorboard=false"]
    run = tmp_path / "run"
    assert main(["train", str(path), *tiny, "train.steps=1", f"train.output_dir={run}"]) == 0
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["reward_names"] == ["polite", "brief"]
    checkpoint = run / "checkpoint-1"
    assert (checkpoint / "model" / "config.json").exists()

    out = tmp_path / "eval.json"
    assert main(["eval", str(path), *tiny, "--checkpoint", str(checkpoint), "--split", "all",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["tasks"] == 2 and set(result["metrics"]) == {"polite", "brief", "total"}
    for name in ("mypkg", "mypkg.envs"):  # not cached for other tests that write a mypkg
        sys.modules.pop(name, None)
    means = [sum(r["reward_components"][n] for r in result["records"]) / 2 for n in ("polite", "brief")]
    assert result["metrics"]["total"] == means[0] + 0.5 * means[1]
