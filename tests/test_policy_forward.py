"""Per-token log-probabilities used by the loss equal a plain full forward pass."""

from __future__ import annotations

import pytest
import torch

from corrgrpo.agents import Episode, load_model
from corrgrpo.trainer.policy_forward import pack_episodes, token_logprobs
from tests.tolerances import assert_close_after_reduction


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


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_shared_prefix_gives_the_full_pass_log_probs_entropy_and_gradient():
    from corrgrpo.trainer.policy_forward import MIN_SHARED_PREFIX

    torch.manual_seed(0)
    model, tok = load_model("tiny")
    prompt = list(range(5, 5 + MIN_SHARED_PREFIX + 9))  # one group: every row has this prompt
    episodes = [_episode(prompt, [40, 41, 42]), _episode(prompt, [43, 44, 45, 46, 47, 48]),
                _episode(prompt, [49]), _episode(prompt, [50, 51])]
    batch = pack_episodes(episodes, tok.pad_token_id, torch.device("cpu"))
    out = {}
    for share in (False, True):
        model.zero_grad()
        logp, entropy = token_logprobs(model, batch, with_entropy=True, share_prefix=share)
        (logp * batch.loss_mask).sum().backward()
        out[share] = (logp.detach(), entropy, _grads(model))
    torch.testing.assert_close(out[True][0], out[False][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[True][1], out[False][1], atol=1e-4, rtol=1e-5)
    # A weight's gradient sums one outer product per token position, each the product of
    # hidden-size-long sums: the reduction the two passes order differently.
    terms = batch.input_ids.numel() * model.config.hidden_size
    assert out[True][2].keys() == out[False][2].keys()
    for name, grad in out[False][2].items():
        assert_close_after_reduction(out[True][2][name], grad, terms, name)


def test_shared_prefix_is_left_out_when_the_rows_share_too_little():
    from corrgrpo.trainer.policy_forward import MIN_SHARED_PREFIX, common_prefix_length

    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 9, 4], [1, 2, 3, 7]])
    assert common_prefix_length(ids, 10) == 2
    assert common_prefix_length(ids, 1) == 1
    assert common_prefix_length(ids[:1], 10) == 0  # one row: nothing to share
    torch.manual_seed(0)
    model, tok = load_model("tiny")
    # two groups in one micro-batch: the common prefix is below the minimum, so one plain pass
    short = [_episode(list(range(5, 5 + MIN_SHARED_PREFIX - 1)) + [90], [40, 41]),
             _episode(list(range(5, 5 + MIN_SHARED_PREFIX - 1)) + [91], [42])]
    batch = pack_episodes(short, tok.pad_token_id, torch.device("cpu"))
    plain, _ = token_logprobs(model, batch)
    shared, _ = token_logprobs(model, batch, share_prefix=True)
    assert torch.equal(plain, shared)


@pytest.mark.slow
def test_share_prefix_trains_a_step_like_the_full_pass(tmp_path):
    """One GRPO step on the tiny model's toy config: the same update with and without sharing."""
    import json

    from corrgrpo.trainer.config import load_config
    from corrgrpo.trainer.trainer import Trainer

    torch.set_num_threads(1)
    records = {}
    for share in (False, True):
        run = tmp_path / f"share-{share}"
        cfg = load_config("env_configs/quickstart.yaml", [
            "train.steps=1", f"train.output_dir={run}", "train.progress=false", "train.tensorboard=false",
            "train.save_final=false", f"optim.share_prefix={str(share).lower()}", "algorithm.prompts_per_step=2",
            "algorithm.group_size=4", "rollout.max_new_tokens=8", "optim.micro_batch_size=4"])
        Trainer(cfg).train()
        records[share] = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert records[False]["grad_norm"] > 0  # the step updated
    for key in ("grad_norm", "update_norm", "entropy"):
        assert records[True][key] == pytest.approx(records[False][key], rel=1e-4, abs=1e-7), key


def test_shared_prefix_falls_back_to_the_plain_pass_under_gradient_checkpointing():
    from corrgrpo.trainer.policy_forward import MIN_SHARED_PREFIX

    torch.manual_seed(0)
    model, tok = load_model("tiny")
    prompt = list(range(5, 5 + MIN_SHARED_PREFIX + 4))
    batch = pack_episodes([_episode(prompt, [40, 41]), _episode(prompt, [42, 43, 44])], tok.pad_token_id,
                          torch.device("cpu"))
    plain, _ = token_logprobs(model, batch)
    model.gradient_checkpointing_enable()
    model.train()
    with pytest.warns(UserWarning, match="share_prefix"):
        shared, _ = token_logprobs(model, batch, share_prefix=True)
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-5)


class _NoLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward has no ``logits_to_keep``: logits at every position."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.inner = model

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=use_cache)


class _IgnoresLogitsToKeep(_NoLogitsToKeep):
    """Names ``logits_to_keep`` and ignores it."""

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, logits_to_keep=0):
        return super().forward(input_ids, attention_mask, position_ids, use_cache)


class _Wrapper(torch.nn.Module):
    """Hands every argument on, as DDP does (its forward says only ``**kwargs``)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.module = model

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def test_one_forward_pass_keeps_the_same_logits_whatever_the_model_takes():
    from corrgrpo.agents.models import takes_logits_to_keep
    from corrgrpo.trainer.policy_forward import model_logits, token_scores

    torch.manual_seed(0)
    model, tok = load_model("tiny")
    assert takes_logits_to_keep(model) and takes_logits_to_keep(_Wrapper(model))
    assert not takes_logits_to_keep(_NoLogitsToKeep(model))
    assert takes_logits_to_keep(_IgnoresLogitsToKeep(model))
    batch = pack_episodes([_episode([5, 6, 7], [10, 11]), _episode([5, 6, 7, 8, 9], [12, 13, 14])],
                          tok.pad_token_id, torch.device("cpu"))
    inputs = batch.model_inputs()
    with torch.no_grad():
        full = model(**inputs).logits
        index = torch.tensor([1, 4, 6])
        for variant in (model, _Wrapper(model), _NoLogitsToKeep(model), _IgnoresLogitsToKeep(model)):
            last, _ = model_logits(variant, 3, **inputs)
            picked, _ = model_logits(variant, index, **inputs)
            torch.testing.assert_close(last, full[:, -3:], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(picked, full[:, index], atol=1e-5, rtol=1e-5)
        # logits at the positions some row trains only give the same scores there
        dense = token_scores(model, batch, with_entropy=True, with_accuracy=True)
        sparse = token_scores(_NoLogitsToKeep(model), batch, with_entropy=True, with_accuracy=True,
                              only_trained=True)
    mask = batch.loss_mask.bool()
    torch.testing.assert_close(sparse.logp[mask], dense.logp[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sparse.entropy[mask], dense.entropy[mask], atol=1e-4, rtol=1e-5)
    assert torch.equal(sparse.correct[mask], dense.correct[mask])
    # positions no row trains got no logits
    untrained = ~mask.any(dim=0)
    assert untrained.sum() == 2 and not sparse.logp[:, untrained].any() and not sparse.correct[:, untrained].any()
    want = full[:, :-1].argmax(-1) == batch.input_ids[:, 1:]
    assert torch.equal(dense.correct[mask], want[mask])
