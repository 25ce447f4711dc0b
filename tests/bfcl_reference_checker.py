"""Score tool calls with BFCL's own AST checker; runs in the bfcl-eval venv (scripts/bfcl_venv.sh).

    .venv-bfcl/bin/python tests/bfcl_reference_checker.py < answers.jsonl > verdicts.jsonl
    .venv-bfcl/bin/python tests/bfcl_reference_checker.py --version

Each input line is ``{"key": any, "category": "simple_python", "task": "simple_python_96",
"calls": [{"name": ..., "parameters": {...}}] or null}``; the question (its function
descriptions) and the possible answer are read from the data files installed with bfcl-eval,
not from the caller. A line may give its own ``"functions"`` and ``"answer"`` instead of
``"task"`` (hand-made cases). ``calls: null`` stands for an answer whose calls could not be read (BFCL:
the decoder failed). Each output line is ``{"key", "valid", "error_type"}``; a checker that
raises gives ``valid: false`` and ``error_type: "crash:<ExceptionName>"`` (in a benchmark run the
exception would stop the evaluation, so the answer is not counted as correct either).

Only the standard library and bfcl_eval are imported. bfcl_eval's table of model settings
(``bfcl_eval.constants.model_config``) imports every vendor SDK; the checker reads one field of
it, whether a model's function names have ``.`` written as ``_``. A stand-in table answers
"no" for every model: the names are scored as the prompt shows them, with their dots.
"""

from __future__ import annotations

import json
import sys
import types
from importlib import metadata, resources

BFCL_VERSION = "2026.3.23"


class _NoUnderscoreToDot:
    underscore_to_dot = False


class _AnyModel(dict):
    def __missing__(self, key: str) -> _NoUnderscoreToDot:
        return _NoUnderscoreToDot()


def _install_model_table() -> None:
    stand_in = types.ModuleType("bfcl_eval.constants.model_config")
    stand_in.MODEL_CONFIG_MAPPING = _AnyModel()
    sys.modules["bfcl_eval.constants.model_config"] = stand_in


def _read_jsonl(path) -> dict[str, dict]:
    rows = {}
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                rows[row["id"]] = row
    return rows


def main(argv: list[str]) -> int:
    _install_model_table()
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    version = metadata.version("bfcl-eval")
    if argv[1:] == ["--version"]:
        print(f"bfcl-eval {version}, ast_checker importable")
        return 0
    if version != BFCL_VERSION:
        print(f"bfcl-eval {version} installed, {BFCL_VERSION} expected", file=sys.stderr)
        return 2
    data = resources.files("bfcl_eval") / "data"
    questions: dict[str, dict[str, dict]] = {}
    answers: dict[str, dict[str, dict]] = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        item = json.loads(line)
        category = item["category"]
        if "task" in item:
            if category not in questions:
                questions[category] = _read_jsonl(data / f"BFCL_v4_{category}.json")
                answers[category] = _read_jsonl(
                    data / "possible_answer" / f"BFCL_v4_{category}.json"
                )
            functions = questions[category][item["task"]]["function"]
            truth = answers[category][item["task"]]["ground_truth"]
        else:
            functions, truth = item["functions"], item["answer"]
        calls = item["calls"]
        if calls is None:
            result = {"valid": False, "error_type": "ast_decoder:decoder_failed"}
        else:
            output = [{c["name"]: c["parameters"]} for c in calls]
            try:
                result = ast_checker(
                    functions, output, truth, Language.PYTHON, category, "corrgrpo"
                )
            except Exception as e:  # the checker's own failure on this answer: report it, go on
                result = {"valid": False, "error_type": f"crash:{type(e).__name__}"}
        verdict = {
            "key": item["key"],
            "valid": bool(result["valid"]),
            "error_type": result.get("error_type", "") if not result["valid"] else "",
        }
        sys.stdout.write(json.dumps(verdict) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
