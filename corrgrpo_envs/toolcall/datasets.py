"""Task sources of the tool-calling domain.

Every task's ``data`` holds ``dataset`` (its data set's name), ``messages``
(system prompt + dialogue so far), ``tools`` (JSON schemas),
``expected_calls`` (``[{"name", "parameters"}]``, BFCL calls also ``allowed``
and ``optional``), ``expects_response`` and ``response`` (a reference reply). BFCL tasks of
the Python categories also hold ``bfcl``: ``{"category", "functions", "answer"}`` as BFCL's
files give them, for BFCL's own verdict (:mod:`corrgrpo_envs.toolcall.bfcl_verdict`).

Built-in names: ``generated`` (the procedural generator, the default; options
``num_tasks`` and ``seed``), and the shipped reference files ``rlla_test``,
``rlla_sft``, ``api_bank`` (levels 1-3) and ``api_bank_l1`` .. ``api_bank_l3``,
found under ``$CORRGRPO_DATA``, ``$CORRGRPO_SHARED/data`` or ``../shared/data``
beside the project. File formats (detected, or named with ``format=``):
``rlla_jsonl``, ``rlla_parquet``, ``rlla_sft``, ``api_bank``, ``bfcl``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from corrgrpo_envs.tasks import (
    DatasetRegistry,
    RecordLocation,
    Task,
    TaskSource,
    read_json,
    read_jsonl,
    read_parquet,
)
from corrgrpo_envs.toolcall.answer_format import parse_answer
from corrgrpo_envs.toolcall.bfcl_verdict import checks_python
from corrgrpo_envs.toolcall.generator import generate_task
from corrgrpo_envs.toolcall.prompts import system_prompt, tools_from_system_prompt
from corrgrpo_envs.toolcall.rewards import is_dict_spec, is_spec_list

__all__ = ["DATASETS", "shared_data_dir", "bfcl_expected_call", "canonical_value"]

DATASETS = DatasetRegistry("toolcall")


def shared_data_dir() -> Path | None:
    """Where the shipped reference data sets are, if anywhere."""
    if os.environ.get("CORRGRPO_DATA"):
        return Path(os.environ["CORRGRPO_DATA"]).expanduser()
    if os.environ.get("CORRGRPO_SHARED"):
        return Path(os.environ["CORRGRPO_SHARED"]).expanduser() / "data"
    candidate = Path(__file__).resolve().parents[2].parent / "shared" / "data"
    return candidate if candidate.is_dir() else None


def _shared_file(relative: str) -> Path:
    root = shared_data_dir()
    path = root / relative if root else None
    if path is None or not path.exists():
        raise ValueError(
            f"reference file {relative!r} not found (set CORRGRPO_DATA to the folder holding "
            "rlla_4k/ and api_bank/, or pass the file's path as dataset=)"
        )
    return path


def _task(
    task_id: str,
    dataset: str,
    messages: list[dict[str, Any]],
    expected_calls: list[dict[str, Any]],
    expects_response: bool,
    response: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> Task:
    system = next((m["content"] for m in messages if m["role"] == "system"), "")
    return Task(
        task_id,
        {
            "dataset": dataset,
            "messages": messages,
            "tools": tools if tools is not None else tools_from_system_prompt(system),
            "expected_calls": expected_calls,
            "expects_response": expects_response,
            "response": response,
            **extra,
        },
    )


def _from_answer_text(
    task_id: str,
    dataset: str,
    messages: list[dict[str, Any]],
    answer: str,
    where: RecordLocation,
    field: str,
    **extra: Any,
) -> Task:
    """A task whose expectation is a ground-truth answer in the RLLA format (``field`` of the record at ``where``)."""
    parsed = parse_answer(answer)
    if parsed.errors:
        raise where.error(f"ground-truth answer of task {task_id!r} is not readable: {parsed.errors[0]}", field)
    return _task(
        task_id,
        dataset,
        messages,
        parsed.tool_calls,
        parsed.response is not None,
        parsed.response,
        ground_truth=answer,
        **extra,
    )


def _combine(sources: Iterable[TaskSource], name: str) -> TaskSource:
    tasks = [t for s in sources for t in s]
    return TaskSource(tasks, name=name)


# --------------------------------------------------------------- generator
@DATASETS.builtin("generated", "procedural tasks from a seed (options num_tasks, seed, max_extra_tools, prompt)")
def load_generated(num_tasks: int = 1000, seed: int = 0, max_extra_tools: int = 3, prompt: str = "rlla") -> TaskSource:
    if int(num_tasks) < 1:
        raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
    tasks = []
    for i in range(int(num_tasks)):
        data = generate_task(int(seed), i, int(max_extra_tools), prompt)
        tasks.append(_task(f"generated/{i:05d}", "generated", **data))
    return TaskSource(tasks, name="generated")


# ---------------------------------------------------------------- RLLA-4K
def _messages(where: RecordLocation, turns: Any, field: str) -> list[dict[str, Any]]:
    """Chat messages ``{"role", "content"}`` (both strings) from the list at ``field``."""
    if not isinstance(turns, list):
        raise where.error(f"expected a list of messages, got {type(turns).__name__}", field)
    return [
        {
            "role": where.get(m, "role", str, f"{field}[{j}].role"),
            "content": where.get(m, "content", str, f"{field}[{j}].content"),
        }
        for j, m in enumerate(turns)
    ]


def _rlla_rows(rows: Iterable[tuple[RecordLocation, Any]], name: str) -> TaskSource:
    tasks = []
    for i, (where, row) in enumerate(rows):
        messages = _messages(where, where.get(row, "prompt", list), "prompt")
        reward_model = where.get(row, "reward_model", dict)
        answer = where.get(reward_model, "ground_truth", str, "reward_model.ground_truth")
        extra = where.get(row, "extra_info", (dict, type(None)), default=None) or {}
        index = extra.get("index", i)
        tasks.append(
            _from_answer_text(f"{name}/{index}", name, messages, answer, where, "reward_model.ground_truth")
        )
    return TaskSource(tasks, name=name)


def _first_line_keys(path: Path) -> set[str]:
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.loads(f.readline())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return set()
    return set(obj) if isinstance(obj, dict) else set()


@DATASETS.file_format(
    "rlla_jsonl",
    detect=lambda p: p.is_file() and p.suffix == ".jsonl" and {"prompt", "reward_model"} <= _first_line_keys(p),
    description="RLLA-4K rows as JSON lines (prompt, reward_model.ground_truth)",
)
def load_rlla_jsonl(path: Path) -> TaskSource:
    rows = [(RecordLocation(path, line=n), row) for n, row in read_jsonl(path)]
    return _rlla_rows(rows, f"rlla_{path.stem}")


@DATASETS.file_format(
    "rlla_parquet",
    detect=lambda p: p.is_file() and p.suffix == ".parquet",
    description="RLLA-4K rows in the original parquet (needs pyarrow)",
)
def load_rlla_parquet(path: Path) -> TaskSource:
    rows = [(RecordLocation(path, record=i), row) for i, row in enumerate(read_parquet(path))]
    return _rlla_rows(rows, f"rlla_{path.stem}")


def _json_records(path: Path) -> list[Any] | None:
    if not path.is_file() or path.suffix != ".json":
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, list) else None


def _read_json_list(path: Path, what: str) -> list[tuple[RecordLocation, Any]]:
    data = read_json(path)
    if not isinstance(data, list):
        raise RecordLocation(path).error(f"expected a JSON list of {what}, got {type(data).__name__}")
    return [(RecordLocation(path, record=i), rec) for i, rec in enumerate(data)]


def _records_have(path: Path, keys: set[str]) -> bool:
    records = _json_records(path)
    return bool(records) and isinstance(records[0], dict) and keys <= set(records[0])


@DATASETS.file_format(
    "rlla_sft",
    detect=lambda p: _records_have(p, {"instruction", "input", "output"}),
    description="RLLA SFT examples: a JSON list of {instruction, input, output}",
)
def load_rlla_sft(path: Path) -> TaskSource:
    tasks = []
    for i, (where, rec) in enumerate(_read_json_list(path, "{instruction, input, output}")):
        messages = [
            {"role": "system", "content": where.get(rec, "instruction", str)},
            {"role": "user", "content": where.get(rec, "input", str)},
        ]
        output = where.get(rec, "output", str)
        tasks.append(_from_answer_text(f"rlla_sft/{i}", "rlla_sft", messages, output, where, "output"))
    return TaskSource(tasks, name="rlla_sft")


# ---------------------------------------------------------------- API-Bank
def _api_bank_name(path: Path) -> str:
    level = re.search(r"level-(\d+)", path.name)
    return f"api_bank_l{level.group(1)}" if level else f"api_bank_{path.stem}"


@DATASETS.file_format(
    "api_bank",
    detect=lambda p: _records_have(p, {"system", "user", "answer"}),
    description="API-Bank processed: a JSON list of {system, user, answer=[{name, parameters}]}",
)
def load_api_bank(path: Path) -> TaskSource:
    name = _api_bank_name(path)
    tasks = []
    for i, (where, rec) in enumerate(_read_json_list(path, "{system, user, answer}")):
        answer = where.get(rec, "answer", (dict, list))
        calls = answer if isinstance(answer, list) else [answer]
        expected = []
        for j, c in enumerate(calls):
            label = f"answer[{j}]" if isinstance(answer, list) else "answer"
            params = where.get(c, "parameters", (dict, type(None)), f"{label}.parameters", default=None)
            expected.append({"name": where.get(c, "name", str, f"{label}.name"), "parameters": dict(params or {})})
        messages = [
            {"role": "system", "content": where.get(rec, "system", str)},
            {"role": "user", "content": where.get(rec, "user", str)},
        ]
        tasks.append(_task(f"{name}/{i}", name, messages, expected, False))
    return TaskSource(tasks, name=name)


@DATASETS.builtin("rlla_test", "RLLA-4K test split (80 rows) from the shared reference data")
def _rlla_test() -> TaskSource:
    return load_rlla_jsonl(_shared_file("rlla_4k/test.jsonl"))


@DATASETS.builtin("rlla_sft", "RLLA SFT examples (400) from the shared reference data")
def _rlla_sft() -> TaskSource:
    return load_rlla_sft(_shared_file("rlla_4k/rlla_sft.json"))


def _api_bank_level(level: int) -> TaskSource:
    return load_api_bank(_shared_file(f"api_bank/level-{level}-api_processed.json"))


for _level in (1, 2, 3):
    DATASETS.builtin(f"api_bank_l{_level}", f"API-Bank level {_level} (shared reference data)")(
        lambda _level=_level: _api_bank_level(_level)
    )


@DATASETS.builtin("api_bank", "API-Bank levels 1-3 (shared reference data)")
def _api_bank_all() -> TaskSource:
    return _combine((_api_bank_level(lv) for lv in (1, 2, 3)), "api_bank")


# -------------------------------------------------------------------- BFCL
def _resolve_spec(spec: Mapping[str, list[Any]]) -> dict[str, Any]:
    # one level deep, as BFCL's checker reads a spec; keys that may be left out are left out
    return {k: opts[0] for k, opts in spec.items() if opts and "" not in opts}


def canonical_value(allowed: list[Any]) -> Any:
    """The first accepted value that is not the "may be omitted" marker ``""``, with a BFCL dict
    spec (or a list of them) resolved to the dict(s) it accepts; ``""`` when nothing else is
    accepted (which BFCL accepts for a string parameter)."""
    value = next((v for v in allowed if v != ""), "")
    if is_dict_spec(value):
        return _resolve_spec(value)
    if is_spec_list(value):
        return [_resolve_spec(s) for s in value]
    return value


def bfcl_expected_call(
    name: str, allowed: Mapping[str, list[Any]], required: Sequence[str] = ()
) -> dict[str, Any]:
    """An expected call from a BFCL ground-truth entry ``{name: {param: [accepted values]}}``.

    Parameters whose accepted values include ``""`` may be left out (``optional``), unless
    ``required`` (the function schema's required list, which BFCL's checker enforces) names
    them; the others are expected, with :func:`canonical_value` as the reference. An empty
    list of accepted values (a few BFCL rows) is read as "the empty list, or left out" (BFCL's
    checker accepts nothing there).
    """
    allowed = {k: (list(v) if v else [[], ""]) for k, v in allowed.items()}
    must = set(required)
    optional = [k for k, opts in allowed.items() if "" in opts and k not in must]
    params = {k: canonical_value(opts) for k, opts in allowed.items() if k not in optional}
    return {
        "name": name,
        "parameters": params,
        "allowed": allowed,
        "optional": optional,
    }


def _bfcl_schema(where: RecordLocation, fn: Any, field: str) -> dict[str, Any]:
    name = where.get(fn, "name", str, f"{field}.name")
    params = dict(where.get(fn, "parameters", (dict, type(None)), f"{field}.parameters", default=None) or {})
    if params.get("type") == "dict":  # BFCL's spelling of a JSON-schema object
        params["type"] = "object"
    return {"name": name, "description": fn.get("description", ""), "parameters": params}


def _is_call_answer(truth: Any) -> bool:
    """A possible answer of single-turn calls: ``[{name: {param: [accepted values]}}]``."""
    return isinstance(truth, list) and all(
        isinstance(c, dict) and len(c) == 1
        and all(isinstance(args, dict) and all(isinstance(opts, list) for opts in args.values())
                for args in c.values())
        for c in truth
    )


def _required(tool: Mapping[str, Any]) -> list[str]:
    required = tool["parameters"].get("required")
    return [r for r in required if isinstance(r, str)] if isinstance(required, list) else []


def _read_jsonl(path: Path) -> list[tuple[RecordLocation, Any]]:
    return [(RecordLocation(path, line=n), row) for n, row in read_jsonl(path)]


def _bfcl_category(path: Path) -> str:
    return re.sub(r"^BFCL_v\d+_", "", path.stem)


def _bfcl_file(path: Path) -> list[Task]:
    """Tasks of one question file; questions without single-turn call answers are skipped."""
    category = _bfcl_category(path)
    answers_path = path.parent / "possible_answer" / path.name
    if answers_path.exists():
        answers = {
            where.get(r, "id", str): where.get(r, "ground_truth") for where, r in _read_jsonl(answers_path)
        }
    elif "irrelevance" in category:
        answers = None  # no call is the right answer
    else:
        return []
    tasks = []
    for where, rec in _read_jsonl(path):
        rec_id = where.get(rec, "id", str)
        turns = where.get(rec, "question", (list, type(None)), default=None) or []
        if len(turns) != 1 or not isinstance(turns[0], list):
            continue  # multi-turn categories are not single-answer tasks
        truth = None if answers is None else answers.get(rec_id)
        if answers is not None and not _is_call_answer(truth):
            continue
        functions = where.get(rec, "function", (list, type(None)), default=None) or []
        tools = [_bfcl_schema(where, fn, f"function[{j}]") for j, fn in enumerate(functions)]
        expected: list[dict[str, Any]] = []
        if truth is not None:
            required: dict[str, list[str]] = {}
            for tool in tools:  # BFCL's checker takes the first description of a name
                required.setdefault(tool["name"], _required(tool))
            expected = [bfcl_expected_call(n, args, required.get(n, ()))
                        for c in truth for n, args in c.items()]
        # BFCL's own verdict reads the function descriptions as BFCL spells them
        verdict = {"category": category, "functions": functions, "answer": truth} \
            if expected and checks_python(category) else None
        dialogue = _messages(where, turns[0], "question[0]")
        preamble = "\n".join(m["content"] for m in dialogue if m["role"] == "system")
        messages = [{"role": "system", "content": system_prompt(tools, preamble)}]
        messages += [m for m in dialogue if m["role"] != "system"]
        tasks.append(
            _task(
                f"bfcl_{category}/{rec_id}",
                f"bfcl_{category}",
                messages,
                expected,
                not expected,
                "None of the available tools fits this request." if not expected else None,
                tools=tools,
                # BFCL checks its parallel categories without order (parallel_function_checker_no_order)
                calls_in_any_order="parallel" in category,
                bfcl=verdict,
            )
        )
    return tasks


def _looks_like_bfcl(path: Path) -> bool:
    if path.is_dir():
        return (path / "possible_answer").is_dir()
    return path.is_file() and (path.parent / "possible_answer" / path.name).exists()


@DATASETS.file_format(
    "bfcl",
    detect=_looks_like_bfcl,
    description="BFCL data folder (question JSON lines + possible_answer/ of the same name), or one question file",
)
def load_bfcl(path: Path, categories: list[str] | None = None) -> TaskSource:
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if categories is not None:
        files = [f for f in files if _bfcl_category(f) in set(categories)]
    tasks = [t for f in files for t in _bfcl_file(f)]
    if not tasks:
        raise ValueError(f"{path}: no BFCL question file with single-turn answers found")
    return TaskSource(tasks, name="bfcl")
