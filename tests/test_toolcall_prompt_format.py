"""One prompt layout for every tool-calling data set (``prompt_format="house"``), and SFT targets
from a data set's own answers (``reference_answers="dataset"``)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from corrgrpo_envs.toolcall.datasets import DATASETS
from corrgrpo_envs.toolcall.env import ToolCallEnv, in_prompt_format, load_tasks
from corrgrpo_envs.toolcall.prompts import dialogue_history, house_messages, system_prompt

MAXIMA = (0.5, 1.0, 1.5, 1.0)
TOOL = {"name": "area.triangle", "description": "Area of a triangle.",
        "parameters": {"type": "dict", "properties": {"base": {"type": "integer"}}, "required": ["base"]}}


@pytest.fixture
def bfcl_dir(tmp_path: Path) -> Path:
    def write(path: Path, rows: list[dict]) -> None:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    write(tmp_path / "BFCL_v4_simple.json", [
        {"id": "simple_0", "question": [[{"role": "user", "content": "Base 10."}]], "function": [TOOL]},
        {"id": "simple_1", "question": [[{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "Base 3."}]], "function": [TOOL]},
    ])
    (tmp_path / "possible_answer").mkdir()
    write(tmp_path / "possible_answer" / "BFCL_v4_simple.json", [
        {"id": "simple_0", "ground_truth": [{"area.triangle": {"base": [10]}}]},
        {"id": "simple_1", "ground_truth": [{"area.triangle": {"base": [3]}}]},
    ])
    return tmp_path


@pytest.fixture
def rlla_sft_file(tmp_path: Path) -> Path:
    """Two records in the RLLA SFT layout: the system prompt lists the tool, the answer reasons first."""
    system = ("Some assistant.\n\n**Available Tools**\nIn your response, you can use the following tools:\n"
              '1. Name: area.triangle\nDescription: Area of a triangle.\nParameters: {"base": {"type": "integer"}}\n\n'
              "**Output Format**\n...")
    records = [
        {"instruction": system, "input": "**Dialogue Records History**\n<user> Base 4. </user>",
         "output": '<think> The user wants the area with base 4, so I call area.triangle. </think>\n'
                   '<tool_call>\n{"name": "area.triangle", "parameters": {"base": 4}}\n</tool_call>'},
        {"instruction": system, "input": "**Dialogue Records History**\n<user> Hello! </user>",
         "output": "<think> A greeting. </think>\n<response> Hello, how can I help? </response>"},
    ]
    path = tmp_path / "sft.json"
    path.write_text(json.dumps(records))
    return path


def test_house_layout_keeps_the_generator_prompts_word_for_word_and_adds_the_required_lines():
    tasks = load_tasks("generated", num_tasks=40, dataset_options={"prompt": "rlla"})
    house = in_prompt_format(tasks, "house")
    for before, after in zip(tasks, house):
        assert after["messages"][1:] == before["messages"][1:]
        system = after["messages"][0]["content"]
        # the generator's own prompts leave the schemas' Required lines out (its data sets stay as recorded)
        assert "\nRequired: [" in system and "\nRequired: [" not in before["messages"][0]["content"]
        kept = "\n".join(line for line in system.split("\n") if not line.startswith("Required: "))
        assert kept == before["messages"][0]["content"]


def test_house_layout_wraps_a_plain_user_turn_and_keeps_ids_and_splits(bfcl_dir):
    tasks = DATASETS.load(bfcl_dir)
    house = in_prompt_format(tasks, "house")
    assert house.ids == tasks.ids
    assert [house.split_of(t) for t in house] == [tasks.split_of(t) for t in tasks]
    first, second = house.get("bfcl_simple/simple_0"), house.get("bfcl_simple/simple_1")
    assert first["messages"][1] == {"role": "user", "content": dialogue_history([("user", "Base 10.")])}
    assert first["messages"][0]["content"] == system_prompt(first["tools"])
    # BFCL's own system text stays, as the preamble of the house prompt
    assert second["messages"][0]["content"] == system_prompt(second["tools"], "Be brief.")
    assert first["expected_calls"] == tasks.get("bfcl_simple/simple_0")["expected_calls"]
    pickle.loads(pickle.dumps(house))  # vector envs ship task sources to worker processes


def test_house_layout_rewrites_a_foreign_system_prompt_from_its_tools(rlla_sft_file):
    tasks = DATASETS.load(rlla_sft_file)
    house = in_prompt_format(tasks, "house")
    for before, after in zip(tasks, house):
        assert after["messages"][0]["content"] == system_prompt(before["tools"])
        assert after["messages"][1] == before["messages"][1]  # already a dialogue history
    assert "Some assistant." not in house[0]["messages"][0]["content"]


def test_house_messages_turn_a_dialogue_into_one_history():
    messages = [{"role": "user", "content": "Base 2."}, {"role": "assistant", "content": "Which unit?"},
                {"role": "user", "content": "cm"}]
    out = house_messages(messages, [TOOL])
    assert out[1]["content"] == dialogue_history([("user", "Base 2."), ("response", "Which unit?"), ("user", "cm")])


def test_reference_answers_from_the_data_set(rlla_sft_file):
    short = ToolCallEnv(dataset=rlla_sft_file)
    own = ToolCallEnv(dataset=rlla_sft_file, reference_answers="dataset", prompt_format="house")
    for tid in own.task_ids:
        answer = own.reference_action(tid)[0]
        assert answer == own.tasks.get(tid)["ground_truth"]
        assert answer != short.reference_action(tid)[0]
        own.reset(options={"task_id": tid})
        _, reward, *_, info = own.step(answer)
        want = MAXIMA if info["expects_calls"] else (0.0, 0.0, 0.0, 1.0)
        assert tuple(reward.tolist()) == want, tid


def test_reference_answers_fall_back_to_short_without_a_ground_truth(bfcl_dir):
    env = ToolCallEnv(dataset=bfcl_dir, reference_answers="dataset")
    short = ToolCallEnv(dataset=bfcl_dir)
    for tid in env.task_ids:
        assert env.reference_action(tid) == short.reference_action(tid)


@pytest.mark.parametrize(("key", "value"), [("prompt_format", "rlla"), ("reference_answers", "long")])
def test_unknown_option_values_are_errors_naming_the_option(key, value):
    with pytest.raises(ValueError, match=key):
        ToolCallEnv(dataset="generated", num_tasks=4, **{key: value})
