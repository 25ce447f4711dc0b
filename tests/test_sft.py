"""corrgrpo sft: packing, loss, learning, resume, 1 vs 2 processes, LoRA, the command."""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from pathlib import Path

import pytest
import torch

from corrgrpo.agents.episode import Episode
from corrgrpo.trainer.config import ConfigError
from corrgrpo.trainer.policy_forward import (
    PackedBatch,
    pack_episodes,
    pack_in_one_row,
    token_scores,
)
from corrgrpo.trainer.run_logger import read_metrics
from corrgrpo.trainer.sft import (
    SFTTrainer,
    bucket_examples,
    load_sft_config,
    pack_examples,
    sft_config_from_dict,
)
from tests.launched import run_bounded
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["red", "blue", "green", "cat", "dog", "sun", "moon", "tree", "river", "stone"]


def write_chat_data(path: Path, n: int = 48, seed: int = 0) -> Path:
    """Short conversations: the assistant repeats the user's words (a tiny model learns it)."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 4)))
            f.write(json.dumps({"messages": [{"role": "user", "content": f"Repeat: {words}"},
                                             {"role": "assistant", "content": words}]}) + "\n")
    return path


def _cfg(tmp_path: Path, data: Path, **sections):
    cfg = {
        "model": {"name_or_path": "tiny"},
        "data": {"source": "file", "files": [str(data)], "eval_fraction": 0.25},
        "optim": {"lr": 3e-3},
        # one torch thread: the automatic count follows the machine's load, and two counts add
        # in two orders (the resume test compares two runs to the last bit)
        "train": {"steps": 4, "batch_size": 8, "micro_batch_tokens": 128, "seed": 0,
                  "progress": False, "tensorboard": False, "save_final": False, "torch_threads": 1,
                  "output_dir": str(tmp_path / "run")},
    }
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return sft_config_from_dict(cfg)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_chat_data(tmp_path_factory.mktemp("sft") / "repeat.jsonl")


def test_packing_predicts_only_trained_tokens():
    a = Episode(token_ids=[1, 2, 3, 4, 5], loss_mask=[0, 0, 1, 1, 1], logprobs=[0.0] * 5)
    b = Episode(token_ids=[6, 7, 8], loss_mask=[0, 1, 1], logprobs=[0.0] * 3)
    c = Episode(token_ids=[9] * 10, loss_mask=[0] * 9 + [1], logprobs=[0.0] * 10)
    assert pack_examples([a, b, c], budget=8) == [[a, b], [c]]
    row = pack_in_one_row([a, b], torch.device("cpu"))
    assert row.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
    assert row.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]]
    assert row.sampler_logprobs is None and set(row.model_inputs()) == {"input_ids", "position_ids"}
    # position t predicts token t+1: a's targets 3, 4, 5 (from 1, 2, 3); b's 7, 8 (from 5, 6);
    # a's last position (4) would predict b's first token: never trained
    keep = row.loss_mask[0].nonzero().squeeze(1)
    assert keep.tolist() == [1, 2, 3, 5, 6]
    assert row.input_ids[0, keep + 1].tolist() == [3, 4, 5, 7, 8]


def _ce(model, batch: PackedBatch) -> tuple[torch.Tensor, int, int]:
    """``(summed cross-entropy, correct argmax predictions, trained tokens)`` of ``batch`` by the
    trainers' forward pass (logits only at the trained positions)."""
    scores = token_scores(model, batch, with_accuracy=True, only_trained=True)
    mask = batch.loss_mask.bool()
    return -scores.logp[mask].sum(), int(scores.correct[mask].sum()), int(mask.sum())


def test_packed_loss_equals_separate_sequences():
    from corrgrpo.agents.models import load_model

    model, _ = load_model("tiny")
    cpu = torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    examples = [Episode(token_ids=torch.randint(0, 2000, (n,), generator=g).tolist(),
                        loss_mask=[0] * (n // 2) + [1] * (n - n // 2), logprobs=[0.0] * n)
                for n in (9, 14, 6)]
    with torch.no_grad():
        together = _ce(model, pack_in_one_row(examples, cpu))
        apart = [_ce(model, pack_in_one_row([e], cpu)) for e in examples]
        logits = model(input_ids=torch.tensor([examples[1].token_ids])).logits[0]
        padded = _ce(model, pack_episodes(examples, 0, cpu))
    assert together[2] == sum(x[2] for x in apart) == 5 + 7 + 3
    torch.testing.assert_close(together[0], sum(x[0] for x in apart), rtol=1e-5, atol=1e-4)
    # padded, length-bucketed rows give the same sums
    assert padded[2] == together[2]
    torch.testing.assert_close(padded[0], together[0], rtol=1e-5, atol=1e-4)
    assert padded[1] == together[1] == sum(x[1] for x in apart)
    groups = bucket_examples(examples, budget=28)
    assert [[len(e.token_ids) for e in g] for g in groups] == [[14, 9], [6]]
    # the same number as a plain forward pass with labels masked to the trained tokens
    e = examples[1]
    targets = torch.tensor(e.token_ids[1:])
    mask = torch.tensor(e.loss_mask[1:], dtype=torch.bool)
    plain = torch.nn.functional.cross_entropy(logits[:-1][mask], targets[mask], reduction="sum")
    torch.testing.assert_close(apart[1][0], plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("packing", ["packed", "padded"])
@pytest.mark.parametrize("max_grad_norm", [0.0, 0.5])
def test_one_step_equals_plain_torch(tmp_path, data, packing, max_grad_norm):
    """One step through the shared updater is the step of the loop SFT had before: the summed
    cross-entropy of the batch's trained tokens over their count, one backward pass, the
    gradient norm (logged with clipping off too) and clipping, AdamW; computed here with plain
    torch, one example at a time, on a copy of the model."""
    import copy

    torch.manual_seed(0)
    # AdamW's first step is lr * g / (|g| + eps): with the usual tiny eps about lr * sign(g), so
    # a near-zero gradient entry that rounds differently (another split of the batch) moves by
    # 2 lr; a large eps makes the step smooth in g, so the comparison can be tight
    cfg = _cfg(tmp_path, data, optim={"lr": 1e-2, "adam_eps": 1e-3, "max_grad_norm": max_grad_norm,
                                      "weight_decay": 0.1, "schedule": "constant", "warmup_steps": 0},
               train={"steps": 1, "micro_batch_tokens": 64, "packing": packing})
    trainer = SFTTrainer(cfg)
    reference = copy.deepcopy(trainer.unwrapped)
    before = {n: p.detach().clone() for n, p in reference.named_parameters()}
    batch = [trainer.train_examples[int(i)] for i in trainer.sampler.tasks_for_step(0)]
    record = trainer.train_step(0)
    assert record["micro_batches"] > 1  # gradient accumulation is exercised

    params = [p for p in reference.parameters() if p.requires_grad]
    total = sum(sum(e.loss_mask[1:]) for e in batch)
    summed = torch.zeros(())
    for e in batch:
        logits = reference(input_ids=torch.tensor([e.token_ids])).logits[0, :-1]
        mask = torch.tensor(e.loss_mask[1:], dtype=torch.bool)
        summed = summed + torch.nn.functional.cross_entropy(
            logits[mask], torch.tensor(e.token_ids[1:])[mask], reduction="sum")
    (summed / total).backward()
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
    if max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    o = cfg.optim
    torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), eps=o.adam_eps, weight_decay=o.weight_decay).step()

    assert record["trained_tokens"] == total
    assert record["loss"] == pytest.approx(float(summed.detach()) / total, rel=1e-5)
    assert record["grad_norm"] == pytest.approx(float(norm), rel=1e-4)
    assert max_grad_norm == 0 or record["grad_norm"] > max_grad_norm  # so clipping acted
    moved = 0.0
    for (name, want), have in zip(reference.named_parameters(), trainer.unwrapped.parameters()):
        torch.testing.assert_close(have, want, rtol=0, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
        moved = max(moved, float((want.detach() - before[name]).abs().max()))
    assert moved > 1e-4


@pytest.mark.slow
def test_held_out_loss_falls_and_model_folder_is_plain(tmp_path, data):
    from transformers import AutoModelForCausalLM

    cfg = _cfg(tmp_path, data, train={"steps": 24, "eval_every": 12})
    trainer = SFTTrainer(cfg)
    assert len(trainer.eval_examples) == 12 and len(trainer.train_examples) == 36
    out = trainer.train()
    records = read_metrics(out)
    assert [r["step"] for r in records] == list(range(25))
    evals = [r["eval/loss"] for r in records if "eval/loss" in r]
    assert len(evals) == 3  # before training, step 12, step 24
    assert evals[-1] < evals[0] - 2.0, evals
    assert records[-1]["eval/token_accuracy"] > records[0]["eval/token_accuracy"] + 0.15
    assert records[0]["data/train/examples"] == 36
    for key in ("loss", "token_accuracy", "grad_norm", "lr", "trained_tokens", "time/step", "tokens_per_s"):
        assert key in records[-1], key
    # every step trains on exactly the assistant tokens of its 8 examples (words + EOS)
    assert records[1]["trained_tokens"] == sum(
        sum(e.loss_mask[1:]) for e in (trainer.train_examples[int(i)] for i in trainer.sampler.tasks_for_step(0))
    )
    plain = AutoModelForCausalLM.from_pretrained(out / "model")
    for k, v in trainer.unwrapped.state_dict().items():
        torch.testing.assert_close(plain.state_dict()[k], v)


@pytest.mark.parametrize("lora", [False, True])
def test_resume_reproduces_uninterrupted_run(tmp_path, data, lora):
    extra = {"lora": {"r": 4, "alpha": 8, "dropout": 0.1}} if lora else {}
    packing = {"packing": "padded" if lora else "packed"}  # both batch layouts, end to end
    if lora:
        pytest.importorskip("peft", reason="LoRA needs the 'peft' package (extra 'lora')")
    model = {"name_or_path": "tiny", **extra}
    full = SFTTrainer(_cfg(tmp_path / "a", data, model=model, train=packing))
    full.train()
    expected = read_metrics(tmp_path / "a" / "run")

    first = SFTTrainer(_cfg(tmp_path / "b", data, model=model, train=packing))
    for step in range(2):
        first.logger.log(first.train_step(step))
    ckpt = first.save(2)
    resumed = SFTTrainer(_cfg(tmp_path / "b", data, model=model, train={"resume": "auto", **packing}))
    assert resumed.start_step == 2
    resumed.train()
    got = read_metrics(tmp_path / "b" / "run")
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    for want, have in zip(expected[3:], got[2:]):
        for key in ("loss", "token_accuracy", "grad_norm", "lr", "trained_tokens"):
            assert have[key] == pytest.approx(want[key], rel=1e-6, abs=1e-7), key
    assert got[-1]["eval/loss"] == pytest.approx(expected[-1]["eval/loss"], rel=1e-6)
    for (n1, p1), (n2, p2) in zip(full.unwrapped.named_parameters(), resumed.unwrapped.named_parameters()):
        assert n1 == n2
        torch.testing.assert_close(p1, p2, rtol=0, atol=1e-7)
    assert (ckpt / "model" / "config.json").exists()


def test_lora_trains_only_adapters_and_saves_merged(tmp_path, data):
    pytest.importorskip("peft", reason="LoRA needs the 'peft' package (extra 'lora')")
    from transformers import AutoModelForCausalLM

    from corrgrpo.trainer.lora import merged_state_dict

    cfg = _cfg(tmp_path, data, model={"name_or_path": "tiny", "lora": {"r": 8, "alpha": 16}},
               train={"steps": 6, "save_final": True})
    trainer = SFTTrainer(cfg)
    before = {k: v.clone() for k, v in trainer.unwrapped.state_dict().items()}
    out = trainer.train()
    after = trainer.unwrapped.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".lora_A." in k or ".lora_B." in k for k in changed), sorted(changed)[:5]
    records = read_metrics(out)
    assert records[0]["parameters/trainable"] < records[0]["parameters/total"] / 20
    assert records[-1]["eval/loss"] < records[0]["eval/loss"]
    merged = merged_state_dict(trainer.unwrapped)
    for folder in (out / "model", out / "checkpoint-6" / "model"):
        plain = AutoModelForCausalLM.from_pretrained(folder)
        for k, v in plain.state_dict().items():
            torch.testing.assert_close(v, merged[k], rtol=0, atol=1e-6)
        assert (folder / "lora_adapter" / "adapter_model.safetensors").is_file()


_LAUNCH = {
    "ddp": ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
            "--dynamo_backend", "no"],
    # the same FSDP2 config `corrgrpo train` runs under (tests/test_fsdp.py)
    "fsdp": ["--config_file", str(ROOT / "env_configs" / "accelerate" / "fsdp_cpu.yaml")],
}


@pytest.mark.slow
@pytest.mark.parametrize("launch", sorted(_LAUNCH))
def test_two_processes_match_one(tmp_path, data, launch):
    """accelerate launch with 2 CPU processes (gloo; DDP, or FSDP2 sharding) gives the same losses
    and parameters, and the sharded run writes a plain model folder with the same weights."""
    launcher = Path(sys.executable).parent / "accelerate"
    if not launcher.exists() and shutil.which("accelerate") is None:
        pytest.skip("the accelerate launcher is not installed")
    script = str(ROOT / "tests" / "sft_distributed_check.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    run_bounded([sys.executable, script, str(one), str(data)], env=env)
    run_bounded([str(launcher), "launch", *_LAUNCH[launch], "--main_process_port", str(free_port()), script, str(two),
                 str(data)], env=env)
    a, b = torch.load(one), torch.load(two)
    assert a["world"] == 1 and b["world"] == 2
    assert (a["sharded"], b["sharded"]) == (False, launch == "fsdp")
    if launch == "fsdp":
        from transformers import AutoModelForCausalLM

        assert (Path(b["run"]) / "checkpoint-3" / "sharded" / ".metadata").is_file()
        plain = AutoModelForCausalLM.from_pretrained(Path(b["run"]) / "model").state_dict()
        for name, value in b["params"].items():
            torch.testing.assert_close(plain[name], value, rtol=0, atol=0)
    for x, y in zip(json.loads(a["records"]), json.loads(b["records"])):
        assert x["trained_tokens"] == y["trained_tokens"]
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-5)
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-4)
    assert a["eval"]["eval/loss"] == pytest.approx(b["eval"]["eval/loss"], rel=1e-5)
    # the same tolerance as the RL trainer's test: summation order differs (packing, all-reduce)
    assert sorted(a["params"]) == sorted(b["params"])
    for name in a["params"]:
        torch.testing.assert_close(a["params"][name], b["params"][name], rtol=1e-4, atol=3e-5)


def test_config_errors_name_the_key(tmp_path, data):
    with pytest.raises(ConfigError, match="unknown key 'train.batchsize'"):
        sft_config_from_dict({"data": {"source": "file", "files": ["x"]}, "train": {"batchsize": 3}})
    with pytest.raises(ConfigError, match="data.source: 'web' is not allowed"):
        sft_config_from_dict({"data": {"source": "web"}})
    with pytest.raises(ConfigError, match=r"env: needs an 'id' key \(data.source=env\)"):
        sft_config_from_dict({})
    with pytest.raises(ConfigError, match=r"data.files: \[\] is not allowed with data.source=file"):
        sft_config_from_dict({"data": {"source": "file"}})
    with pytest.raises(ConfigError, match="env.split: this setting belongs in data.train_split"):
        sft_config_from_dict({"env": {"id": "corrgrpo/ToolCall-v0", "split": "train"}})
    with pytest.raises(ConfigError, match="model.lora.r: expected an integer"):
        sft_config_from_dict({"env": {"id": "corrgrpo/ToolCall-v0"}, "model": {"lora": {"r": "big"}}})
    with pytest.raises(ConfigError, match=r"model.lora.alpha: 0.0 is out of range; allowed: > 0"):
        sft_config_from_dict({"env": {"id": "corrgrpo/ToolCall-v0"}, "model": {"lora": {"alpha": 0}}})
    with pytest.raises(ConfigError, match=r"model.lora.target_modules: \[\] has 0 entries; allowed: at least 1"):
        sft_config_from_dict({"env": {"id": "corrgrpo/ToolCall-v0"}, "model": {"lora": {"r": 4, "target_modules": []}}})
    with pytest.raises(ConfigError, match="unknown key 'model.lora.rank'"):
        sft_config_from_dict({"env": {"id": "corrgrpo/ToolCall-v0"}, "model": {"lora": {"rank": 4}}})
    with pytest.raises(ConfigError, match=r"train.batch_size: 0 is out of range; allowed: >= 1"):
        sft_config_from_dict({"env": {"id": "corrgrpo/ToolCall-v0"}, "train": {"batch_size": 0}})
    # every number is range-checked, non-finite values and list lengths included
    for section, key, value, message in [
        ("optim", "lr", float("inf"), r"optim.lr: inf is out of range; allowed: > 0"),
        ("optim", "warmup_steps", -5, r"optim.warmup_steps: -5 is out of range; allowed: >= 0"),
        ("optim", "max_grad_norm", -1.0, r"optim.max_grad_norm: -1.0 is out of range"),
        ("optim", "betas", [0.9], r"optim.betas: \[0.9\] has 1 entries; allowed: exactly 2"),
        ("train", "save_every", -1, r"train.save_every: -1 is out of range"),
        ("data", "eval_fraction", 1.0, r"data.eval_fraction: 1.0 is out of range; allowed: >= 0 and < 1"),
    ]:
        with pytest.raises(ConfigError, match=message):
            sft_config_from_dict({"env": {"id": "corrgrpo/ToolCall-v0"}, section: {key: value}})
    for path in ("env_configs/sft_toolcall_tiny.yaml", "studies/configs/sft_toolcall_smollm2.yaml"):
        cfg = load_sft_config(ROOT / path, ["train.steps=3"])
        assert cfg.data.source == "env" and cfg.env.id == "corrgrpo/ToolCall-v0" and cfg.train.steps == 3


def test_sft_command_then_train_from_its_model(tmp_path, capsys):
    from corrgrpo.trainer.cli import main

    run = tmp_path / "sft"
    assert main(["sft", "env_configs/sft_toolcall_tiny.yaml", "env.num_tasks=12", "train.steps=2",
                 "train.batch_size=1", "data.max_eval_examples=1",
                 "train.progress=false", "train.tensorboard=false", f"train.output_dir={run}"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "held-out loss" in err and f"model.name_or_path={run / 'model'}" in err
    assert (run / "model" / "config.json").exists() and (run / "checkpoint-2" / "trainer_state.pt").exists()
    assert len(read_metrics(run)) == 3
    # RL starts from the supervised model
    rl = tmp_path / "rl"
    assert main(["train", "env_configs/quickstart.yaml", f"model.name_or_path={run / 'model'}",
                 "env.num_tasks=8", "algorithm.group_size=2", "algorithm.prompts_per_step=2",
                 "rollout.max_new_tokens=4", "train.steps=1", "train.progress=false",
                 "train.tensorboard=false", f"train.output_dir={rl}"]) == 0
    assert len(read_metrics(rl)) == 1


def test_sft_command_reports_bad_data(tmp_path, capsys):
    from corrgrpo.trainer.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant"}]}\n')
    assert main(["sft", str(ROOT / "env_configs" / "sft_toolcall_tiny.yaml"), "data.source=file",
                 f"data.files=[{bad}]", f"train.output_dir={tmp_path / 'run'}"]) == 2
    assert "line 1: messages[1].content: missing" in capsys.readouterr().err
    assert main(["sft", "env_configs/sft_toolcall_tiny.yaml", "train.bogus=1"]) == 2
    assert "unknown key 'train.bogus'" in capsys.readouterr().err
    # every answer cut away by max_length: an error, not a run that trains on nothing
    assert main(["sft", "env_configs/sft_toolcall_tiny.yaml", "env.num_tasks=12", "data.max_length=64",
                 f"train.output_dir={tmp_path / 'run'}"]) == 2
    assert "no training example has an assistant token within data.max_length=64" in " ".join(
        capsys.readouterr().err.split())
