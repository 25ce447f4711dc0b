"""A policy over a transformers causal LM and its ``generate``."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from corrgrpo.agents.models import takes_logits_to_keep
from corrgrpo.agents.policy import Action, SamplingParams
from corrgrpo.agents.static_decode import distinct_rows, static_decode, static_decode_unsupported
from corrgrpo.agents.token_policy import TokenPolicy

__all__ = ["HFPolicy", "finish_completion", "DECODERS", "MIN_SHARED_PROMPT"]

#: ``HFPolicy(decoder=...)``: ``auto`` (the static-cache loop where the model is supported,
#: else ``generate``), ``static`` (:func:`corrgrpo.agents.static_decode.static_decode`), ``generate``.
DECODERS = ("auto", "static", "generate")

#: Prompts shorter than this (tokens, padded width of a batch) are prefilled per row even with
#: ``share_prompts``: their prefill costs about one decode step, and sharing it through
#: ``generate`` adds a forward pass (measured 0.93x on the anchor's 15-token prompts).
MIN_SHARED_PROMPT = 64


class _SampledLogprobs:
    """A logits processor that records the log-probability of each sampled token.

    It sees the scores before temperature and top-p are applied (``generate`` runs
    custom processors before its sampling warpers) and keeps one ``[B, V]``
    log-softmax at a time, so memory does not grow with the completion length the
    way ``output_logits`` does (``[B, T, V]``: tens of GB for long completions
    over a 150k vocabulary).
    """

    def __init__(self, prompt_width: int):
        self.width = prompt_width
        self.previous: torch.Tensor | None = None
        self.values: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] > self.width and self.previous is not None:
            self.values.append(self.previous.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def result(self, sequences: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` logprobs of the ``T`` generated tokens of ``sequences``."""
        generated = sequences.shape[1] - self.width
        if len(self.values) < generated and self.previous is not None:
            self.values.append(self.previous.gather(-1, sequences[:, -1:]).squeeze(-1))
        if not self.values:
            return torch.zeros((sequences.shape[0], 0))
        return torch.stack(self.values[:generated], dim=1)


def finish_completion(
    tokenizer: Any, ids: Sequence[int], eos_ids: set[int], stop: Sequence[str]
) -> tuple[list[int], str, str]:
    """Cut raw generated ids at the first EOS or stop string.

    Returns ``(completion_ids, text, finish_reason)``. The EOS token is kept in
    the ids; a stop string ends the ids at the token that completes it and is
    left out of the text.
    """
    ids = [int(i) for i in ids]
    end = next((k for k, t in enumerate(ids) if t in eos_ids), None)
    body = ids if end is None else ids[:end]
    text = tokenizer.decode(body, skip_special_tokens=True)
    if stop and any(s in text for s in stop):
        # the shortest prefix whose text contains a stop string (containment only grows with k)
        lo, hi = 1, len(body)
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in tokenizer.decode(body[:mid], skip_special_tokens=True) for s in stop):
                hi = mid
            else:
                lo = mid + 1
        cut_text = tokenizer.decode(body[:lo], skip_special_tokens=True)
        at = min(cut_text.find(s) for s in stop if s in cut_text)
        return body[:lo], cut_text[:at], "stop"
    if end is not None:
        return body + [ids[end]], text, "stop"
    return body, text, "length"


class _StopStrings(StoppingCriteria):
    """Ends a row once its recent generated text contains a stop string.

    (transformers' own ``stop_strings`` precomputes tables over the whole vocabulary on
    every call; decoding a short tail per row is cheaper for the batch sizes used here.)
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str], prompt_width: int):
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.prompt_width = prompt_width
        self.window = max(len(s) for s in stop) + 2  # every token decodes to >= 1 character

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        tails = input_ids[:, self.prompt_width :][:, -self.window :].tolist()
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
        done = [any(s in text for s in self.stop) for text in texts]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def _is_sharded(model: Any) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(model, FSDPModule)


class HFPolicy(TokenPolicy):
    """Samples from a transformers causal LM (left-padded batches); reports exact tokens and logprobs.

    Args:
        model: a transformers causal LM. It is used in place, never copied, so a
            trainer can optimize the same object between calls.
        tokenizer: its tokenizer, with a chat template.
        device: where inputs go (default: the model's device).
        batch_size: most conversations per ``generate`` call (default: all at once).
        decoder: ``auto`` (default): the decode loop with a preallocated KV cache of
            :mod:`corrgrpo.agents.static_decode` for Llama-family models (Qwen2, Llama, Mistral),
            which is faster than ``generate`` and samples the same way, else ``generate``;
            ``static``: that loop (an error for other models); ``generate``: transformers'
            ``model.generate``. A model sharded by FSDP always uses ``generate`` with
            ``synced_gpus`` (every process runs forward passes until all are done).
        share_prompts: when several prompts of a call are the same (the G rollouts of a
            group), compute each distinct prompt's key/value cache once and copy it to the
            rows that repeat it before decoding (default; for batches of prompts of at least
            :data:`MIN_SHARED_PROMPT` tokens); the static loop, given groups of equal size,
            keeps one copy per group and reads it once per group at each decode step
            (:func:`~corrgrpo.agents.static_decode.static_decode`). Decoding then runs as without sharing (same
            rows, same order, same draws from the global generator), so a seed draws the
            same tokens; only the float rounding differs (a batch of U rows sums
            in another order than one of B; ``generate`` also computes the prompt's last
            token in a one-token step on the shared cache; the static loop's two-part
            softmax adds in another order than one over the whole cache), about 1e-6 of a logprob in
            float32, so a draw differs only where that moves it across a sampling
            boundary. Not used for a model sharded by FSDP (each process's prefill would
            be a collective of its own).

    Logprobs are the log-softmax of the model's raw logits (temperature 1, no
    top-p), computed in float32 as generation goes (one ``[B, V]`` buffer at a time).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: str | torch.device | None = None,
        batch_size: int | None = None,
        decoder: str = "auto",
        share_prompts: bool = True,
    ):
        super().__init__(tokenizer)
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if decoder not in DECODERS:
            raise ValueError(f"decoder: {decoder!r} is not allowed; allowed values: {', '.join(DECODERS)}")
        if decoder == "static" and (why := static_decode_unsupported(model)) is not None:
            raise ValueError(f"decoder='static' cannot run this model: {why}")
        self.decoder = decoder
        self.share_prompts = bool(share_prompts)
        self._model = model
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.batch_size = batch_size
        eos: set[int] = set()
        for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
            if isinstance(source, int):
                eos.add(source)
            elif source:
                eos.update(int(t) for t in source)
        if not eos:
            raise ValueError("neither the tokenizer nor the model defines an EOS token")
        self.eos_ids = eos
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else min(eos)

    @property
    def model(self) -> Any:
        return self._model

    def _static(self) -> bool:
        """Whether this call decodes with the static-cache loop (checked per call: a
        trainer may shard the model after building the policy)."""
        if self.decoder == "generate":
            return False
        return static_decode_unsupported(self._model) is None

    def _shared_prompt_cache(self, input_ids: torch.Tensor, attention: torch.Tensor) -> Any | None:
        """A ``DynamicCache`` of every row's prompt but its last token, computed once per distinct
        prompt and copied to the rows that repeat it (None when no prompt repeats).

        ``generate`` then runs only the last prompt token (it slices the inputs past the
        cache's length), with the position ids and mask it derives from the full mask.
        """
        from transformers import DynamicCache

        first, inverse = distinct_rows(input_ids, attention)
        if len(first) == input_ids.shape[0] or input_ids.shape[1] < 2:
            return None
        ids, mask = input_ids[first, :-1].to(self.device), attention[first, :-1].to(self.device)
        # the positions generate derives from the mask: padding at 0, real tokens from 0 on
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self._model.config)
        self._model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                    use_cache=True, **self._last_logits_only)
        cache.reorder_cache(inverse.to(self.device))  # each row gets its prompt's keys and values
        return cache

    @property
    def _last_logits_only(self) -> dict[str, Any]:
        """``logits_to_keep=1`` where the model's forward takes it (skips the ``[B, W, V]`` head)."""
        return {"logits_to_keep": 1} if takes_logits_to_keep(self._model) else {}

    def generate(self, prompts: Sequence[list[int]], sampling: SamplingParams) -> list[Action]:
        size = self.batch_size or max(1, len(prompts))
        seed_ctx = torch.random.fork_rng(devices=[]) if sampling.seed is not None else contextlib.nullcontext()
        actions: list[Action] = []
        with seed_ctx:
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            for start in range(0, len(prompts), size):
                actions.extend(self._generate_batch(prompts[start : start + size], sampling))
        return actions

    @torch.no_grad()
    def _generate_batch(self, prompts: Sequence[list[int]], sampling: SamplingParams) -> list[Action]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("cannot generate from an empty prompt")
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):
            input_ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention[row, width - len(p) :] = 1
        greedy = sampling.temperature == 0.0
        share = self.share_prompts and width >= MIN_SHARED_PROMPT
        options: dict[str, Any] = dict(
            max_new_tokens=int(sampling.max_new_tokens),
            do_sample=not greedy,
            top_k=0,
            top_p=1.0 if greedy else float(sampling.top_p),
            temperature=1.0 if greedy else float(sampling.temperature),
            repetition_penalty=1.0,
            eos_token_id=sorted(self.eos_ids),
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
        )
        from transformers import LogitsProcessorList

        stop = _StopStrings(self.tokenizer, sampling.stop, width) if sampling.stop else None
        was_training = self._model.training
        self._model.eval()
        try:
            if self._static():
                generated, token_logprobs = static_decode(
                    self._model,
                    input_ids.to(self.device),
                    attention.to(self.device),
                    max_new_tokens=int(sampling.max_new_tokens),
                    temperature=0.0 if greedy else float(sampling.temperature),
                    top_p=1.0 if greedy else float(sampling.top_p),
                    eos_ids=sorted(self.eos_ids),
                    pad_id=self.pad_id,
                    stopping=stop,
                    share_prompts=share,
                )
                generated, token_logprobs = generated.cpu(), token_logprobs.cpu()
            else:
                recorder = _SampledLogprobs(width)
                options["logits_processor"] = LogitsProcessorList([recorder])
                if stop is not None:
                    options["stopping_criteria"] = StoppingCriteriaList([stop])
                if _is_sharded(self._model):
                    options["synced_gpus"] = True
                elif share and (shared := self._shared_prompt_cache(input_ids, attention)) is not None:
                    options["past_key_values"] = shared
                out = self._model.generate(
                    input_ids=input_ids.to(self.device),
                    attention_mask=attention.to(self.device),
                    **options,
                )
                generated = out.sequences[:, width:].cpu()
                # raw logits, before temperature/top-p: the logprob of each sampled token at temperature 1
                token_logprobs = recorder.result(out.sequences).cpu()
        finally:
            self._model.train(was_training)
        actions = []
        for row, prompt in enumerate(prompts):
            ids, text, reason = finish_completion(
                self.tokenizer, generated[row].tolist(), self.eos_ids, sampling.stop
            )
            actions.append(
                Action(
                    text=text,
                    prompt_ids=list(prompt),
                    completion_ids=ids,
                    logprobs=token_logprobs[row, : len(ids)].tolist(),
                    finish_reason=reason,  # type: ignore[arg-type]
                )
            )
        return actions
