"""The static-KV-cache decode loop draws what ``generate`` draws, with the same logprobs."""

from __future__ import annotations

import copy

import pytest
import torch

from corrgrpo.agents import HFPolicy, SamplingParams, load_model
from corrgrpo.agents.static_decode import static_decode, static_decode_unsupported


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def _observations() -> list[dict]:
    # different lengths, so rows are left-padded differently
    return [{"messages": [{"role": "user", "content": "count " + "a b " * k}]} for k in (1, 7, 3, 12)]


@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (1.0, 1.0), (0.7, 0.9)])
def test_same_tokens_and_logprobs_as_generate(tiny, temperature, top_p):
    model, tokenizer = tiny
    sampling = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=12, seed=7)
    fast = HFPolicy(model, tokenizer, decoder="static").act(_observations(), sampling)
    slow = HFPolicy(model, tokenizer, decoder="generate").act(_observations(), sampling)
    for a, b in zip(fast, slow):
        assert a.completion_ids == b.completion_ids
        assert a.finish_reason == b.finish_reason
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_eos_and_stop_strings_end_rows_as_generate_does(tiny, temperature):
    # greedy rows that finish leave the batch (the cache shrinks): same tokens and logprobs
    model, tokenizer = tiny
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    forced = copy.deepcopy(model)

    def prefer_eos_late(module, inputs, output):
        output = output.clone()
        output[..., eos] += 8.0  # EOS likely but not certain: rows end at different steps
        return output

    forced.lm_head.register_forward_hook(prefer_eos_late)
    for stop in ((), ("a", "e")):
        sampling = SamplingParams(max_new_tokens=16, seed=3, stop=stop, temperature=temperature)
        fast = HFPolicy(forced, tokenizer, decoder="static").act(_observations(), sampling)
        slow = HFPolicy(forced, tokenizer, decoder="generate").act(_observations(), sampling)
        assert [a.completion_ids for a in fast] == [b.completion_ids for b in slow]
        for a, b in zip(fast, slow):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
        assert [a.text for a in fast] == [b.text for b in slow]
        assert [a.finish_reason for a in fast] == [b.finish_reason for b in slow]


def test_direct_call_returns_padded_rows_and_raw_logprobs(tiny):
    model, tokenizer = tiny
    ids = torch.tensor([[tokenizer.pad_token_id, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    torch.manual_seed(0)
    generated, logprobs = static_decode(
        model, ids, mask, max_new_tokens=5, temperature=1.0, top_p=1.0,
        eos_ids=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id,
    )
    assert generated.shape == logprobs.shape == (2, 5)
    # row 0 scored alone and unpadded gives the same logprobs
    seq = torch.cat([ids[0, 1:], generated[0]])[None]
    with torch.no_grad():
        ref = torch.log_softmax(model(seq).logits[0, 1:-1].float(), -1).gather(-1, seq[0, 2:, None])[:, 0]
    torch.testing.assert_close(logprobs[0], ref, atol=1e-4, rtol=0)


def test_other_architectures_fall_back_to_generate():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32))
    assert "not a Llama-family" in static_decode_unsupported(model)
    _, tokenizer = load_model("tiny")
    with pytest.raises(ValueError, match="decoder='static' cannot run"):
        HFPolicy(model, tokenizer, decoder="static")
    with pytest.raises(ValueError, match="allowed values"):
        HFPolicy(model, tokenizer, decoder="fast")
    assert HFPolicy(model, tokenizer)._static() is False


def test_greedy_rows_leave_the_batch_when_they_finish(tiny):
    model, tokenizer = tiny
    eos = tokenizer.eos_token_id
    calls: list[int] = []
    forced = copy.deepcopy(model)

    def end_rows_one_by_one(module, inputs, output):
        # row r of the first call ends at step r + 1; the batch each later call sees is recorded
        calls.append(output.shape[0])
        output = output.clone()
        if len(calls) > 1:
            output[: max(0, 8 - len(calls) + 1), -1, eos] = 1e4
        return output

    forced.lm_head.register_forward_hook(end_rows_one_by_one)
    ids = torch.randint(5, 50, (8, 4))
    generated, logprobs = static_decode(
        forced, ids, torch.ones_like(ids), max_new_tokens=12, temperature=0.0, top_p=1.0,
        eos_ids=[eos], pad_id=tokenizer.pad_token_id,
    )
    assert calls[0] == 8 and min(calls) < 8  # the cache shrank
    assert generated.shape[0] == 8 and bool((logprobs[generated == tokenizer.pad_token_id] == 0).all())
