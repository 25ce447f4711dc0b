"""A group's prompt prefilled once in generation: the draws and logprobs of one prefill per row."""

from __future__ import annotations

import copy

import pytest
import torch

from corrgrpo.agents import HFPolicy, SamplingParams, load_model
from corrgrpo.agents.hf_policy import MIN_SHARED_PROMPT
from corrgrpo.agents.static_decode import distinct_rows, static_decode
from tests.tolerances import assert_close_after_reduction


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def _groups(group: int = 4, repeats: tuple[int, ...] = (30, 36, 33)) -> list[dict]:
    """Three prompts of different lengths (72, 84 and 78 tokens: rows are left-padded
    differently), ``group`` rows each, the rows of a group interleaved with the others' as a
    caller may order them."""
    prompts = [{"messages": [{"role": "user", "content": "count " + "a b " * k}]} for k in repeats]
    return [prompts[i % len(prompts)] for i in range(group * len(prompts))]


def _prefill_rows(model) -> tuple[list[int], torch.utils.hooks.RemovableHandle]:
    """Records the batch size of every forward pass (the first one is the prefill)."""
    rows: list[int] = []
    handle = model.model.embed_tokens.register_forward_hook(lambda m, i, o: rows.append(int(o.shape[0])))
    return rows, handle


def _logprob_terms(model, width: int) -> int:
    # a logit is a hidden-size-long product of a state built by attention over the prompt's
    # positions: the reductions the shared and per-row prefills order differently
    return width * model.config.hidden_size


@pytest.mark.parametrize("decoder", ["static", "generate"])
@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (1.0, 1.0), (0.7, 0.9)])
def test_shared_prefill_draws_what_one_prefill_per_row_draws(tiny, decoder, temperature, top_p):
    model, tokenizer = tiny
    observations = _groups()
    sampling = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=12, seed=11)
    rows, handle = _prefill_rows(model)
    try:
        shared = HFPolicy(model, tokenizer, decoder=decoder, share_prompts=True).act(observations, sampling)
        shared_prefill = rows[0]
        rows.clear()
        plain = HFPolicy(model, tokenizer, decoder=decoder, share_prompts=False).act(observations, sampling)
        plain_prefill = rows[0]
    finally:
        handle.remove()
    assert (shared_prefill, plain_prefill) == (3, 12)  # one prefill row per distinct prompt
    assert [a.completion_ids for a in shared] == [b.completion_ids for b in plain]
    assert [a.finish_reason for a in shared] == [b.finish_reason for b in plain]
    assert [a.text for a in shared] == [b.text for b in plain]
    width = max(len(a.prompt_ids) for a in plain)
    for a, b in zip(shared, plain):
        assert a.prompt_ids == b.prompt_ids
        assert len(a.logprobs) == len(a.completion_ids) > 0
        assert_close_after_reduction(torch.tensor(a.logprobs), torch.tensor(b.logprobs),
                                     _logprob_terms(model, width), "logprobs")
    completions = [tuple(a.completion_ids) for a in shared]
    if temperature == 0.0:  # a group's greedy rows agree; the prompts' logprobs tell them apart
        assert completions[:3] * 4 == completions
        a, b, c = (torch.tensor(row.logprobs) for row in shared[:3])
        assert min(float((x - y).abs().max()) for x, y in ((a, b), (b, c), (a, c))) > 1e-3
    else:  # copying the cache did not copy the draws: every row samples on its own
        assert len(set(completions)) == len(completions)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_that_end_early_end_alike(tiny, temperature, monkeypatch):
    # EOS and stop strings end rows at different steps (greedy rows then leave the cache);
    # short prompts, shared all the same, since there the greedy rows end at different steps
    monkeypatch.setattr("corrgrpo.agents.hf_policy.MIN_SHARED_PROMPT", 1)
    observations = _groups(repeats=(1, 7, 3))
    model, tokenizer = tiny
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    forced = copy.deepcopy(model)
    # EOS likely but not certain: the three prompts' rows end at 2, 3 and 6 tokens greedily
    bias = 0.5 if temperature == 0.0 else 8.0

    def prefer_eos_late(module, inputs, output):
        output = output.clone()
        output[..., eos] += bias
        return output

    forced.lm_head.register_forward_hook(prefer_eos_late)
    for stop in ((), ("a", "e")):
        sampling = SamplingParams(max_new_tokens=16, seed=3, stop=stop, temperature=temperature)
        shared = HFPolicy(forced, tokenizer, decoder="static", share_prompts=True).act(observations, sampling)
        plain = HFPolicy(forced, tokenizer, decoder="static", share_prompts=False).act(observations, sampling)
        assert [a.completion_ids for a in shared] == [b.completion_ids for b in plain]
        assert [a.finish_reason for a in shared] == [b.finish_reason for b in plain]
        lengths = {len(a.completion_ids) for a in shared}
        assert len(lengths) > 1, "rows should end at different steps"


def test_distinct_prompts_decode_exactly_as_before(tiny):
    # nothing to share: the very same computation, bit for bit
    model, tokenizer = tiny
    observations = [{"messages": [{"role": "user", "content": "count " + "a b " * k}]} for k in (1, 7, 3, 12)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=10, seed=2)
    shared = HFPolicy(model, tokenizer, decoder="static", share_prompts=True).act(observations, sampling)
    plain = HFPolicy(model, tokenizer, decoder="static", share_prompts=False).act(observations, sampling)
    assert [a.completion_ids for a in shared] == [b.completion_ids for b in plain]
    assert [a.logprobs for a in shared] == [b.logprobs for b in plain]


def test_direct_call_with_one_prompt_repeated(tiny):
    model, tokenizer = tiny
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad, 5, 6, 7]] * 4 + [[8, 9, 10, 11]] * 2)
    mask = torch.tensor([[0, 1, 1, 1]] * 4 + [[1, 1, 1, 1]] * 2)
    kwargs = dict(max_new_tokens=6, temperature=1.0, top_p=1.0, eos_ids=[tokenizer.eos_token_id], pad_id=pad)
    out = {}
    for share in (True, False):
        torch.manual_seed(4)
        out[share] = static_decode(model, ids, mask, share_prompts=share, **kwargs)
    assert torch.equal(out[True][0], out[False][0])
    assert_close_after_reduction(out[True][1], out[False][1], _logprob_terms(model, 4), "logprobs")


def test_distinct_rows_compare_the_prompt_not_its_padding():
    ids = torch.tensor([[0, 5], [0, 5], [7, 5], [3, 5], [7, 5]])
    # rows 0 and 1 hold the same ids, but row 0's 0 is padding and row 1's a token; row 3's
    # padding slot holds another id than row 0's, so rows 0 and 3 are one prompt
    mask = torch.tensor([[0, 1], [1, 1], [1, 1], [0, 1], [1, 1]])
    first, inverse = distinct_rows(ids, mask)
    assert first.tolist() == [0, 1, 2]
    assert inverse.tolist() == [0, 1, 2, 0, 2]


def test_the_option_reaches_the_policy_and_defaults_on(tiny):
    from corrgrpo.trainer.config import RolloutConfig, config_from_dict
    from corrgrpo.trainer.engines import HFEngine

    assert RolloutConfig().hf_share_prompts is True
    model, tokenizer = tiny
    for value in (True, False):
        cfg = config_from_dict({"rollout": {"hf_share_prompts": value}})
        assert HFEngine(model, tokenizer, cfg).policy.share_prompts is value


def test_the_option_refuses_a_non_boolean():
    from corrgrpo.trainer.config import config_from_dict
    from corrgrpo_registry.settings import ConfigError

    with pytest.raises(ConfigError, match="rollout.hf_share_prompts"):
        config_from_dict({"rollout": {"hf_share_prompts": "sometimes"}})


@pytest.mark.parametrize("decoder", ["static", "generate"])
def test_short_prompts_are_prefilled_per_row(tiny, decoder):
    # under MIN_SHARED_PROMPT tokens a shared prefill gains nothing to speak of
    model, tokenizer = tiny
    observations = _groups(repeats=(1, 7, 3))  # 14, 26 and 18 tokens
    rows, handle = _prefill_rows(model)
    try:
        policy = HFPolicy(model, tokenizer, decoder=decoder, share_prompts=True)
        assert max(len(p) for p in policy.prompt_ids(observations, None)) < MIN_SHARED_PROMPT
        policy.act(observations, SamplingParams(max_new_tokens=2, seed=0))
    finally:
        handle.remove()
    assert rows[0] == 12


def test_another_architecture_shares_through_generate(tiny):
    # GPT-2 (no static loop, learned absolute positions) takes the generate path
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=2048, n_positions=256)).eval()
    _, tokenizer = tiny
    prompts = [list(range(10, 10 + n)) for n in (70, 90)] * 3
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=1)
    batches: list[tuple[int, int]] = []
    handle = model.transformer.wte.register_forward_hook(lambda m, i, o: batches.append(tuple(o.shape[:2])))
    try:
        shared = HFPolicy(model, tokenizer, share_prompts=True).generate(prompts, sampling)
    finally:
        handle.remove()
    assert batches[:2] == [(2, 89), (6, 1)]  # the two prompts but their last token, then every row's last
    plain = HFPolicy(model, tokenizer, share_prompts=False).generate(prompts, sampling)
    assert [a.completion_ids for a in shared] == [b.completion_ids for b in plain]
    assert len({tuple(a.completion_ids) for a in shared}) == len(prompts)
    for a, b in zip(shared, plain):
        assert_close_after_reduction(torch.tensor(a.logprobs), torch.tensor(b.logprobs), 90 * 32, "logprobs")


def test_cascade_attention_equals_attention_over_each_rows_whole_cache():
    """The prompt part (one copy per group) and the rows' own part, merged by their log-sum-exp,
    give SDPA's grouped-query attention over each row's prompt + generated keys."""
    import torch.nn.functional as F

    from corrgrpo.agents.static_decode import _Cache, _cascade_attention, _GroupPrompts

    torch.manual_seed(0)
    groups, size, heads, kv, dim, width, generated = 3, 4, 6, 2, 8, 10, 5
    batch = groups * size
    inverse = torch.tensor([i % groups for i in range(batch)])  # a group's rows interleaved with the others'
    prefilled = _Cache.__new__(_Cache)
    prefilled.keys = [torch.randn(groups, kv, width, dim)]
    prefilled.values = [torch.randn(groups, kv, width, dim)]
    valid = torch.ones(groups, width, dtype=torch.bool)
    valid[1, :3] = False  # left padding of one prompt
    prompts = _GroupPrompts(prefilled, valid, inverse)
    q = torch.randn(batch, heads, 1, dim)
    keys, values = torch.randn(batch, kv, generated, dim), torch.randn(batch, kv, generated, dim)
    out = _cascade_attention(q, prompts, 0, keys, values, scale=dim ** -0.5)

    whole_k = torch.cat([prefilled.keys[0][inverse], keys], dim=2)
    whole_v = torch.cat([prefilled.values[0][inverse], values], dim=2)
    mask = torch.cat([valid[inverse], torch.ones(batch, generated, dtype=torch.bool)], dim=1)[:, None, None]
    expected = F.scaled_dot_product_attention(q, whole_k, whole_v, attn_mask=mask, scale=dim ** -0.5,
                                              enable_gqa=True).reshape(batch, heads * dim)
    assert_close_after_reduction(out, expected, width + generated, "attention")
    masked = prefilled.values[0].clone()
    masked[1, :, :3] = 1e6  # values at the padding are never read
    prefilled.values = [masked]
    assert_close_after_reduction(_cascade_attention(q, _GroupPrompts(prefilled, valid, inverse), 0, keys, values,
                                                    scale=dim ** -0.5), expected, width + generated, "padding")


def test_equal_groups_decode_through_one_prompt_cache_per_group(tiny, monkeypatch):
    """A batch of equal groups takes the cascade path (its cache holds the generated tokens only)
    and draws what one prefill per row draws; unequal groups take the copying path."""
    import corrgrpo.agents.static_decode as sd

    model, tokenizer = tiny
    pad = tokenizer.pad_token_id
    calls: list[int] = []
    cascade = sd._cascade_attention
    monkeypatch.setattr(sd, "_cascade_attention", lambda q, *a, **k: calls.append(q.shape[0]) or cascade(q, *a, **k))
    prompt_a, prompt_b = [pad] * 6 + list(range(5, 75)), list(range(80, 156))
    kwargs = dict(max_new_tokens=7, temperature=1.0, top_p=1.0, eos_ids=[tokenizer.eos_token_id], pad_id=pad)
    for rows, cascaded in (([prompt_a, prompt_b] * 3, True), ([prompt_a] * 4 + [prompt_b] * 2, False)):
        ids = torch.tensor(rows)
        mask = (ids != pad).long()
        out = {}
        for share in (True, False):
            calls.clear()
            torch.manual_seed(5)
            out[share] = static_decode(model, ids, mask, share_prompts=share, **kwargs)
            if share:
                steps = out[share][0].shape[1]
                assert len(calls) == (len(model.model.layers) * (steps - 1) if cascaded else 0)
        assert torch.equal(out[True][0], out[False][0])
        assert_close_after_reduction(out[True][1], out[False][1], _logprob_terms(model, ids.shape[1]), "logprobs")
