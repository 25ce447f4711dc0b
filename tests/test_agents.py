"""HFPolicy on the tiny model: exact logprobs, token-exact multi-turn episodes, stop/EOS handling."""

from __future__ import annotations

import copy

import pytest
import torch

from corrgrpo.agents import Action, Episode, HFPolicy, SamplingParams, load_model
from corrgrpo.agents.hf_policy import finish_completion

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


@pytest.fixture(scope="module")
def policy(tiny):
    model, tokenizer = tiny
    return HFPolicy(model, tokenizer, batch_size=3)


def conversation(k: int) -> dict:
    return {
        "messages": [
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "what is the weather in city " + "x" * k},
        ],
        "tools": TOOLS,
    }


def forward_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t >= 1 from one plain forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return logp[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def eos_model(model, eos_id: int):
    """A copy of ``model`` that always prefers EOS (a forward hook on the head)."""
    forced = copy.deepcopy(model)

    def hook(module, inputs, output):
        output = output.clone()
        output[..., eos_id] += 60.0
        return output

    forced.lm_head.register_forward_hook(hook)
    return forced


def test_sampling_params_validation():
    assert SamplingParams(stop="x").stop == ("x",)
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError):
        SamplingParams(stop=[""])


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_logprobs_equal_fresh_forward_pass(tiny, policy, temperature, top_p):
    model, _ = tiny
    observations = [conversation(k) for k in (1, 30, 9, 17)]  # different lengths: left padding
    actions = policy.act(observations, SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=10, seed=3))
    assert len(actions) == 4
    for action in actions:
        assert isinstance(action, Action)
        assert len(action.completion_ids) == len(action.logprobs) > 0
        ref = forward_logprobs(model, action.prompt_ids + action.completion_ids)[len(action.prompt_ids) - 1 :]
        # untempered log-softmax, whatever the sampling temperature and top-p
        assert torch.allclose(torch.tensor(action.logprobs), ref, atol=1e-4), (ref, action.logprobs)
        assert action.finish_reason == "length" and len(action.completion_ids) == 10


def test_prompt_is_the_chat_template(tiny, policy):
    _, tokenizer = tiny
    obs = conversation(3)
    action = policy.act([obs], SamplingParams(max_new_tokens=2, seed=0))[0]
    text = tokenizer.apply_chat_template(obs["messages"], tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert action.prompt_ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(action.prompt_ids).endswith("<|im_start|>assistant\n")
    assert '"name": "get_weather"' in tokenizer.decode(action.prompt_ids)


def test_seed_reproducible_and_global_rng_untouched(policy):
    obs = [conversation(2), conversation(5)]
    state = torch.random.get_rng_state()
    a = policy.act(obs, SamplingParams(max_new_tokens=8, seed=11))
    assert torch.equal(state, torch.random.get_rng_state())
    b = policy.act(obs, SamplingParams(max_new_tokens=8, seed=11))
    c = policy.act(obs, SamplingParams(max_new_tokens=8, seed=12))
    assert [x.completion_ids for x in a] == [x.completion_ids for x in b]
    assert [x.completion_ids for x in a] != [x.completion_ids for x in c]


def test_model_used_in_place_and_mode_restored(tiny, policy):
    model, _ = tiny
    assert policy.model is model
    model.train()
    policy.act([conversation(1)], SamplingParams(max_new_tokens=2, seed=0))
    assert model.training
    model.eval()


def test_multi_turn_tokens_are_the_concatenation_of_turns(tiny, policy):
    model, tokenizer = tiny
    episodes = [Episode(task_id="a"), Episode(task_id="b")]
    obs = [conversation(1), conversation(6)]
    sampling = SamplingParams(max_new_tokens=6, seed=5)
    first = policy.act(obs, sampling, episodes=episodes)
    tool_text = "sunny, 21 degrees"
    obs2 = [
        {
            "messages": o["messages"]
            + [{"role": "assistant", "content": a.text}, {"role": "tool", "content": tool_text}],
            "tools": TOOLS,
        }
        for o, a in zip(obs, first)
    ]
    second = policy.act(obs2, sampling, episodes=episodes)
    obs3 = [
        {"messages": o["messages"] + [{"role": "assistant", "content": a.text}, {"role": "user", "content": "and?"}], "tools": TOOLS}
        for o, a in zip(obs2, second)
    ]
    third = policy.act(obs3, sampling, episodes=episodes)
    for ep, a0, a1, a2 in zip(episodes, first, second, third):
        assert ep.num_turns == 3 and ep.turns == [a0, a1, a2]
        assert ep.prompt_length == len(a0.prompt_ids)
        # each turn's context is everything before it; earlier tokens are never changed
        assert a1.prompt_ids[: len(a0.prompt_ids) + len(a0.completion_ids)] == a0.prompt_ids + a0.completion_ids
        assert a2.prompt_ids[: len(a1.prompt_ids) + len(a1.completion_ids)] == a1.prompt_ids + a1.completion_ids
        assert ep.token_ids == a2.prompt_ids + a2.completion_ids
        delta = a1.prompt_ids[len(a0.prompt_ids) + len(a0.completion_ids) :]
        # the turn ran out of tokens, so the template's end-of-turn comes first, then the tool message
        assert a0.finish_reason == "length"
        assert tokenizer.decode(delta) == (
            f"<|im_end|>\n<|im_start|>tool\n<tool_response>\n{tool_text}\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n"
        )
        mask_ones = [i for i, m in enumerate(ep.loss_mask) if m == 1]
        assert len(mask_ones) == ep.completion_length == sum(len(a.completion_ids) for a in (a0, a1, a2))
        assert all(ep.logprobs[i] == 0.0 for i, m in enumerate(ep.loss_mask) if m == 0)
        # the episode's logprobs are those of one forward pass over its tokens
        ref = forward_logprobs(model, ep.token_ids)
        got = torch.tensor([ep.logprobs[i] for i in mask_ones])
        assert torch.allclose(got, ref[torch.tensor(mask_ones) - 1], atol=1e-4)


def test_eos_is_kept_and_delta_continues_after_it(tiny):
    model, tokenizer = tiny
    forced = HFPolicy(eos_model(model, tokenizer.eos_token_id), tokenizer)
    ep = Episode()
    obs = conversation(2)
    a0 = forced.act([obs], SamplingParams(max_new_tokens=5, seed=0), episodes=[ep])[0]
    assert a0.completion_ids == [tokenizer.eos_token_id] and a0.text == "" and a0.finish_reason == "stop"
    assert len(a0.logprobs) == 1 and a0.logprobs[0] > -1e-3
    obs2 = {"messages": obs["messages"] + [{"role": "assistant", "content": ""}, {"role": "user", "content": "hi"}], "tools": TOOLS}
    a1 = forced.act([obs2], SamplingParams(max_new_tokens=5, seed=0), episodes=[ep])[0]
    delta = a1.prompt_ids[len(a0.prompt_ids) + 1 :]
    assert tokenizer.decode(delta) == "\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    # with EOS kept, the context decodes exactly like the chat template of the whole conversation
    full = tokenizer.apply_chat_template(obs2["messages"], tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(a1.prompt_ids) == full


def test_observation_without_assistant_echo_extends_the_episode(policy, tiny):
    _, tokenizer = tiny
    ep = Episode()
    obs = conversation(2)
    a0 = policy.act([obs], SamplingParams(max_new_tokens=3, seed=0), episodes=[ep])[0]
    obs2 = {"messages": obs["messages"] + [{"role": "user", "content": "more"}], "tools": TOOLS}
    a1 = policy.act([obs2], SamplingParams(max_new_tokens=3, seed=0), episodes=[ep])[0]
    delta = a1.prompt_ids[len(a0.prompt_ids) + len(a0.completion_ids) :]
    assert tokenizer.decode(delta) == "<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"
    bad = {"messages": [{"role": "user", "content": "something else"}], "tools": []}
    with pytest.raises(ValueError, match="re-tokenizing"):
        policy.act([bad], SamplingParams(max_new_tokens=3), episodes=[ep])


def test_stop_strings_truncate_text_and_ids(tiny):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer)
    free = policy.act([conversation(k) for k in range(4)], SamplingParams(max_new_tokens=24, seed=7))
    # stop at a character each free-running completion produced: same seed, same samples up to it
    stops = []
    for a in free:
        stops.append(next((c for c in a.text[2:] if c.isalpha()), None))
    stop = [s for s in stops if s][0]
    cut = policy.act([conversation(k) for k in range(4)], SamplingParams(max_new_tokens=24, seed=7, stop=[stop]))
    for f, c in zip(free, cut):
        assert stop not in c.text
        assert f.completion_ids[: len(c.completion_ids)] == c.completion_ids
        if stop in f.text:
            assert c.finish_reason == "stop" and c.text == f.text[: f.text.index(stop)]
            assert stop in tokenizer.decode(c.completion_ids) and stop not in tokenizer.decode(c.completion_ids[:-1])


def test_finish_completion_rules(tiny):
    _, tokenizer = tiny
    eos = tokenizer.eos_token_id
    ids = tokenizer("abc def", add_special_tokens=False)["input_ids"]
    assert finish_completion(tokenizer, ids + [eos, eos, eos], {eos}, ()) == (ids + [eos], "abc def", "stop")
    assert finish_completion(tokenizer, ids, {eos}, ()) == (ids, "abc def", "length")
    got_ids, text, reason = finish_completion(tokenizer, ids + [eos], {eos}, ("c d",))
    assert text == "ab" and reason == "stop" and "c d" in tokenizer.decode(got_ids)
    assert finish_completion(tokenizer, [eos], {eos}, ("x",)) == ([eos], "", "stop")


def test_bad_input_raises(policy):
    with pytest.raises(ValueError):
        policy.act({"messages": []})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        policy.act([{"no": "messages"}])
    with pytest.raises(ValueError):
        policy.act([conversation(1)], episodes=[])
    with pytest.raises(ValueError):
        HFPolicy(policy.model, policy.tokenizer, batch_size=0)


def test_episode_bookkeeping():
    ep = Episode(task_id="t")
    ep.append_context([1, 2, 3])
    ep.append_action(Action(text="x", prompt_ids=[1, 2, 3], completion_ids=[4, 5], logprobs=[-0.5, -0.25]))
    ep.append_context([6])
    assert ep.token_ids == [1, 2, 3, 4, 5, 6] and ep.loss_mask == [0, 0, 0, 1, 1, 0]
    assert ep.logprobs == [0.0, 0.0, 0.0, -0.5, -0.25, 0.0]
    assert ep.prompt_length == 3 and ep.completion_length == 2 and ep.num_turns == 1
    with pytest.raises(ValueError):
        ep.append_action(Action(text="y", prompt_ids=[1], completion_ids=[7], logprobs=[-1.0]))
    with pytest.raises(ValueError):
        ep.append_action(Action(text="y", prompt_ids=ep.token_ids[:], completion_ids=[7], logprobs=[]))
    assert ep.to_dict()["texts"] == ["x"]
