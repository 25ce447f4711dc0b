"""docs/envs.md's registration example runs, and ``corrgrpo envs list`` lists every id."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import corrgrpo_envs
from corrgrpo_envs import commands

DOC = Path(__file__).resolve().parents[1] / "docs" / "envs.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def _block(marker: str) -> str:
    blocks = [b for b in python_blocks(DOC.read_text(encoding="utf-8")) if marker in b]
    assert len(blocks) == 1, marker
    return blocks[0]


def test_registration_example_runs():
    namespace: dict = {}
    exec(compile(_block("class PoliteEnv"), str(DOC), "exec"), namespace)  # the doc's own asserts check it
    env = corrgrpo_envs.make("myorg/Polite-v0", split="all")
    env.reset(options={"task_id": "greet-0"})
    ref = env.unwrapped.reference_action("greet-0")
    assert ref == ["Hello, Ada!"]
    _, reward, *_ = env.step(ref[0])
    assert reward.tolist() == [1.0, 1.0]
    records = [{"task_id": "greet-0", "reward_components": {"polite": 1.0, "brief": 0.0}}]
    assert env.unwrapped.metrics(records) == {"polite": 1.0, "brief": 0.0, "total": 1.0}


@pytest.mark.filterwarnings("ignore:.*The reward returned by `step\\(\\)` must be a float")
def test_adding_a_domain_example_runs():
    """The domain-folder example: its pieces work together and pass the conformance checks."""
    from gymnasium.utils.env_checker import check_env

    namespace: dict = {}
    exec(compile(_block("class ReverseEnv"), str(DOC), "exec"), namespace)  # its asserts check a step
    env = corrgrpo_envs.make("mydomain/Reverse-v0")
    u = env.unwrapped
    assert u.reward_names == namespace["REWARD_NAMES"] and u.task_ids == [f"word-{i}" for i in range(4)]
    records = []
    for task_id, answer in zip(u.task_ids, ["myg", "xx", "rotcev", "group"]):
        env.reset(options={"task_id": task_id})
        _, reward, *_ = env.step(answer)
        records.append({"task_id": task_id, "reward_components": dict(zip(u.reward_names, reward.tolist()))})
    metrics = u.metrics(records)
    assert metrics["solved"] == 0.5 and metrics["exact"] == 0.5
    assert metrics["length"] == pytest.approx(-(0 + 4 + 0 + 0) / 400)
    assert metrics["total"] == pytest.approx(metrics["exact"] + metrics["length"])
    check_env(u, skip_render_check=True)
    tasks = commands.describe_env("myorg/Polite-v0")["tasks"]
    assert tasks["all"] == 3 and tasks["train"] + tasks["eval"] == 3


def test_usage_example_runs():
    block = python_blocks(DOC.read_text(encoding="utf-8"))[0]
    namespace: dict = {}
    exec(compile(block, str(DOC), "exec"), namespace)
    assert namespace["reward"].tolist() == [3.0, 1.0, 1.0]


def test_envs_list_json_and_table(capsys):
    from corrgrpo.trainer.cli import main

    assert main(["envs", "list", "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(corrgrpo_envs.registered_ids()) <= set(rows)
    toy = rows["corrgrpo/ScaleDominance-v0"]
    assert [r["name"] for r in toy["rewards"]] == ["digits", "has_a", "word_with_a"]
    assert toy["rewards"][0] == {"name": "digits", "low": 0.0, "high": 32.0, "weight": 1.0}
    assert toy["tasks"] == {"all": 64, "train": 52, "eval": 12}
    for row in rows.values():  # unavailable envs carry a reason instead of crashing the listing
        assert "rewards" in row or row["error"]
    assert main(["envs", "list", "corrgrpo/ScaleDominance-v0"]) == 0
    out = capsys.readouterr().out
    assert "corrgrpo/ScaleDominance-v0" in out and "word_with_a" in out
    assert main(["envs", "list", "corrgrpo/Nope-v0"]) == 2


def test_install_hint_for_missing_extra():
    exc = ModuleNotFoundError("No module named 'agentdojo'", name="agentdojo")
    assert commands.install_hint(exc) == "pip install 'corrgrpo[agentdojo]'"
    exc = ModuleNotFoundError("No module named 'leetcode'", name="leetcode")
    assert commands.install_hint(exc) == "pip install leetcode"


def test_missing_dependency_is_listed_not_raised():
    corrgrpo_envs.register("testns/Missing-v0", "no_such_module_xyz.env:Env")
    row = commands.describe_env("testns/Missing-v0")
    assert "no_such_module_xyz" in row["error"] and row["hint"] == "pip install no_such_module_xyz"
    # the registry stays usable afterwards
    assert corrgrpo_envs.make("corrgrpo/ScaleDominance-v0").unwrapped.num_rewards == 3


def test_envs_list_fits_80_columns_without_cutting_names(capsys, monkeypatch):
    from corrgrpo.trainer.cli import main

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["envs", "list", "corrgrpo/Code-v0", "corrgrpo/ToolCall-v0", "corrgrpo/ScaleDominance-v0"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    for name in ("ast_similarity", "function_name", "corrgrpo/ScaleDominance-v0", "train 800"):
        assert name in out
    assert "…" not in out


def test_an_unavailable_env_is_a_line_under_the_table_not_a_squeezed_row(capsys, monkeypatch):
    """A missing dependency's note and install hint would widen the rewards column past 80
    columns and cut the ids of every other env; it is a line of its own under the table."""
    from corrgrpo.trainer.cli import main
    from corrgrpo_envs import commands

    described = commands.describe_env

    def one_unavailable(env_id):
        if env_id == "corrgrpo/AgentDojo-v0":
            return {"id": env_id, "description": "", "error": "missing dependency: agentdojo",
                    "hint": "pip install 'corrgrpo[agentdojo]'"}
        return described(env_id)

    monkeypatch.setattr(commands, "describe_env", one_unavailable)
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["envs", "list", "corrgrpo/AgentDojo-v0", "corrgrpo/ScaleDominance-v0", "corrgrpo/ToolCall-v0"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80
    assert "corrgrpo/ScaleDominance-v0" in out and "function_name" in out
    flat = " ".join(out.split())
    assert ("corrgrpo/AgentDojo-v0: unavailable: missing dependency: agentdojo "
            "(pip install 'corrgrpo[agentdojo]')") in flat
