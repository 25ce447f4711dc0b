"""Per-token log-probabilities used by the loss equal a plain full forward pass."""

from __future__ import annotations

import torch

from agents import Episode, load_model
from trainer.policy_forward import pack_episodes, token_logprobs


def _episode(prompt: list[int], completion: list[int]) -> Episode:
    ep = Episode()
    ep.append_context(prompt)
    ep.token_ids.extend(completion)
    ep.loss_mask.extend([1] * len(completion))
    ep.logprobs.extend([0.0] * len(completion))
    return ep


def test_token_logprobs_match_full_log_softmax():
    torch.manual_seed(0)
    model, tok = load_model("tiny")
    episodes = [
        _episode([5, 6, 7, 8, 9], [10, 11, 12]),
        _episode([5, 6], [13, 14, 15, 16, 17, 18]),
        _episode([5, 6, 7], [19]),
    ]
    batch = pack_episodes(episodes, tok.pad_token_id, torch.device("cpu"))
    logp, entropy = token_logprobs(model, batch, with_entropy=True)
    with torch.no_grad():
        full = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
        all_logp = torch.log_softmax(full.float(), dim=-1)
        want = all_logp.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
        want_entropy = -(all_logp.exp() * all_logp).sum(-1)
    mask = batch.loss_mask.bool()
    assert logp.shape == batch.loss_mask.shape
    torch.testing.assert_close(logp[mask], want[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy[mask], want_entropy[mask], atol=1e-4, rtol=1e-5)
    # gradients flow to the model through the trained positions
    (logp * batch.loss_mask).sum().backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
