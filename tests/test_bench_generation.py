"""bench.generation's ``static+copied`` contender: the static loop as it was before cascade attention."""

from __future__ import annotations

import torch

import corrgrpo.agents.static_decode as decode
from bench.generation import _copied_prompt_caches
from corrgrpo.agents import load_model


def test_copied_prompt_caches_take_the_copying_path_and_draw_the_same(monkeypatch):
    model, tokenizer = load_model("tiny")
    pad = tokenizer.pad_token_id
    calls: list[int] = []
    cascade = decode._cascade_attention
    monkeypatch.setattr(decode, "_cascade_attention", lambda q, *a, **k: calls.append(1) or cascade(q, *a, **k))
    ids = torch.tensor([list(range(5, 75)), list(range(80, 150))] * 2)
    mask = torch.ones_like(ids)
    kwargs = dict(max_new_tokens=4, temperature=1.0, top_p=1.0, eos_ids=[tokenizer.eos_token_id], pad_id=pad,
                  share_prompts=True)
    out = {}
    for copied in (False, True):
        calls.clear()
        torch.manual_seed(1)
        with _copied_prompt_caches(copied):
            out[copied] = decode.static_decode(model, ids, mask, **kwargs)
        assert bool(calls) is not copied
    assert torch.equal(out[False][0], out[True][0])
    assert decode.equal_groups.__name__ == "equal_groups"  # put back after the block
