"""Rollout engines: what generates the rollouts' turns, one class per backend.

An engine wraps a policy (``agents``) built from the training model and keeps it in
step with the training weights. The loop only calls :meth:`RolloutEngine.generate`
and :meth:`RolloutEngine.sync_weights`, so a new backend (a remote server, say) is a
new subclass plus :func:`register_engine`; ``rollout.backend`` then names it.
"""

from __future__ import annotations

import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from corrgrpo.agents.policy import Action, SamplingParams
from corrgrpo_registry import Registry

__all__ = [
    "ENGINES",
    "HFEngine",
    "RolloutEngine",
    "VLLMEngine",
    "available_engines",
    "make_engine",
    "register_engine",
]


class RolloutEngine(ABC):
    """Generates assistant turns and follows the training weights.

    Args:
        model: the (unwrapped) training model.
        tokenizer: its tokenizer.
        cfg: the run's :class:`~corrgrpo.trainer.config.Config` (``rollout`` and ``model`` sections).
    """

    def __init__(self, model: Any, tokenizer: Any, cfg: Any):
        self.tokenizer = tokenizer

    @property
    @abstractmethod
    def policy(self) -> Any:
        """The ``agents`` policy that generates (its ``act`` is :meth:`generate`)."""

    def generate(
        self,
        observations: Sequence[dict],
        sampling: SamplingParams,
        episodes: Sequence[Any] | None = None,
    ) -> list[Action]:
        """One turn for each observation (episodes are extended token-exactly)."""
        return self.policy.act(observations, sampling, episodes)

    @abstractmethod
    def sync_weights(self, model: Any) -> None:
        """Make the next :meth:`generate` sample from ``model``'s current weights."""

    def close(self) -> None:
        """Release the engine's resources."""
        self.policy.close()


#: The rollout engines by name (``rollout.backend``); an entry point
#: ``package.module:Class`` of any importable module works without registering.
ENGINES: Registry[Callable[..., RolloutEngine]] = Registry("rollout backend")


def register_engine(
    name: str, *, override: bool = False
) -> Callable[[type[RolloutEngine]], type[RolloutEngine]]:
    """Class decorator registering a rollout engine under ``name`` (``rollout.backend``).

    Raises ValueError when ``name`` is taken unless ``override`` is true.
    """
    return ENGINES.register(name, override=override)


def available_engines() -> list[str]:
    """Names of the registered rollout engines, sorted."""
    return ENGINES.names()


def make_engine(name: str, model: Any, tokenizer: Any, cfg: Any) -> RolloutEngine:
    """Build the engine registered under ``name`` (or named by an entry point)."""
    return ENGINES.get(name)(model, tokenizer, cfg)


@register_engine("hf")
class HFEngine(RolloutEngine):
    """transformers ``generate`` on the training model itself: nothing to sync.

    With ``rollout.overlap`` it samples from a second model instance instead (the update
    runs while it generates), whose weights :meth:`sync_weights` copies from the trainer's.
    """

    def __init__(self, model: Any, tokenizer: Any, cfg: Any):
        super().__init__(model, tokenizer, cfg)
        from corrgrpo.agents.hf_policy import HFPolicy

        self._copy = None
        if getattr(cfg.rollout, "overlap", False):
            from corrgrpo.trainer.fsdp import is_sharded

            if is_sharded(model):
                raise ValueError("rollout.overlap=true with rollout.backend=hf needs an unsharded model (no FSDP)")
            import copy

            self._copy = model = copy.deepcopy(model).eval().requires_grad_(False)
        self._policy = HFPolicy(model, tokenizer, decoder=cfg.rollout.hf_decoder,
                                share_prompts=cfg.rollout.hf_share_prompts)

    @property
    def policy(self) -> Any:
        return self._policy

    def sync_weights(self, model: Any) -> None:
        """Nothing to do without overlap (the policy is the training model); else copy the weights."""
        if self._copy is not None:
            self._copy.load_state_dict(model.state_dict())


@register_engine("vllm")
class VLLMEngine(RolloutEngine):
    """A colocated in-process vLLM engine serving a copy of the weights, synced every step."""

    def __init__(self, model: Any, tokenizer: Any, cfg: Any):
        super().__init__(model, tokenizer, cfg)
        from corrgrpo.agents.vllm_policy import VLLMPolicy
        from corrgrpo.trainer.fsdp import full_state_dict, is_sharded

        folder = Path(tempfile.mkdtemp(prefix="corrgrpo-vllm-"))
        # under FSDP the full weights (a collective: each process starts its own engine)
        model.save_pretrained(folder, state_dict=full_state_dict(model) if is_sharded(model) else None)
        tokenizer.save_pretrained(folder)
        kwargs = {"dtype": cfg.model.dtype, **cfg.rollout.vllm_kwargs}
        self._policy = VLLMPolicy(folder, tokenizer, **kwargs)

    @property
    def policy(self) -> Any:
        return self._policy

    def sync_weights(self, model: Any) -> None:
        from corrgrpo.trainer.fsdp import full_state_dict

        self._policy.update_weights(full_state_dict(model))  # full tensors, also under FSDP


# Engines in modules of their own are registered by entry point: their module (and what it
# imports, such as an HTTP client) loads when a run uses them.
ENGINES.register("server", "corrgrpo.trainer.server_engine:ServerEngine")
