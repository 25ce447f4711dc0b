"""Per-token log-probabilities of trajectories under a causal LM."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

__all__ = ["PackedBatch", "pack_episodes", "token_logprobs", "common_prefix_length", "MIN_SHARED_PREFIX"]


class PackedBatch:
    """Right-padded tensors of a list of trajectories.

    ``input_ids``/``attention_mask``: ``[B, L]``; ``loss_mask``, ``old_logprobs``:
    ``[B, L-1]`` aligned with the *predicted* token (position t predicts t+1).
    """

    def __init__(self, input_ids, attention_mask, loss_mask, sampler_logprobs):
        self.input_ids: torch.Tensor = input_ids
        self.attention_mask: torch.Tensor = attention_mask
        self.loss_mask: torch.Tensor = loss_mask
        self.sampler_logprobs: torch.Tensor = sampler_logprobs

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def index(self, idx: torch.Tensor | slice) -> PackedBatch:
        ids = self.input_ids[idx]
        # trim the shared right padding so small micro-batches stay small
        length = int(self.attention_mask[idx].sum(1).max().item())
        return PackedBatch(
            ids[:, :length],
            self.attention_mask[idx][:, :length],
            self.loss_mask[idx][:, : length - 1],
            self.sampler_logprobs[idx][:, : length - 1],
        )


def pack_episodes(episodes: Sequence, pad_id: int, device: torch.device) -> PackedBatch:
    """Pack ``agents.Episode`` trajectories (``token_ids``, ``loss_mask``, ``logprobs``)."""
    lengths = [len(e.token_ids) for e in episodes]
    L = max(max(lengths), 2)
    B = len(episodes)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.float32)
    lp = torch.zeros((B, L), dtype=torch.float32)
    for i, e in enumerate(episodes):
        n = lengths[i]
        ids[i, :n] = torch.as_tensor(e.token_ids, dtype=torch.long)
        attn[i, :n] = 1
        mask[i, :n] = torch.as_tensor(e.loss_mask, dtype=torch.float32)
        lp[i, :n] = torch.as_tensor(e.logprobs, dtype=torch.float32)
    # the token at position t+1 is predicted at position t
    return PackedBatch(ids.to(device), attn.to(device), mask[:, 1:].to(device), lp[:, 1:].to(device))


#: the shortest common prefix worth a separate forward pass (shorter ones run with the rows)
MIN_SHARED_PREFIX = 16


def common_prefix_length(input_ids: torch.Tensor, limit: int) -> int:
    """Length of the token prefix every row of ``input_ids`` ``[B, L]`` shares, at most ``limit``."""
    if input_ids.shape[0] < 2 or limit <= 0:
        return 0
    ids = input_ids[:, :limit]
    same = (ids == ids[:1]).all(dim=0)
    differ = (~same).nonzero()
    return int(differ[0].item()) if differ.numel() else ids.shape[1]


def _forward(model: torch.nn.Module, keep: int, **kwargs) -> tuple[torch.Tensor, object]:
    """The last ``keep`` positions' logits (``logits_to_keep`` when the model takes it) and the
    model's key/value cache (``None`` without ``use_cache``)."""
    try:
        out = model(**kwargs, logits_to_keep=keep)
        return out.logits, out.past_key_values
    except TypeError:  # a model without logits_to_keep
        out = model(**kwargs)
        return out.logits[:, -keep:], out.past_key_values


def _forward_logits(model: torch.nn.Module, keep: int, **kwargs) -> torch.Tensor:
    return _forward(model, keep, **kwargs)[0]


def _shared_prefix_logits(model: torch.nn.Module, batch: PackedBatch, prefix: int, keep: int) -> torch.Tensor:
    """The logits of :func:`token_logprobs`'s one pass, with the rows' common ``prefix`` run once.

    The prefix goes through the model for one row, its key/value cache is repeated for the
    ``B`` rows, and the rest of each row runs on top of it. The cache keeps its autograd graph,
    so the gradient is that of the full pass (each row's share of the prefix's gradient is
    summed through the repeat), up to float rounding.
    """
    B = batch.input_ids.shape[0]
    _, cache = _forward(model, 1, input_ids=batch.input_ids[:1, :prefix],
                        attention_mask=batch.attention_mask[:1, :prefix], use_cache=True)
    if cache is None or not hasattr(cache, "batch_repeat_interleave"):
        # no usable cache (gradient checkpointing turns it off in training): the plain pass;
        # Python's default warning filter shows this once per run
        warnings.warn("optim.share_prefix: the model returned no key/value cache (gradient checkpointing?); "
                      "running plain forward passes", stacklevel=3)
        return _forward_logits(model, keep, input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                               use_cache=False)
    cache.batch_repeat_interleave(B)
    return _forward_logits(model, keep, input_ids=batch.input_ids[:, prefix:], attention_mask=batch.attention_mask,
                           past_key_values=cache, use_cache=True)


def token_logprobs(
    model: torch.nn.Module, batch: PackedBatch, with_entropy: bool = False, share_prefix: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities ``[B, L-1]`` of each next token, and optionally the entropy.

    Only positions from the first trained token of any row on get logits
    (``logits_to_keep``): the prompt prefix needs none, and the vocabulary
    projection and log-softmax are a large part of a step (most of it for big
    vocabularies). Positions before that are returned as 0.

    ``share_prefix``: when the rows share a prompt prefix of at least
    :data:`MIN_SHARED_PREFIX` tokens (the rollouts of one group), run it once
    (:func:`_shared_prefix_logits`); a group of G rollouts with a prompt of P
    tokens and answers of A then costs about ``P + G A`` token passes instead of
    ``G (P + A)``.
    """
    L = batch.input_ids.shape[1]
    trained = batch.loss_mask.any(dim=0).nonzero()
    first = int(trained[0].item()) if trained.numel() else L - 2
    keep = L - first  # logits of positions first .. L-1 (the last one is dropped below)
    # the prefix ends at or before ``first``: every kept position is in the second pass
    prefix = common_prefix_length(batch.input_ids, first) if share_prefix else 0
    if prefix >= MIN_SHARED_PREFIX:
        logits = _shared_prefix_logits(model, batch, prefix, keep)
    else:
        logits = _forward_logits(model, keep, input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                 use_cache=False)
    logits = logits[:, :-1].float()
    targets = batch.input_ids[:, first + 1 :]
    # fused log-softmax + gather: -cross_entropy is the log-probability of the target
    logp = -torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none"
    ).view(targets.shape)
    logp = torch.nn.functional.pad(logp, (first, 0))
    entropy = None
    if with_entropy:
        with torch.no_grad():
            lse = torch.logsumexp(logits, dim=-1, keepdim=True)
            probs = torch.exp(logits - lse)
            entropy = lse.squeeze(-1) - (probs * logits).sum(-1)
            entropy = torch.nn.functional.pad(entropy, (first, 0))
    return logp, entropy
