"""A decode loop with a preallocated KV cache for Llama-family causal LMs.

``model.generate`` spends most of a small model's decode step outside the model's
arithmetic: it grows the KV cache with ``torch.cat`` (copying it every token), repeats
the key/value heads for grouped-query attention (another copy of the whole cache per
layer and token), rebuilds the attention mask and runs its processor and stopping
machinery. This loop runs the same modules of the model (projections, norms, MLPs,
rotary embedding, head) with a cache allocated once for prompt + completion, SDPA's
own grouped-query attention and a boolean mask that grows in place. It samples exactly
as ``generate`` does (temperature, then top-p, softmax, ``torch.multinomial`` on the
global generator), so the same seed draws the same tokens wherever the two compute the
same logits; the log-probabilities it reports are the raw logits' log-softmax.

With ``share_prompts`` (the G rollouts of a GRPO group repeat one prompt), each distinct
prompt is prefilled once. When every distinct prompt has the same number of rows (a batch of
GRPO groups), its keys and values stay one copy per group and each decode step attends to them
once for the group's G rows ("cascade" attention: the prompt part and the rows' own generated
part are two softmaxes merged by their log-sum-exp), which reads the prompt's cache G times
less often than one copy per row would; otherwise they are copied to the rows that repeat it.
Decoding runs over the whole batch in its original row order, so the draws of a seed are those
of the unshared path wherever the two round alike.

Supported: decoder layers of Qwen2, Llama and Mistral (SmolLM2 is Llama) without a
sliding window. :func:`static_decode_unsupported` says why another model is not.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["static_decode", "static_decode_unsupported", "distinct_rows", "SUPPORTED_LAYERS"]

#: Decoder layer classes whose structure the loop reproduces.
SUPPORTED_LAYERS = ("Qwen2DecoderLayer", "LlamaDecoderLayer", "MistralDecoderLayer")
_ATTENTION_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")


def static_decode_unsupported(model: Any) -> str | None:
    """Why :func:`static_decode` cannot run ``model`` (None when it can)."""
    try:
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule):
            return "the model is sharded (FSDP): every forward pass is a collective"
    except ImportError:
        pass
    body = getattr(model, "model", None)
    layers = getattr(body, "layers", None)
    missing = [
        name
        for name, owner in (("model.embed_tokens", body), ("model.norm", body),
                            ("model.rotary_emb", body), ("lm_head", model))
        if getattr(owner, name.split(".")[-1], None) is None
    ]
    if layers is None or missing or len(layers) == 0:
        return f"not a Llama-family causal LM (missing {missing or ['model.layers']})"
    for layer in layers:
        kind = type(layer).__name__
        if kind not in SUPPORTED_LAYERS:
            return f"decoder layer {kind} is not one of {', '.join(SUPPORTED_LAYERS)}"
        attn = layer.self_attn
        absent = [p for p in _ATTENTION_PARTS if not hasattr(attn, p)]
        if absent or hasattr(attn, "q_norm"):
            return f"attention of {kind} differs from the supported layout ({absent or 'q_norm'})"
        if getattr(attn, "sliding_window", None) is not None:
            return "sliding-window attention"
    config = model.config
    if kind != "Qwen2DecoderLayer" and getattr(config, "sliding_window", None) is not None:
        return "sliding-window attention"
    return None


class _Cache:
    """Keys and values of every layer for ``[B, kv_heads, capacity, head_dim]``, allocated once."""

    def __init__(self, model: Any, batch: int, capacity: int, dtype: torch.dtype, device: torch.device):
        config = model.config
        kv_heads = config.num_key_value_heads
        head_dim = model.model.layers[0].self_attn.head_dim
        shape = (batch, kv_heads, capacity, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in model.model.layers]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in model.model.layers]


class _GroupPrompts:
    """The prompts of a batch of equal-sized groups, one cache row per group (``[U, kv, W, d]``).

    ``order`` lists the batch's rows group by group (``order.view(U, G)``: the rows of each
    group), ``restore`` puts rows in that order back in the batch's; ``bias`` is 0 at a
    prompt's tokens and -inf at its left padding (``[U, 1, 1, W]``).
    """

    def __init__(self, prefilled: _Cache, valid: torch.Tensor, inverse: torch.Tensor):
        self.keys, self.values = prefilled.keys, prefilled.values
        self.groups = valid.shape[0]
        self.size = inverse.numel() // self.groups
        self.order = torch.sort(inverse, stable=True).indices
        self.restore = torch.argsort(self.order)
        zero = torch.zeros((), dtype=self.keys[0].dtype, device=valid.device)
        self.bias = torch.where(valid, zero, float("-inf"))[:, None, None, :]


def equal_groups(inverse: torch.Tensor, groups: int) -> bool:
    """Whether each of ``groups`` distinct prompts has the same number of rows (more than one)."""
    counts = torch.bincount(inverse, minlength=groups)
    return groups < inverse.numel() and bool((counts == counts[0]).all())


def _softmax_parts(scores: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(unnormalised output, row max, sum of exponentials)`` of one part of an attention."""
    peak = scores.amax(-1, keepdim=True)
    weights = torch.exp(scores - peak)
    return weights @ values, peak, weights.sum(-1, keepdim=True)


def _cascade_attention(q: torch.Tensor, prompts: _GroupPrompts, layer: int, keys: torch.Tensor,
                       values: torch.Tensor, scale: float) -> torch.Tensor:
    """One decode step's attention, ``[B, H*d]``, over each row's group prompt and its own tokens.

    ``q``: ``[B, H, 1, d]``; ``keys``/``values``: the rows' generated tokens so far, ``[B, kv,
    t, d]``. Query head ``h`` reads key head ``h // (H // kv)``, as grouped-query attention does.
    """
    batch, heads, _, dim = q.shape
    kv = keys.shape[1]
    rep = heads // kv
    groups, size = prompts.groups, prompts.size
    # the prompt part: the G rows' queries of a group against its one copy of the prompt
    grouped = q[prompts.order].view(groups, size, kv, rep, dim).transpose(1, 2).reshape(groups, kv, size * rep, dim)
    scores = grouped @ prompts.keys[layer].transpose(-1, -2) * scale + prompts.bias
    prompt_parts = _softmax_parts(scores, prompts.values[layer])

    def as_rows(x: torch.Tensor) -> torch.Tensor:
        x = x.view(groups, kv, size, rep, -1).transpose(1, 2).reshape(batch, kv, rep, -1)
        return x[prompts.restore]

    out_p, peak_p, sum_p = (as_rows(x) for x in prompt_parts)
    # the generated part: every row's own tokens, all of them valid
    out_g, peak_g, sum_g = _softmax_parts(q.view(batch, kv, rep, dim) @ keys.transpose(-1, -2) * scale, values)
    peak = torch.maximum(peak_p, peak_g)
    w_p, w_g = torch.exp(peak_p - peak), torch.exp(peak_g - peak)
    return ((out_p * w_p + out_g * w_g) / (sum_p * w_p + sum_g * w_g)).reshape(batch, heads * dim)


def _layers(model: Any, rope: Callable, ids: torch.Tensor, positions: torch.Tensor,
            attend: Callable[[int, Any, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Float32 logits ``[B, V]`` of the last of ``ids`` (``[B, S]``) through the model's layers;
    ``attend(layer, attn, q, k, v)`` stores the keys and values and returns ``[B, S, H*d]``."""
    body = model.model
    hidden = body.embed_tokens(ids)
    cos, sin = body.rotary_emb(hidden, positions)
    batch, length, _ = hidden.shape
    for i, layer in enumerate(body.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(hidden)
        shape = (batch, length, -1, attn.head_dim)
        q = attn.q_proj(x).view(shape).transpose(1, 2)
        k = attn.k_proj(x).view(shape).transpose(1, 2)
        v = attn.v_proj(x).view(shape).transpose(1, 2)
        q, k = rope(q, k, cos, sin)
        hidden = hidden + attn.o_proj(attend(i, attn, q, k, v))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return model.lm_head(body.norm(hidden[:, -1:]))[:, -1].float()


def _decode_forward(model: Any, rope: Callable, ids: torch.Tensor, positions: torch.Tensor,
                    prompts: _GroupPrompts, cache: _Cache, slot: int) -> torch.Tensor:
    """Float32 logits ``[B, V]`` of one new token per row (``ids`` ``[B, 1]``), written to the
    generated-token cache's slot ``slot``, over the rows' group prompts and generated tokens."""

    def attend(i: int, attn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cache.keys[i][:, :, slot] = k[:, :, 0]
        cache.values[i][:, :, slot] = v[:, :, 0]
        keys, values = cache.keys[i][:, :, : slot + 1], cache.values[i][:, :, : slot + 1]
        return _cascade_attention(q, prompts, i, keys, values, attn.scaling)[:, None]

    return _layers(model, rope, ids, positions, attend)


def _forward(model: Any, rope: Callable, ids: torch.Tensor, positions: torch.Tensor,
             cache: _Cache, start: int, mask: torch.Tensor) -> torch.Tensor:
    """Float32 logits ``[B, V]`` of the last of ``ids`` (``[B, S]``, cache slots ``start:start+S``)."""
    end = start + ids.shape[1]

    def attend(i: int, attn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cache.keys[i][:, :, start:end] = k
        cache.values[i][:, :, start:end] = v
        out = F.scaled_dot_product_attention(
            q, cache.keys[i][:, :, :end], cache.values[i][:, :, :end],
            attn_mask=mask, scale=attn.scaling, enable_gqa=True,
        )
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)

    return _layers(model, rope, ids, positions, attend)


def distinct_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, inverse)``: the index of the first row of each distinct left-padded prompt, in
    order of appearance, and for every row the position in ``first`` of its prompt's row."""
    seen: dict[tuple[int, ...], int] = {}
    first: list[int] = []
    inverse: list[int] = []
    masked = torch.where(attention_mask.bool(), input_ids, -1).tolist()
    for row, key in enumerate(map(tuple, masked)):
        if key not in seen:
            seen[key] = len(first)
            first.append(row)
        inverse.append(seen[key])
    device = input_ids.device
    return torch.tensor(first, dtype=torch.long, device=device), torch.tensor(inverse, dtype=torch.long, device=device)


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering as transformers' ``TopPLogitsWarper`` does it (at least one token kept)."""
    sorted_logits, sorted_indices = torch.sort(scores, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - top_p)
    remove[..., -1:] = False
    remove = remove.scatter(1, sorted_indices, remove)
    return scores.masked_fill(remove, -float("inf"))


@torch.no_grad()
def static_decode(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    eos_ids: Sequence[int],
    pad_id: int,
    stopping: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    share_prompts: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample up to ``max_new_tokens`` after left-padded prompts.

    Args:
        input_ids, attention_mask: ``[B, W]`` left-padded prompts and their mask.
        temperature: 0 for greedy decoding.
        stopping: ``(ids_so_far [B, W+t], scores) -> [B] bool`` rows that are done
            (stop strings); EOS is handled here.
        share_prompts: prefill each distinct prompt once (a group's G rollouts): about ``U / B``
            of the prefill's work for ``U`` distinct prompts in ``B`` rows. With equal groups the
            decode reads each prompt's cache once per group (cascade attention); with unequal
            ones the cache is copied to the rows. Nothing changes when every row differs.

    Returns:
        ``(generated [B, T], logprobs [B, T])``: the generated ids (rows that finished
        early are padded with ``pad_id``, as ``generate`` pads them) and the float32
        log-probability of each under the raw logits (temperature 1, no top-p); after a
        row's last token its log-probabilities are 0 when decoding greedily.
    """
    reason = static_decode_unsupported(model)
    if reason is not None:
        raise ValueError(f"static_decode cannot run this model: {reason}")
    device = input_ids.device
    batch, width = input_ids.shape
    capacity = width + max_new_tokens
    rope = sys.modules[type(model.model.layers[0].self_attn).__module__].apply_rotary_pos_emb
    dtype = model.model.embed_tokens.weight.dtype
    first, inverse = distinct_rows(input_ids, attention_mask) if share_prompts else (None, None)
    cascade = first is not None and equal_groups(inverse, len(first))
    # with cascade attention the cache holds the generated tokens only; the prompts stay in
    # ``prompts``, one row per group
    cache = _Cache(model, batch, max_new_tokens if cascade else capacity, dtype, device)

    tokens = torch.full((batch, capacity), pad_id, dtype=torch.long, device=device)
    tokens[:, :width] = input_ids
    valid = torch.zeros((batch, capacity), dtype=torch.bool, device=device)
    valid[:, :width] = attention_mask.bool()
    eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device)

    # prefill: causal attention over real tokens; a padding position attends to itself only,
    # which keeps its (unused) values finite
    causal = torch.ones((width, width), dtype=torch.bool, device=device).tril()
    eye = torch.eye(width, dtype=torch.bool, device=device)
    mask = causal & (valid[:, None, None, :width] | eye)
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    prompts = None
    if cascade:
        prefilled = _Cache(model, len(first), width, dtype, device)
        logits = _forward(model, rope, input_ids[first], positions[first], prefilled, 0, mask[first])
        prompts = _GroupPrompts(prefilled, valid[first, :width], inverse)
        logits = logits.index_select(0, inverse)
    elif first is not None and len(first) < batch:
        # one prefill per distinct prompt (same width, so the same padding and positions), then
        # every row gets its prompt's keys and values; the decode below is the unshared one
        prefilled = _Cache(model, len(first), width, dtype, device)
        logits = _forward(model, rope, input_ids[first], positions[first], prefilled, 0, mask[first])
        for layer in range(len(cache.keys)):
            cache.keys[layer][:, :, :width] = prefilled.keys[layer].index_select(0, inverse)
            cache.values[layer][:, :, :width] = prefilled.values[layer].index_select(0, inverse)
        logits = logits.index_select(0, inverse)
        del prefilled
    else:
        logits = _forward(model, rope, input_ids, positions, cache, 0, mask)
    position = attention_mask.long().sum(-1, keepdim=True)  # of the first generated token

    unfinished = torch.ones(batch, dtype=torch.bool, device=device)
    # Greedy rows are independent, so rows that have finished leave the batch: the cache
    # and the forward pass shrink to the rows still running (the row order of a sampled
    # batch stays fixed, since ``torch.multinomial`` draws per row of the whole batch).
    # ``rows`` maps the cache's rows to the batch's; compacting copies the cache, so it
    # waits until a quarter of the cache's rows are done.
    rows = torch.arange(batch, device=device)
    logprobs: list[torch.Tensor] = []
    steps = 0
    for t in range(max_new_tokens):
        logp = torch.log_softmax(logits, dim=-1)
        if temperature == 0.0:
            picked = torch.argmax(logits, dim=-1)
        else:
            scores = logits / temperature if temperature != 1.0 else logits
            if top_p < 1.0:
                scores = _top_p(scores, top_p)
            picked = torch.multinomial(F.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        picked = torch.where(unfinished[rows], picked, torch.full_like(picked, pad_id))
        next_tokens = torch.full((batch,), pad_id, dtype=torch.long, device=device)
        next_tokens[rows] = picked
        step_logp = torch.zeros(batch, dtype=logp.dtype, device=device)
        step_logp[rows] = logp.gather(-1, picked[:, None]).squeeze(-1)
        logprobs.append(step_logp)
        at = width + t
        tokens[:, at] = next_tokens
        valid[:, at] = True
        steps = t + 1
        unfinished &= ~torch.isin(next_tokens, eos)
        if stopping is not None:
            unfinished[rows] &= ~stopping(tokens[rows, : at + 1], logits)
        if t + 1 == max_new_tokens or not bool(unfinished.any()):
            break
        if prompts is not None:  # the groups stay whole: finished rows decode on, unread
            logits = _decode_forward(model, rope, next_tokens[:, None], position, prompts, cache, t)
            position = position + 1
            continue
        running = unfinished[rows]
        if temperature == 0.0 and int(running.sum()) <= 0.75 * len(rows):
            keep = running.nonzero().squeeze(1)
            cache.keys = [k.index_select(0, keep) for k in cache.keys]
            cache.values = [v.index_select(0, keep) for v in cache.values]
            rows, position = rows[keep], position[keep]
        logits = _forward(model, rope, next_tokens[rows, None], position, cache, at, valid[rows, None, None, : at + 1])
        position = position + 1
    generated = tokens[:, width : width + steps]
    return generated, torch.stack(logprobs, dim=1) if logprobs else torch.zeros((batch, 0))
