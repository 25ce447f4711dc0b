"""LoRA adapters: off by default, only adapters train, merged saves load in plain transformers."""

from __future__ import annotations

import pytest
import torch

from corrgrpo.trainer.lora import (
    ADAPTER_FOLDER,
    LoraConfig,
    apply_lora,
    is_lora_model,
    merged_state_dict,
    restore_adapter,
    save_merged,
    trainable_parameters,
)

peft = pytest.importorskip("peft", reason="LoRA needs the 'peft' package (extra 'lora')")


def _tiny():
    from corrgrpo.agents.models import load_model

    return load_model("tiny")


def _perturb_adapters(model, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def test_r_zero_leaves_the_model_alone():
    model, _ = _tiny()
    assert apply_lora(model, LoraConfig()) is model
    assert apply_lora(model, None) is model
    assert not is_lora_model(model)


def test_only_adapters_are_trainable_and_start_as_the_base_model():
    model, _ = _tiny()
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        before = model(input_ids=ids).logits
    lora = apply_lora(model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    assert is_lora_model(lora)
    trainable, total = trainable_parameters(lora)
    names = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert all(("q_proj" in n or "v_proj" in n) for n in names)
    # 4 layers x (q: 256->256, v: 256->128) x r=4: A is r x in, B is out x r
    assert trainable == 4 * (4 * 256 + 256 * 4 + 4 * 256 + 128 * 4)
    assert total > 4_000_000
    with torch.no_grad():
        torch.testing.assert_close(lora(input_ids=ids).logits, before)  # B starts at zero


def test_merged_save_loads_in_plain_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    model, tokenizer = _tiny()
    base = {k: v.clone() for k, v in model.state_dict().items()}
    lora = apply_lora(model, LoraConfig(r=4, alpha=8))
    _perturb_adapters(lora)
    ids = torch.arange(5, 60)[None]
    with torch.no_grad():
        want = lora(input_ids=ids).logits
    save_merged(lora, tmp_path / "m", tokenizer)
    assert (tmp_path / "m" / "model.safetensors").is_file()
    assert not (tmp_path / "m" / "adapter_config.json").exists()  # a plain folder, not an adapter
    assert (tmp_path / "m" / ADAPTER_FOLDER / "adapter_config.json").is_file()
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert not is_lora_model(plain)
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)
    # the same weights as PEFT's own merge, and the trained model's base weights untouched
    merged = merged_state_dict(lora)
    assert set(merged) == set(base)
    import copy

    reference = copy.deepcopy(lora).merge_and_unload().state_dict()
    for k, v in merged.items():
        torch.testing.assert_close(v, reference[k], rtol=0, atol=1e-6)
    for k, v in lora.get_base_model().state_dict().items():
        if ".lora_" not in k:
            assert torch.equal(v, base[k.replace(".base_layer.", ".")]), k
    # save_pretrained of the LoRA model itself writes the same merged folder
    lora.save_pretrained(tmp_path / "n")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "n")
    for k, v in again.state_dict().items():
        torch.testing.assert_close(v, plain.state_dict()[k], rtol=0, atol=0)


def test_restore_adapter_is_exact(tmp_path):
    model, _ = _tiny()
    lora = apply_lora(model, LoraConfig(r=2, alpha=4))
    _perturb_adapters(lora, seed=3)
    (tmp_path / "ckpt").mkdir()
    lora.save_pretrained(tmp_path / "ckpt" / "model")
    fresh = apply_lora(_tiny()[0], LoraConfig(r=2, alpha=4))
    # what load_checkpoint hands over: the merged weights; they leave the base alone
    result = fresh.load_state_dict(merged_state_dict(lora), strict=False)
    assert not result.unexpected_keys
    assert restore_adapter(fresh, tmp_path / "ckpt")
    for (n1, p1), (n2, p2) in zip(lora.named_parameters(), fresh.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    with pytest.raises(FileNotFoundError, match="no LoRA adapter"):
        restore_adapter(fresh, tmp_path)
    assert restore_adapter(_tiny()[0], tmp_path / "ckpt") is False  # no adapters: nothing to do


def test_bad_target_modules_name_the_key():
    model, _ = _tiny()
    with pytest.raises(ValueError, match="model.lora.target_modules"):
        apply_lora(model, LoraConfig(r=2, target_modules=["no_such_layer"]))
