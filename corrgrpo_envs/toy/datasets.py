"""Task sources of the toy domain: built-in prompts, a ``.txt`` or a ``.jsonl`` of prompts.

Every task's data holds ``prompt``, the user message.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corrgrpo_envs.tasks import DatasetRegistry, Task, TaskSource

__all__ = ["DATASETS", "PROMPT_TEMPLATE"]

PROMPT_TEMPLATE = "write a short string: {k}"

DATASETS = DatasetRegistry("toy")


def _prompt_tasks(prompts: Sequence[tuple[str, str]], name: str) -> TaskSource:
    return TaskSource([Task(tid, {"prompt": p}) for tid, p in prompts], name=name)


@DATASETS.builtin("short-strings", "num_tasks prompts 'write a short string: {k}', k = 0..num_tasks-1")
def _short_strings(num_tasks: int = 64, prompt_template: str = PROMPT_TEMPLATE) -> TaskSource:
    if int(num_tasks) < 1:
        raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
    return _prompt_tasks(
        [(f"prompt-{k:04d}", prompt_template.format(k=k)) for k in range(int(num_tasks))],
        name="short-strings",
    )


@DATASETS.file_format("txt", detect=lambda p: p.suffix == ".txt", description="one prompt per line")
def _txt(path: Path, **_: Any) -> TaskSource:
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    return _prompt_tasks(
        [(f"prompt-{i:04d}", ln) for i, ln in enumerate(x for x in lines if x)], name=path.stem
    )


@DATASETS.file_format(
    "jsonl", detect=lambda p: p.suffix == ".jsonl", description='{"id": ..., "prompt": ...} per line'
)
def _jsonl(path: Path, **_: Any) -> TaskSource:
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if line.strip():
            obj = json.loads(line)
            if not isinstance(obj, dict) or "prompt" not in obj:
                raise ValueError(f"{path}:{i + 1}: expected an object with a 'prompt' key")
            rows.append((str(obj.get("id", f"prompt-{i:04d}")), str(obj["prompt"])))
    return _prompt_tasks(rows, name=path.stem)
