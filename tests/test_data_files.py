"""Data-file errors name the file, the line or record, and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corrgrpo_envs.tasks import DataFileError, RecordLocation, read_json, read_jsonl
from corrgrpo_envs.toolcall.env import ToolCallEnv

GOOD_ANSWER = '<think> x </think>\n<tool_call>\n{"name": "f", "parameters": {"a": 1}}\n</tool_call>'


def rlla_row(**overrides) -> dict:
    row = {
        "prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
        "reward_model": {"ground_truth": GOOD_ANSWER},
    }
    row.update(overrides)
    return row


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def _error(dataset, **kw) -> DataFileError:
    with pytest.raises(DataFileError) as info:
        ToolCallEnv(dataset=str(dataset), **kw)
    return info.value


# ------------------------------------------------------------------ helpers
def test_json_syntax_errors_name_the_line(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('[\n  {"a": 1},\n  {"a": 2,,}\n]\n', encoding="utf-8")
    with pytest.raises(DataFileError, match=r"x\.json:3: not valid JSON: Expecting property name"):
        read_json(path)
    lines = _jsonl(tmp_path / "x.jsonl", [{"a": 1}, "", '{"a": 2', {"a": 3}])
    with pytest.raises(DataFileError, match=r"x\.jsonl:3: not valid JSON") as info:
        read_jsonl(lines)
    assert info.value.line == 3 and info.value.path == lines and isinstance(info.value, ValueError)
    big = tmp_path / "big.jsonl"
    big.write_text('{"a": 1}\n{"a": ' + "9" * 5000 + "}\n", encoding="utf-8")
    with pytest.raises(DataFileError, match=r"big\.jsonl:2: not readable JSON: Exceeds the limit"):
        read_jsonl(big)


def test_non_utf8_and_missing_files(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": "caf\xe9"}\n')
    with pytest.raises(DataFileError, match=r"latin1\.jsonl:2: not UTF-8 text"):
        read_jsonl(path)
    with pytest.raises(DataFileError, match="cannot be read"):
        read_json(tmp_path / "absent.json")


def test_record_location_get_names_the_field(tmp_path):
    where = RecordLocation(tmp_path / "d.jsonl", line=7)
    assert where.get({"a": 1}, "a", int) == 1
    assert where.get({}, "a", default=None) is None
    with pytest.raises(DataFileError, match=r"d\.jsonl:7: reward_model\.ground_truth: missing"):
        where.get({}, "ground_truth", str, "reward_model.ground_truth")
    with pytest.raises(DataFileError, match=r"d\.jsonl:7: prompt: expected a list, got str 'hi'"):
        where.get({"prompt": "hi"}, "prompt", list)
    with pytest.raises(DataFileError, match=r"record 4: answer\.name: answer is list \[1\], not an object"):
        RecordLocation(Path("f.json"), record=4).get([1], "name", str, "answer.name")


# ------------------------------------------------------------------ tool calling
def test_rlla_jsonl_malformed_row(tmp_path):
    path = _jsonl(tmp_path / "rows.jsonl", [rlla_row(), rlla_row(), '{"prompt": [', rlla_row()])
    err = _error(path)
    assert (err.line, err.field) == (3, None) and str(err).startswith(f"{path}:3: not valid JSON")


@pytest.mark.parametrize(
    "row, field, reason",
    [
        ({"prompt": []}, "reward_model", "missing"),
        (rlla_row(reward_model={"truth": "x"}), "reward_model.ground_truth", "missing"),
        (rlla_row(reward_model="x"), "reward_model", "expected an object, got str 'x'"),
        (rlla_row(prompt=[{"role": "user", "content": 5}]), "prompt[0].content", "expected a string, got int 5"),
        (rlla_row(prompt=[{"content": "hi"}]), "prompt[0].role", "missing"),
        (rlla_row(reward_model={"ground_truth": "<tool_call>\nnot json\n</tool_call>"}),
         "reward_model.ground_truth", "ground-truth answer of task"),
    ],
)
def test_rlla_jsonl_field_errors(tmp_path, row, field, reason):
    path = _jsonl(tmp_path / "rows.jsonl", [rlla_row(), row])
    err = _error(path, format="rlla_jsonl")
    assert (err.path, err.line, err.field) == (path, 2, field)
    assert str(err).startswith(f"{path}:2: {field}: {reason}")


def test_an_unrecognised_broken_jsonl_says_where(tmp_path):
    path = _jsonl(tmp_path / "rows.jsonl", ['{"prompt": [', rlla_row()])
    err = _error(path)  # format detection reads the first line, which is broken
    assert err.line == 1 and "not valid JSON" in str(err)


def test_rlla_parquet_names_the_record(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="reading parquet needs the pyarrow package")
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    rows = [rlla_row(), rlla_row(reward_model={"ground_truth": "<tool_call>\n[1]\n</tool_call>"})]
    pq.write_table(pa.Table.from_pylist(rows), path)
    err = _error(path)
    assert (err.record, err.field) == (1, "reward_model.ground_truth")
    assert str(err).startswith(f"{path} record 1: reward_model.ground_truth: ground-truth answer")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    assert "not a readable parquet file" in str(_error(broken))


def test_rlla_sft_records(tmp_path):
    path = tmp_path / "sft.json"
    good = {"instruction": "sys", "input": "hi", "output": GOOD_ANSWER}
    path.write_text(json.dumps([good, good, {"instruction": "sys", "input": "hi"}]), encoding="utf-8")
    err = _error(path, format="rlla_sft")
    assert str(err) == f"{path} record 2: output: missing"
    path.write_text(json.dumps([good], indent=1)[:-3] + ",,]", encoding="utf-8")
    err = _error(path, format="rlla_sft")
    assert err.line is not None and "not valid JSON" in str(err)


def test_api_bank_records(tmp_path):
    path = tmp_path / "level-1-api_processed.json"
    good = {"system": "s", "user": "u", "answer": [{"name": "f", "parameters": {}}]}
    path.write_text(json.dumps([good, {**good, "answer": [{"name": "f"}, {"parameters": {}}]}]), encoding="utf-8")
    err = _error(path)
    assert str(err) == f"{path} record 1: answer[1].name: missing"
    path.write_text(json.dumps([{**good, "user": None}]), encoding="utf-8")
    assert str(_error(path, format="api_bank")) == f"{path} record 0: user: expected a string, got null"


def test_bfcl_files(tmp_path):
    (tmp_path / "possible_answer").mkdir()
    question = {"id": "simple_0", "question": [[{"role": "user", "content": "q"}]],
                "function": [{"name": "f", "parameters": {"type": "dict", "properties": {}}}]}
    _jsonl(tmp_path / "BFCL_v3_simple.json", [question, {**question, "id": 3}])
    _jsonl(tmp_path / "possible_answer" / "BFCL_v3_simple.json", [{"id": "simple_0", "ground_truth": [{"f": {}}]}])
    err = _error(tmp_path)
    assert str(err) == f"{tmp_path / 'BFCL_v3_simple.json'}:2: id: expected a string, got int 3"
    _jsonl(tmp_path / "BFCL_v3_simple.json", [question, {**question, "id": "simple_1", "function": [{"x": 1}]}])
    _jsonl(tmp_path / "possible_answer" / "BFCL_v3_simple.json",
           [{"id": f"simple_{i}", "ground_truth": [{"f": {}}]} for i in range(2)])
    err = _error(tmp_path)
    assert str(err) == f"{tmp_path / 'BFCL_v3_simple.json'}:2: function[0].name: missing"
    _jsonl(tmp_path / "possible_answer" / "BFCL_v3_simple.json", ["{oops"])
    err = _error(tmp_path)
    assert str(err).startswith(f"{tmp_path / 'possible_answer' / 'BFCL_v3_simple.json'}:1: not valid JSON")
