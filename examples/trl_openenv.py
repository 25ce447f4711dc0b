"""TRL's GRPOTrainer on a corrgrpo env served over OpenEnv, one TRL reward function per component.

Start a server, then train (in an environment with TRL, e.g. ``.venv-trl`` from
``bash scripts/trl_venv.sh`` plus the ``openenv`` extra and this project)::

    corrgrpo serve corrgrpo/ScaleDominance-v0 --port 8000 &
    .venv-trl/bin/python examples/trl_openenv.py --url openenv://127.0.0.1:8000 --steps 2

``--model tiny`` (the default) trains a random-init Qwen2 with a tokenizer trained on the
fly and Qwen2.5's chat template (which renders tool calls, as TRL's environments need);
``--model NAME_OR_PATH`` loads a transformers model instead. TRL logs
``rewards/<component>/mean`` for every component the server sends in
``metadata["reward_components"]``, and combines them with the server's weights and
``--aggregation`` (TRL's ``multi_objective_aggregation``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def tiny_model_and_tokenizer() -> tuple[Any, Any]:
    """A 2-layer random-init Qwen2 and a small BPE tokenizer with Qwen2.5's chat template."""
    import numpy as np
    import torch
    import trl
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    rng = np.random.default_rng(0)
    words = ["write", "a", "short", "string", "cat", "banana", "zz", "ab", "hello", "user", "answer", "submit"]
    corpus = [" ".join(rng.choice(words, 6)) + f" {rng.integers(10_000)}" for _ in range(400)]
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>",
                "<tool_response>", "</tool_response>"]
    raw.train_from_iterator(
        corpus,
        trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>", padding_side="left",
        chat_template=template,
    )
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(torch.float32), tokenizer


def train(url: str, model: Any, tokenizer: Any, output_dir: Path, steps: int = 2, split: str = "all",
          aggregation: str = "sum_then_normalize") -> Any:
    """Train ``steps`` GRPO steps on the server's split; returns the trainer."""
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from corrgrpo_envs.integrations.trl_openenv import for_trl_openenv

    torch.set_num_threads(1)
    setup = for_trl_openenv(url, split=split)
    args = GRPOConfig(
        output_dir=str(output_dir), num_generations=4, per_device_train_batch_size=8,
        max_completion_length=8, temperature=1.0, learning_rate=1e-3, beta=0.0, max_steps=steps,
        use_cpu=True, bf16=False, fp16=False, seed=0, report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, dataloader_num_workers=0, activation_checkpointing=False,
        reward_weights=setup.reward_weights, multi_objective_aggregation=aggregation,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=setup.reward_funcs, args=args, train_dataset=setup.dataset,
        processing_class=tokenizer, environment_factory=setup.environment_factory,
    )
    trainer.train()
    return trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="openenv://HOST:PORT of a corrgrpo serve server")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--split", default="all")
    ap.add_argument("--aggregation", default="sum_then_normalize")
    ap.add_argument("--output-dir", default="runs/trl-openenv")
    args = ap.parse_args()
    if args.model == "tiny":
        model, tokenizer = tiny_model_and_tokenizer()
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model, tokenizer = AutoModelForCausalLM.from_pretrained(args.model), AutoTokenizer.from_pretrained(args.model)
    trainer = train(args.url, model, tokenizer, Path(args.output_dir), args.steps, args.split, args.aggregation)
    for log in trainer.state.log_history:
        print({k: v for k, v in log.items() if k.startswith("rewards/") or k == "reward"})


if __name__ == "__main__":
    main()
