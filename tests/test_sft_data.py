"""SFT data: token-exact episodes from env references and files; loss masks; malformed records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import corrgrpo_envs
from corrgrpo.agents.chat import ChatRenderer
from corrgrpo.trainer.sft_data import (
    SFTDataError,
    conversation_episode,
    env_examples,
    file_examples,
    record_conversation,
    truncate,
)
from corrgrpo_envs import MultiRewardEnv, StepOutcome, Task, TaskSource

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CITIES = {"Paris": 21, "Oslo": 4, "Lima": 18, "Cairo": 30}


def _call_text(city: str) -> str:
    call = json.dumps({"name": "get_weather", "arguments": {"city": city}})
    return f"<tool_call>\n{call}\n</tool_call>"


class LookupEnv(MultiRewardEnv):
    """Two turns: the assistant calls a tool, the env answers as the tool, the assistant replies."""

    def __init__(self, split: str = "all", **kwargs):
        tasks = TaskSource([Task(f"lookup/{c}", {"city": c, "temp": t}) for c, t in CITIES.items()])
        super().__init__(tasks.split(split), reward_names=("called", "answered"),
                         reward_low=(0, 0), reward_high=(1, 1), **kwargs)

    def _observe_task(self, task):
        return {"messages": [{"role": "user", "content": f"Weather in {task['city']}?"}],
                "tools": [WEATHER_TOOL]}

    def _act(self, action):
        task, messages = self.task, list(self._obs["messages"])
        if len(messages) == 1:  # first turn: run the call, return the tool's output
            messages += [{"role": "assistant", "content": action},
                         {"role": "tool", "content": f"TOOL-OUTPUT {task['city']} {task['temp']}C"}]
            return StepOutcome(rewards={"called": float(task["city"] in action), "answered": 0.0},
                               terminated=False, observation={"messages": messages, "tools": [WEATHER_TOOL]})
        return StepOutcome(rewards={"called": 0.0, "answered": float(str(task["temp"]) in action)})

    def reference_action(self, task_id):
        task = self.tasks.get(task_id)
        return [_call_text(task["city"]), f"It is {task['temp']} degrees in {task['city']}."]


corrgrpo_envs.register("test/Lookup-v0", LookupEnv)


@pytest.fixture(scope="module")
def tiny():
    from corrgrpo.agents.models import load_model

    return load_model("tiny")


def _spans(episode, tokenizer, value: int) -> list[str]:
    """Decoded runs of consecutive tokens whose loss mask is ``value``."""
    runs, current = [], []
    for tok, m in zip(episode.token_ids, episode.loss_mask):
        if m == value:
            current.append(tok)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [tokenizer.decode(r, skip_special_tokens=False) for r in runs]


def test_env_source_multi_turn_masks_tool_output(tiny):
    model, tok = tiny
    episodes, stats = env_examples("test/Lookup-v0", {"split": "all"}, tok, max_turns=4)
    assert len(episodes) == len(CITIES)
    assert stats.reference_reward == [1.0, 1.0]  # the references are what the env rewards
    renderer = ChatRenderer(tok)
    for e in episodes:
        city = e.task_id.split("/")[1]
        trained = _spans(e, tok, 1)
        # exactly the two assistant turns, each ending with EOS; nothing else is trained
        assert trained == [_call_text(city) + "<|im_end|>",
                           f"It is {CITIES[city]} degrees in {city}.<|im_end|>"]
        context = "".join(_spans(e, tok, 0))
        assert f"TOOL-OUTPUT {city}" in context and "Weather in" in context
        # the tokens are the chat template's rendering of the whole conversation
        convo = [{"role": "user", "content": f"Weather in {city}?"},
                 {"role": "assistant", "content": _call_text(city)},
                 {"role": "tool", "content": f"TOOL-OUTPUT {city} {CITIES[city]}C"},
                 {"role": "assistant", "content": f"It is {CITIES[city]} degrees in {city}."}]
        full = renderer.render(convo, [WEATHER_TOOL], add_generation_prompt=False)
        assert tok.decode(e.token_ids, skip_special_tokens=False) == full.rstrip("\n")
        # trained ids are the canonical tokens of each text plus EOS (what a policy emits)
        assert e.token_ids[e.loss_mask.index(1):][: len(renderer.encode(_call_text(city)))] == \
            renderer.encode(_call_text(city))


def test_env_source_prompt_tokens_match_an_rl_rollout(tiny):
    """The first prompt of an SFT episode is token for token what HFPolicy conditions on."""
    from corrgrpo.agents.hf_policy import HFPolicy
    from corrgrpo.agents.policy import SamplingParams
    from corrgrpo.trainer.rollout import collect_groups
    from corrgrpo_envs.vector import GroupedVectorEnv

    model, tok = tiny
    kwargs = {"dataset": "generated", "num_tasks": 12, "split": "train"}
    episodes, stats = env_examples("corrgrpo/ToolCall-v0", kwargs, tok, max_turns=1, limit=3)
    assert stats.reference_reward[-1] == 1.0  # format reward: the references have the right shape
    venv = GroupedVectorEnv("corrgrpo/ToolCall-v0", num_groups=3, group_size=1, **kwargs)
    batch = collect_groups(venv, HFPolicy(model, tok), [e.task_id for e in episodes], 0,
                           SamplingParams(temperature=0.0, max_new_tokens=2), max_turns=1)
    venv.close()
    for sft_ep, rl_ep in zip(episodes, batch.episodes):
        assert sft_ep.task_id == rl_ep.task_id
        assert sft_ep.prompt_length == rl_ep.prompt_length
        assert sft_ep.token_ids[: sft_ep.prompt_length] == rl_ep.token_ids[: rl_ep.prompt_length]
        assert sum(sft_ep.loss_mask[: sft_ep.prompt_length]) == 0
        assert sft_ep.token_ids[-1] == tok.eos_token_id and sft_ep.loss_mask[-1] == 1


def test_file_messages_with_tool_calls(tiny, tmp_path):
    _, tok = tiny
    record = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "TOOL-OUTPUT 4C"},
            {"role": "assistant", "content": "It is 4 degrees."},
        ],
        "tools": [{"type": "function", "function": WEATHER_TOOL}],
    }
    path = tmp_path / "chat.jsonl"
    greeting = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hi."}]}
    path.write_text(json.dumps(record) + "\n\n" + json.dumps(greeting) + "\n")
    episodes, _ = file_examples([path], tok)
    assert [e.task_id for e in episodes] == [f"{path}: line 1", f"{path}: line 3"]
    assert _spans(episodes[1], tok, 1) == ["Hi.<|im_end|>"]
    trained = _spans(episodes[0], tok, 1)
    assert trained == ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>',
                       "It is 4 degrees.<|im_end|>"]
    context = "".join(_spans(episodes[0], tok, 0))
    assert "TOOL-OUTPUT 4C" in context and "Be brief." in context and "get_weather" in context
    messages, tools = record_conversation(record, "r")
    full = ChatRenderer(tok).render(messages, tools, add_generation_prompt=False)
    assert tok.decode(episodes[0].token_ids, skip_special_tokens=False) == full.rstrip("\n")


def test_file_rlla_sft_records(tiny, tmp_path):
    _, tok = tiny
    system = ("You are a helpful assistant.\n\n**Available Tools**\nIn your response, you can use the "
              "following tools:\n1. Name: lookup\nDescription: Look it up\nParameters: "
              "{\"q\": {\"type\": \"string\"}}\n\n**Steps for Each Turn**\nThink.")
    output = '<think> look up </think>\n<tool_call>\n{"name": "lookup", "parameters": {"q": "x"}}\n</tool_call>'
    path = tmp_path / "rlla.json"
    path.write_text(json.dumps([{"instruction": system, "input": "find x", "output": output}]))
    (episode,), _ = file_examples([path], tok)
    assert _spans(episode, tok, 1) == [output + "<|im_end|>"]
    messages, tools = record_conversation(json.loads(path.read_text())[0], "r")
    assert [t["name"] for t in tools] == ["lookup"]  # parsed from the system prompt, as the env does
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]


def test_shipped_rlla_sft_file_reads(tiny):
    from corrgrpo_envs.toolcall.datasets import shared_data_dir

    root = shared_data_dir()
    path = root / "rlla_4k" / "rlla_sft.json" if root else None
    if path is None or not path.is_file():
        pytest.skip("the shared rlla_4k/rlla_sft.json reference file is not beside the project")
    records = json.loads(path.read_text())[:5]
    small = Path(pytest.importorskip("tempfile").mkdtemp()) / "five.json"
    small.write_text(json.dumps(records))
    episodes, _ = file_examples([small], tiny[1])
    assert len(episodes) == 5
    for e, rec in zip(episodes, records):
        assert _spans(e, tiny[1], 1) == [rec["output"] + "<|im_end|>"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"messages": [{"role": "bot", "content": "hi"}]}', "line 1: messages[0].role: 'bot' is not one of"),
        ('{"messages": [{"role": "user"}]}', "line 1: messages[0].content: missing"),
        ('{"messages": [{"role": "user", "content": 3}]}', "messages[0].content: expected a string"),
        ('{"messages": [{"role": "user", "content": "a"}]}', "no assistant message"),
        ('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": '
         '[{"function": {"name": "f", "arguments": "{bad"}}]}]}',
         "messages[1].tool_calls[0].function.arguments: not a JSON object"),
        ('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": '
         '[{"function": {"arguments": {}}}]}]}', "messages[1].tool_calls[0].function.name"),
        ('{"messages": [{"role": "user", "content": "a", "tool_calls": []}, {"role": "assistant", "content": "b"}]}',
         "messages[0].tool_calls: only assistant messages"),
        ('{"instruction": "s", "input": "u"}', "line 1: output: expected a string"),
        ('{"prompt": "p", "completion": "c"}', "line 1: expected 'messages'"),
        ('{"messages": "hi"}', "messages: expected a non-empty list"),
        ('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}\n[1]',
         "line 2: expected a JSON object"),
        ('{"messages": [', "line 1: not JSON"),
    ],
)
def test_malformed_records_name_file_record_and_field(tiny, tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content + "\n")
    with pytest.raises(SFTDataError) as info:
        file_examples([path], tiny[1])
    assert str(path) in str(info.value) and message in str(info.value)


def test_malformed_json_list_names_the_record(tiny, tmp_path):
    path = tmp_path / "bad.json"
    good = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    path.write_text(json.dumps([good, good, {"messages": [{"role": "user", "content": "a"},
                                                          {"role": "assistant", "content": 7}]}]))
    with pytest.raises(SFTDataError, match=r"bad.json: record 2: messages\[1\].content"):
        file_examples([path], tiny[1])
    path.write_text(json.dumps({"messages": []}))
    with pytest.raises(SFTDataError, match="expected a JSON list"):
        file_examples([path], tiny[1])


def test_template_without_tool_calls_is_an_error(tiny):
    """A chat template that drops tool_calls would train on nothing: refuse it."""
    _, tok = tiny
    import copy

    plain = copy.copy(tok)
    plain.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    messages = [{"role": "user", "content": "a"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {}}}]}]
    with pytest.raises(SFTDataError, match="does not render tool calls"):
        conversation_episode(ChatRenderer(plain), messages, None, "rec")


def test_truncate_keeps_masks_aligned(tiny):
    episodes, _ = env_examples("test/Lookup-v0", {"split": "all"}, tiny[1], max_turns=4)
    n = len(episodes[0].token_ids)
    assert truncate(episodes, n - 5) >= 1
    e = episodes[0]
    assert len(e.token_ids) == len(e.loss_mask) == len(e.logprobs) == n - 5
