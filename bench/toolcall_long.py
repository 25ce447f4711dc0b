"""The long-prompt setting of ``bench.vs_trl``: 23 generated tool-call tasks of about 780 tokens.

Agent RL prompts are long (a system prompt, the tool list) and shared by a group's G
rollouts. These are the ToolCall generator's tasks (seed 0, of its first 1,000) whose prompt in
the RLLA house layout (``prompt_format: house``) has 760-800 tokens in SmolLM2's chat template
(mean 778); ``tests/test_bench_vs_trl.py`` re-counts them. Importing this module
registers them as the ToolCall data set ``generated_long``, which a run config reaches
through ``env.import: [bench.toolcall_long]`` and TRL through ``for_trl(..., dataset=...)``.
"""

from __future__ import annotations

from corrgrpo_envs.tasks import TaskSource
from corrgrpo_envs.toolcall.datasets import DATASETS, load_generated

__all__ = ["LONG_TASK_IDS", "PROMPT_TOKENS", "load_generated_long"]

#: The chosen tasks' ids in the generator's data set (seed 0, 1,000 tasks).
LONG_TASK_IDS = tuple(f"generated/{i:05d}" for i in (
    23, 55, 67, 224, 228, 237, 268, 272, 281, 436, 491, 582,
    684, 706, 711, 751, 760, 775, 796, 824, 879, 907, 943,
))
#: The window their prompts fall in (tokens of SmolLM2-135M-Instruct's rendering).
PROMPT_TOKENS = (760, 800)


@DATASETS.builtin("generated_long", "23 generated tasks with prompts of 760-800 tokens (bench.vs_trl)")
def load_generated_long() -> TaskSource:
    """The :data:`LONG_TASK_IDS` tasks, in that order, all in the ``train`` split."""
    generated = load_generated(num_tasks=1000, seed=0)
    return TaskSource([generated.get(t) for t in LONG_TASK_IDS], name="generated_long",
                      split_of=lambda task: "train")
