"""Per-token log-probabilities of trajectories under a causal LM: the one forward pass the
updates of ``corrgrpo train`` (RL losses) and ``corrgrpo sft`` (cross-entropy) run."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from corrgrpo.agents.models import takes_logits_to_keep

__all__ = [
    "MIN_SHARED_PREFIX",
    "PackedBatch",
    "TokenScores",
    "common_prefix_length",
    "model_logits",
    "pack_episodes",
    "pack_in_one_row",
    "token_logprobs",
    "token_scores",
]


class PackedBatch:
    """Tensors of a list of trajectories, right-padded rows or (``position_ids``) packed ones.

    ``input_ids``/``attention_mask``: ``[B, L]``; ``loss_mask``, ``sampler_logprobs``:
    ``[B, L-1]`` aligned with the *predicted* token (position t predicts t+1).
    ``sampler_logprobs`` is None where no sampler produced the tokens (supervised data).
    ``position_ids``: ``[B, L]`` for rows holding several trajectories back to back, position
    ids restarting at each; the forward pass then gives the model these instead of the
    attention mask, so attention stays inside each trajectory. None for padded rows.
    """

    def __init__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        loss_mask: torch.Tensor,
        sampler_logprobs: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ):
        self.input_ids: torch.Tensor = input_ids
        self.attention_mask: torch.Tensor = attention_mask
        self.loss_mask: torch.Tensor = loss_mask
        self.sampler_logprobs: torch.Tensor | None = sampler_logprobs
        self.position_ids: torch.Tensor | None = position_ids

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def index(self, idx: torch.Tensor | slice) -> PackedBatch:
        ids = self.input_ids[idx]
        # trim the shared right padding so small micro-batches stay small
        length = int(self.attention_mask[idx].sum(1).max().item())
        lp, pos = self.sampler_logprobs, self.position_ids
        return PackedBatch(
            ids[:, :length],
            self.attention_mask[idx][:, :length],
            self.loss_mask[idx][:, : length - 1],
            None if lp is None else lp[idx][:, : length - 1],
            None if pos is None else pos[idx][:, :length],
        )

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """The keyword arguments of the model's forward pass over these rows."""
        if self.position_ids is not None:
            # no attention mask: transformers then builds a block mask from the restarting ids
            return {"input_ids": self.input_ids, "position_ids": self.position_ids}
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}


def pack_episodes(episodes: Sequence, pad_id: int, device: torch.device) -> PackedBatch:
    """Pack ``agents.Episode`` trajectories (``token_ids``, ``loss_mask``, ``logprobs``), one
    right-padded row each."""
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


def pack_in_one_row(episodes: Sequence, device: torch.device) -> PackedBatch:
    """Trajectories concatenated padding-free in one row, position ids restarting at each.

    The last position of a trajectory predicts the first token of the next one: it is never
    trained (the first token of a trajectory is never a target). No sampler log-probabilities.
    """
    ids, pos, mask = [], [], []
    for e in episodes:
        n = len(e.token_ids)
        ids.append(torch.as_tensor(e.token_ids, dtype=torch.long))
        pos.append(torch.arange(n, dtype=torch.long))
        # position t (of this trajectory) predicts its token t + 1; its last one predicts nothing
        mask.append(torch.as_tensor([*e.loss_mask[1:], 0], dtype=torch.float32))
    row = torch.cat(ids)[None]
    return PackedBatch(row.to(device), torch.ones_like(row).to(device), torch.cat(mask)[None, :-1].to(device),
                       None, torch.cat(pos)[None].to(device))


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


#: which positions get logits: the last ``keep`` ones (an int) or those ``keep`` indexes (1-D)
Keep = int | torch.Tensor


def model_logits(model: torch.nn.Module, keep: Keep, **kwargs) -> tuple[torch.Tensor, object]:
    """The kept positions' logits ``[B, K, V]`` and the model's key/value cache (``None``
    without ``use_cache``): the one forward pass of the trainers.

    ``logits_to_keep`` when the model takes it (:func:`corrgrpo.agents.models.takes_logits_to_keep`):
    the vocabulary projection, a large part of a pass, then runs only there. Otherwise, or when
    the model ignored it, the logits of every position are cut here.
    """
    out = model(**kwargs, logits_to_keep=keep) if takes_logits_to_keep(model) else model(**kwargs)
    logits = out.logits
    count = keep if isinstance(keep, int) else keep.shape[0]
    if logits.shape[1] != count:
        logits = logits[:, -keep:] if isinstance(keep, int) else logits[:, keep]
    return logits, out.past_key_values


def _shared_prefix_logits(model: torch.nn.Module, batch: PackedBatch, prefix: int, keep: Keep) -> torch.Tensor:
    """The logits of :func:`token_scores`'s one pass, with the rows' common ``prefix`` run once.

    The prefix goes through the model for one row, its key/value cache is repeated for the
    ``B`` rows, and the rest of each row runs on top of it. The cache keeps its autograd graph,
    so the gradient is that of the full pass (each row's share of the prefix's gradient is
    summed through the repeat), up to float rounding. Every kept position is past the prefix.
    """
    B = batch.input_ids.shape[0]
    _, cache = model_logits(model, 1, input_ids=batch.input_ids[:1, :prefix],
                            attention_mask=batch.attention_mask[:1, :prefix], use_cache=True)
    if cache is None or not hasattr(cache, "batch_repeat_interleave"):
        # no usable cache (gradient checkpointing turns it off in training): the plain pass;
        # Python's default warning filter shows this once per run
        warnings.warn("optim.share_prefix: the model returned no key/value cache (gradient checkpointing?); "
                      "running plain forward passes", stacklevel=3)
        return model_logits(model, keep, **batch.model_inputs(), use_cache=False)[0]
    cache.batch_repeat_interleave(B)
    rest = keep if isinstance(keep, int) else keep - prefix
    return model_logits(model, rest, input_ids=batch.input_ids[:, prefix:], attention_mask=batch.attention_mask,
                        past_key_values=cache, use_cache=True)[0]


@dataclass
class TokenScores:
    """Per-token numbers of one pass, each ``[B, L-1]`` (position t scores token t + 1) and 0
    (False) at the positions that got no logits."""

    logp: torch.Tensor
    """Log-probability of each next token; the gradient flows to the model through it."""

    entropy: torch.Tensor | None = None
    """Entropy of each next-token distribution (no gradient), when asked for."""

    correct: torch.Tensor | None = None
    """Bool: the next token is the distribution's argmax (token accuracy), when asked for."""


def token_scores(
    model: torch.nn.Module,
    batch: PackedBatch,
    *,
    with_entropy: bool = False,
    with_accuracy: bool = False,
    share_prefix: bool = False,
    only_trained: bool = False,
) -> TokenScores:
    """Scores of each next token of ``batch`` under ``model`` (:class:`TokenScores`).

    Only some positions get logits (``logits_to_keep``, :func:`model_logits`): the vocabulary
    projection and log-softmax are a large part of a step (most of it for big vocabularies).
    By default every position from the first trained one of any row on (one slice: RL's
    completions follow their prompt); with ``only_trained`` exactly the positions that predict
    a trained token of some row (an index: the other trajectories' prompts sit between them in
    packed rows). A batch without trained tokens keeps one position, so the pass still reaches
    every weight.

    ``share_prefix``: when the padded rows share a prompt prefix of at least
    :data:`MIN_SHARED_PREFIX` tokens (the rollouts of one group), run it once
    (:func:`_shared_prefix_logits`); a group of G rollouts with a prompt of P tokens and
    answers of A then costs about ``P + G A`` token passes instead of ``G (P + A)``.
    """
    B, L = batch.input_ids.shape
    device = batch.input_ids.device
    trained = batch.loss_mask.any(dim=0).nonzero().squeeze(1)
    if not trained.numel():
        trained = torch.full((1,), L - 2, dtype=torch.long, device=device)
    first = int(trained[0].item())
    # the prefix ends at or before ``first``: every kept position is in the second pass
    prefix = common_prefix_length(batch.input_ids, first) if share_prefix and batch.position_ids is None else 0
    keep: Keep = trained if only_trained else L - first  # positions first .. L-1, the last dropped below
    if prefix >= MIN_SHARED_PREFIX:
        logits = _shared_prefix_logits(model, batch, prefix, keep)
    else:
        logits = model_logits(model, keep, **batch.model_inputs(), use_cache=False)[0]
    if only_trained:
        positions = trained
    else:
        positions = torch.arange(first, L - 1, device=device)
        logits = logits[:, :-1]
    logits = logits.float()
    targets = batch.input_ids[:, positions + 1]
    # fused log-softmax + gather: -cross_entropy is the log-probability of the target
    logp = -torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none"
    ).view(targets.shape)

    def placed(values: torch.Tensor) -> torch.Tensor:
        return values.new_zeros((B, L - 1)).index_copy(1, positions, values)

    scores = TokenScores(placed(logp))
    with torch.no_grad():
        if with_entropy:
            lse = torch.logsumexp(logits, dim=-1, keepdim=True)
            probs = torch.exp(logits - lse)
            scores.entropy = placed(lse.squeeze(-1) - (probs * logits).sum(-1))
        if with_accuracy:
            scores.correct = placed(logits.argmax(-1) == targets)
    return scores


def token_logprobs(
    model: torch.nn.Module, batch: PackedBatch, with_entropy: bool = False, share_prefix: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(log-probabilities, entropy or None)``, each ``[B, L-1]``, of :func:`token_scores`.

    Positions before the first trained token of any row are 0.
    """
    scores = token_scores(model, batch, with_entropy=with_entropy, share_prefix=share_prefix)
    return scores.logp, scores.entropy
