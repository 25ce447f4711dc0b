"""Our envs in TRL: K components as K reward functions, a split's prompts as the dataset.

The adapter's scoring runs in the main suite. Training a few steps of TRL's
``GRPOTrainer`` needs TRL: it runs in this interpreter when ``trl`` imports,
else in the TRL venv (``bash scripts/trl_venv.sh`` builds ``.venv-trl`` with this
project in it), and skips when neither has it (fails in CI: ``tests/trl_venv.py``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import corrgrpo_envs
from corrgrpo_envs.integrations.trl import (
    EnvScorer,
    completion_text,
    for_trl,
    prompt_rows,
    reward_functions,
)
from corrgrpo_envs.toy.rewards import score_text
from tests.trl_venv import IN_TRL_VENV, ROOT, TRL_PYTHON, unavailable

TOY = "corrgrpo/ScaleDominance-v0"


def test_importing_the_adapter_imports_neither_trl_nor_datasets():
    code = (
        "import sys, corrgrpo_envs.integrations.trl;"
        "assert 'trl' not in sys.modules and 'datasets' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_one_reward_function_per_component_scored_once_per_batch():
    env = corrgrpo_envs.make(TOY, num_tasks=8, reward_weights=[0.5, 1.0, 2.0])
    funcs = reward_functions(env)
    assert [f.__name__ for f in funcs] == ["digits", "has_a", "word_with_a"]
    texts = ["cat 123", "a 9", "zz", "banana 12345"]
    completions = [[{"role": "assistant", "content": t}] for t in texts]  # conversational, as TRL passes them
    task_ids = ["prompt-0001", "prompt-0001", "prompt-0005", "prompt-0007"]
    resets = []
    original = env.reset
    env.reset = lambda **kw: resets.append(kw) or original(**kw)  # count the env episodes
    columns = [f(prompts=[None] * 4, completions=completions, task_id=task_ids, trainer_state=None) for f in funcs]
    assert len(resets) == 4  # one episode per completion, shared by the three functions
    expected = np.array([score_text(t) for t in texts])
    np.testing.assert_array_equal(np.array(columns).T, expected)
    assert columns[0] == [3.0, 1.0, 0.0, 5.0] and all(isinstance(v, float) for v in columns[0])
    # plain-text completions score the same; a new batch is scored anew
    assert funcs[2](completions=texts[::-1], task_id=task_ids) == expected[::-1, 2].tolist()
    assert len(resets) == 8
    with pytest.raises(ValueError, match="'task_id' column"):
        funcs[0](completions=texts)


def test_prompt_rows_and_setup_weights():
    env = corrgrpo_envs.make(TOY, num_tasks=5, split="all")
    rows = prompt_rows(env)
    assert rows["task_id"] == [f"prompt-{k:04d}" for k in range(5)]
    assert rows["prompt"][3] == [{"role": "user", "content": "write a short string: 3"}]
    assert completion_text("plain") == "plain"
    assert completion_text([{"role": "assistant", "content": "x"}]) == "x"
    with pytest.raises(TypeError):
        completion_text(3)
    scorer = EnvScorer(env)
    assert scorer.score(["prompt-0000"], ["ab 12"]).tolist() == [[2.0, 1.0, 1.0]]
    if importlib.util.find_spec("datasets") is None:
        with pytest.raises(ModuleNotFoundError, match="pip install datasets"):
            for_trl(TOY, num_tasks=5)
        return
    setup = for_trl(TOY, split="all", num_tasks=5, reward_weights=[1, 0.5, 0.25])
    assert setup.reward_weights == [1.0, 0.5, 0.25] and len(setup.reward_funcs) == 3
    assert setup.dataset.column_names == ["prompt", "task_id"] and len(setup.dataset) == 5
    with pytest.raises(ValueError, match="4 entries for the 3 rewards"):
        for_trl(TOY, num_tasks=5, reward_weights=[1, 1, 1, 1])


def _tiny_model_and_tokenizer():
    """A random-init Qwen2 (about 60k parameters) and a byte-level BPE trained on the fly, with ChatML."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    rng = np.random.default_rng(0)
    words = ["write", "a", "short", "string", "cat", "banana", "zz", "ab", "hello", "user", "assistant"]
    corpus = [" ".join(rng.choice(words, 6)) + f" {rng.integers(10_000)}" for _ in range(400)]
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    specials = ["<|im_start|>", "<|im_end|>", "<|pad|>"]
    raw.train_from_iterator(
        corpus,
        trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
    )
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|pad|>", padding_side="left",
        chat_template=template,
    )
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(torch.float32), tokenizer


def _train_toy_with_trl(output_dir: Path) -> dict:
    import torch
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(1)
    model, tokenizer = _tiny_model_and_tokenizer()
    setup = for_trl(TOY, split="all", num_tasks=8, reward_weights=[0.1, 1.0, 1.0])
    args = GRPOConfig(
        output_dir=str(output_dir), num_generations=4, per_device_train_batch_size=8,
        max_completion_length=8, temperature=1.0, learning_rate=1e-3, beta=0.0, max_steps=2,
        use_cpu=True, bf16=False, fp16=False, seed=0, report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, dataloader_num_workers=0, activation_checkpointing=False,
        reward_weights=setup.reward_weights,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=setup.reward_funcs, args=args,
                          train_dataset=setup.dataset, processing_class=tokenizer)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "rewards/digits/mean" in h]
    return {"logs": logs, "weights": setup.reward_weights, "global_step": trainer.state.global_step}


def test_grpo_trainer_trains_on_the_toy_domain(tmp_path):
    if importlib.util.find_spec("trl") is not None:
        result = _train_toy_with_trl(tmp_path / "trl")
    elif os.environ.get(IN_TRL_VENV):
        pytest.fail("running in the TRL venv, but trl does not import")
    elif not TRL_PYTHON.exists():
        unavailable("TRL is not installed here and .venv-trl is missing (bash scripts/trl_venv.sh builds it)")
    else:
        out = tmp_path / "result.json"
        code = (
            "import json, sys; from pathlib import Path;"
            "from tests import test_trl_adapter as t;"  # python -c in the checkout: it is on sys.path
            f"Path({str(out)!r}).write_text(json.dumps(t._train_toy_with_trl(Path({str(tmp_path)!r}) / 'trl')))"
        )
        env = {**os.environ, IN_TRL_VENV: "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        proc = subprocess.run([str(TRL_PYTHON), "-c", code], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        missing = [m for m in ("corrgrpo_envs", "gymnasium", "pytest") if f"No module named '{m}'" in proc.stderr]
        if proc.returncode != 0 and missing:
            unavailable(f".venv-trl lacks {missing[0]} (bash scripts/trl_venv.sh installs it)")
        assert proc.returncode == 0, proc.stderr[-4000:]
        result = json.loads(out.read_text())
    assert result["global_step"] == 2 and len(result["logs"]) == 2
    for log in result["logs"]:
        means = [log[f"rewards/{n}/mean"] for n in ("digits", "has_a", "word_with_a")]
        assert 0.0 <= means[0] <= 32.0 and 0.0 <= means[1] <= 1.0 and 0.0 <= means[2] <= means[1]
        # TRL's reward is the weighted sum of our components with our weights
        assert log["reward"] == pytest.approx(float(np.dot(result["weights"], means)), rel=1e-4, abs=1e-5)
