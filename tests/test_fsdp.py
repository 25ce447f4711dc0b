"""FSDP2 through Accelerate on 2 CPU processes: same numbers as one process, sharded resume, full weights."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.launched import run_bounded
from tests.ports import free_port

pytestmark = pytest.mark.slow  # two processes under accelerate launch, about a minute

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "env_configs" / "accelerate"
SCRIPT = ROOT / "tests" / "fsdp_check.py"
LAUNCHER = Path(sys.executable).parent / "accelerate"


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The check script run by one plain process and by 2 FSDP processes."""
    if not LAUNCHER.exists():
        pytest.skip("the accelerate launcher is not installed")
    tmp = tmp_path_factory.mktemp("fsdp")
    one, two = tmp / "one.pt", tmp / "two.pt"
    run_bounded([sys.executable, str(SCRIPT), str(one)], env=_env())
    run_bounded([str(LAUNCHER), "launch", "--config_file", str(CONFIGS / "fsdp_cpu.yaml"),
                 "--main_process_port", str(free_port()), str(SCRIPT), str(two)], env=_env())
    return torch.load(one), torch.load(two)


def test_fsdp_matches_one_process(runs):
    one, two = runs
    assert (one["world"], one["sharded"]) == (1, False)
    assert (two["world"], two["sharded"]) == (2, True)
    for a, b in zip(one["advantages"], two["advantages"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert sorted(one["params"]) == sorted(two["params"])
    # as for DDP (tests/test_trainer_e2e.py): the reduction order differs (~1e-9 in the
    # gradients), which Adam turns into up to ~1e-5 in weights after 3 steps of lr 1e-3
    for name in one["params"]:
        torch.testing.assert_close(one["params"][name], two["params"][name], rtol=1e-4, atol=3e-5)
    moved = max((one["params"][k] - one["after_2"][k]).abs().max().item() for k in one["params"])
    assert moved > 1e-4  # step 3 changed the weights by far more than the tolerance


def test_update_and_gradient_norms_are_of_the_full_parameters(runs):
    one, two = runs
    for a, b in zip(one["norms"], two["norms"]):
        for key in ("update_norm", "param_norm", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-3), key
    for run in (one, two):  # step 3's logged ||delta theta|| is that of the gathered weights
        delta = sum(float((run["params"][k] - run["after_2"][k]).double().square().sum()) for k in run["params"])
        assert run["norms"][2]["update_norm"] == pytest.approx(delta**0.5, rel=1e-4)


def test_resumed_fsdp_run_continues_with_the_same_numbers(runs):
    _, two = runs
    for name, value in two["params"].items():
        torch.testing.assert_close(two["resumed"][name], value, rtol=0, atol=0)


def test_checkpoint_has_shards_and_a_plain_transformers_folder(runs):
    from transformers import AutoModelForCausalLM

    _, two = runs
    files = set(two["files"])
    assert {"sharded/.metadata", "sharded/__0_0.distcp", "sharded/__1_0.distcp"} <= files
    assert {"rng_0.pt", "rng_1.pt", "trainer_state.pt", "model/config.json"} <= files
    folder = Path(two["checkpoint"]) / "model"
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.architectures == ["Qwen2ForCausalLM"]
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, two["after_2"][name], rtol=0, atol=0)


def test_gpu_config_is_the_tested_cpu_config_on_gpus():
    gpu = yaml.safe_load((CONFIGS / "fsdp.yaml").read_text())
    cpu = yaml.safe_load((CONFIGS / "fsdp_cpu.yaml").read_text())
    device_keys = {"use_cpu", "num_processes", "mixed_precision"}
    assert {k: v for k, v in gpu.items() if k not in device_keys} == {
        k: v for k, v in cpu.items() if k not in device_keys
    }
    assert gpu["fsdp_config"]["fsdp_version"] == 2 and gpu["use_cpu"] is False


def test_unsharded_model_helpers_are_plain():
    from corrgrpo.agents import load_model
    from corrgrpo.trainer.fsdp import full_state_dict, is_sharded

    model, _ = load_model("tiny")
    assert not is_sharded(model)
    state = full_state_dict(model)
    assert state.keys() == model.state_dict().keys()
