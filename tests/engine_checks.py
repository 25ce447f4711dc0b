"""What the vLLM trainer tests check about a rollout engine after training (imported by them,
in process or from the fresh process a test starts)."""

from __future__ import annotations

import torch

from corrgrpo.agents import Episode, SamplingParams
from corrgrpo.trainer.policy_forward import pack_episodes, token_logprobs


def assert_engine_samples_trainer_weights(trainer) -> None:
    """The engine's greedy log-probabilities of one reply equal the trained model's forward pass."""
    obs = {"messages": [{"role": "user", "content": "write a short string: 3"}], "tools": []}
    action = trainer.policy.act([obs], SamplingParams(temperature=0.0, max_new_tokens=8))[0]
    ep = Episode()
    ep.append_context(action.prompt_ids)
    ep.append_action(action)
    packed = pack_episodes([ep], trainer.pad_id, torch.device("cpu"))
    with torch.no_grad():
        logp, _ = token_logprobs(trainer.unwrapped, packed)
    mask = packed.loss_mask[0].bool()
    torch.testing.assert_close(logp[0][mask], torch.tensor(action.logprobs), atol=1e-4, rtol=0)
