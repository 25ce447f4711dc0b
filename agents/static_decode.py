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
prompt is prefilled once and its keys, values and last logits are copied to the rows that
repeat it; decoding then runs over the whole batch in its original row order, so the draws
of a seed are those of the unshared prefill wherever the two prefills round alike.

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


def _forward(model: Any, rope: Callable, ids: torch.Tensor, positions: torch.Tensor,
             cache: _Cache, start: int, mask: torch.Tensor) -> torch.Tensor:
    """Float32 logits ``[B, V]`` of the last of ``ids`` (``[B, S]``, cache slots ``start:start+S``)."""
    body = model.model
    hidden = body.embed_tokens(ids)
    cos, sin = body.rotary_emb(hidden, positions)
    batch, length, _ = hidden.shape
    end = start + length
    for i, layer in enumerate(body.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(hidden)
        shape = (batch, length, -1, attn.head_dim)
        q = attn.q_proj(x).view(shape).transpose(1, 2)
        k = attn.k_proj(x).view(shape).transpose(1, 2)
        v = attn.v_proj(x).view(shape).transpose(1, 2)
        q, k = rope(q, k, cos, sin)
        cache.keys[i][:, :, start:end] = k
        cache.values[i][:, :, start:end] = v
        out = F.scaled_dot_product_attention(
            q, cache.keys[i][:, :, :end], cache.values[i][:, :, :end],
            attn_mask=mask, scale=attn.scaling, enable_gqa=True,
        )
        hidden = hidden + attn.o_proj(out.transpose(1, 2).reshape(batch, length, -1))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return model.lm_head(body.norm(hidden[:, -1:]))[:, -1].float()


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
        share_prompts: prefill each distinct prompt once and copy its cache to the rows that
            repeat it (a group's G rollouts): about ``U / B`` of the prefill's work for ``U``
            distinct prompts in ``B`` rows; nothing changes when every row differs.

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
    cache = _Cache(model, batch, capacity, dtype, device)

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
    first, inverse = distinct_rows(input_ids, attention_mask) if share_prompts else (None, None)
    if first is not None and len(first) < batch:
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
