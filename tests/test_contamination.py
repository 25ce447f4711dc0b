"""studies.contamination: the overlap of an evaluation set with a training stage's tasks."""

from __future__ import annotations

import json

import pytest
from cpu_budget import least_cpu_seconds

from corrgrpo_envs.toolcall.datasets import shared_data_dir
from studies.contamination import (
    TaskRecord,
    answer_key,
    description_texts,
    main,
    normalise_type,
    overlap,
    question_words,
    schema_key,
    shingles,
    structure_key,
)


def tool(name: str, description: str, **params: str) -> dict:
    return {"name": name, "description": description,
            "parameters": {"type": "object", "properties": {p: {"type": t} for p, t in params.items()},
                           "required": list(params)[:1]}}


def call(name: str, **args: object) -> dict:
    return {"name": name, "parameters": args}


WEATHER = tool("get_weather", "Weather of a city.", city="string")
STOCK = tool("stock_price", "Latest price of a stock.", ticker="string", exchange="string")
TRAIN = [
    TaskRecord("t/0", "**Dialogue Records History**\n<user> What is the weather in Paris today, please? </user>",
               (WEATHER,), (call("get_weather", city="Paris"),)),
    TaskRecord("t/1", "Give me the latest price of the Apple stock on the Nasdaq exchange right now",
               (STOCK,), (call("stock_price", ticker="AAPL", exchange="NASDAQ"),)),
    TaskRecord("t/2", "Say hello", (), ()),
]
EVAL = [
    # the same tool under a random name and random parameter names: a renamed tool, same schema
    TaskRecord("e/0", "<user>what is the weather in PARIS today please?</user>",
               (tool("Xq7z", "weather of a  city.", zz="string"),), (call("get_weather", city="Paris"),)),
    # the same name, another description and schema; near-duplicate question (one word changed)
    TaskRecord("e/1", "Give me the latest price of the Apple stock on the Nasdaq exchange right away",
               (tool("stock_price", "Stock quote.", symbol="number"),),
               (call("stock_price", exchange="NASDAQ", ticker="AAPL"),)),
    # nothing shared; integral float answer equal to an int one elsewhere is its own test below
    TaskRecord("e/2", "Book a table for two at eight tonight in Rome", (tool("book", "Books a table.", n="integer"),),
               (call("book", n=2),)),
    TaskRecord("e/3", "Tell me a joke", (), ()),
]


def test_overlap_counts_on_synthetic_tasks():
    m = overlap(TRAIN, EVAL)
    assert (m["names"].matched, m["names"].total) == (1, 3)
    assert m["names"].examples == [{"eval_name": "stock_price"}]
    assert (m["descriptions"].matched, m["descriptions"].total) == (1, 3)
    assert (m["renamed"].matched, m["renamed_same_schema"].matched) == (1, 1)
    assert m["renamed"].examples[0]["train_names"] == ["get_weather"]
    assert (m["schemas"].matched, m["schemas"].total) == (1, 3)
    # same name and parameters: none (the weather tool is renamed, the stock tool retyped)
    assert (m["structures"].matched, m["structures"].total) == (0, 3)
    assert (m["description_identical"].matched, m["description_ngram"].matched) == (0, 0)
    assert (m["questions_exact"].matched, m["questions_exact"].total) == (1, 4)
    assert m["questions_exact"].examples[0]["train_id"] == "t/0"
    # e/1 shares 10 of its 11 5-grams with t/1's 11 (Jaccard 10/12 = 0.833): near at 0.8, not at 0.9
    assert m["questions_near"].matched == 2
    near = m["questions_near"].examples[1]
    assert (near["eval_id"], near["train_id"], near["jaccard"]) == ("e/1", "t/1", round(10 / 12, 3))
    assert overlap(TRAIN, EVAL, near=0.9)["questions_near"].matched == 1
    # answers: e/0 and e/1 (argument order ignored); e/3 expects no call
    assert (m["answers"].matched, m["answers"].total) == (2, 3)
    assert m["answers"].share == pytest.approx(200 / 3)


def test_renamed_tool_with_another_schema_is_renamed_only():
    train = [TaskRecord("t", "q", (tool("a", "Adds two numbers.", x="number", y="number"),))]
    evals = [TaskRecord("e", "r", (tool("b", "adds two numbers.", x="string"),))]
    m = overlap(train, evals)
    assert (m["renamed"].matched, m["renamed_same_schema"].matched, m["schemas"].matched) == (1, 0, 0)


def test_schema_key_ignores_parameter_names_but_not_required_or_types():
    base = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"]}
    renamed = {"type": "dict", "properties": {"q1": {"type": "string"}, "q2": {"type": "integer"}},
               "required": ["q1"]}
    assert schema_key(base) == schema_key(renamed)
    assert schema_key(base) != schema_key({**renamed, "required": ["q2"]})
    assert schema_key(base) != schema_key({**base, "properties": {"city": {"type": "string"}}})
    assert schema_key({"type": "object", "properties": {}}) is None


FIELD_DESCRIPTION = "Calculate the electric field produced by a charge at a certain distance."


def _field(kind: str, **extra: object) -> dict:
    return {"name": "calculate_electric_field", "description": FIELD_DESCRIPTION,
            "parameters": {"type": "object", "properties": {
                "charge": {"type": kind, "description": "Charge in coulombs producing the electric field.", **extra},
                "distance": {"type": kind, "description": "Distance from the charge in meters."}},
                "required": ["charge", "distance"]}}


def test_a_tool_retyped_int_to_integer_is_a_normalised_match_and_a_description_overlap_not_an_exact_one():
    train = [TaskRecord("t", "q", (_field("int", default=1),))]
    # the evaluation's copy: JSON schema's type name, no default, parameters in another order
    evaluation = _field("integer")
    evaluation["parameters"]["properties"] = dict(reversed(evaluation["parameters"]["properties"].items()))
    evaluation["parameters"]["required"] = ["distance", "charge"]
    m = overlap(train, [TaskRecord("e", "r", (evaluation,))])
    assert (m["schemas"].matched, m["schemas"].total) == (0, 1)  # exact spelling: int is not integer
    assert (m["structures"].matched, m["structures"].total) == (1, 1)
    assert m["structures"].examples == [{"eval_name": "calculate_electric_field",
                                         "train_name": "calculate_electric_field"}]
    assert (m["description_identical"].matched, m["description_ngram"].matched) == (1, 1)
    assert m["description_identical"].examples[0]["eval_text"] == "function"
    # another type is another structure, and so is another required list or parameter name
    for other in (_field("string"), {**_field("int"), "parameters": {**_field("int")["parameters"], "required": []}},
                  {**_field("int"), "name": "field_strength"}):
        if other["parameters"]["required"] == []:
            other["parameters"]["required"] = ["charge"]
        assert overlap(train, [TaskRecord("e", "r", (other,))])["structures"].matched == 0, other


def test_structure_key_normalises_types_names_order_and_drops_texts():
    python_style = {"name": "Sort_List", "description": "x", "parameters": {"type": "dict", "properties": {
        "Numbers": {"type": "List[int]", "description": "a", "default": []},
        "reverse": {"type": "bool, optional", "default": False}}}}
    json_style = {"name": "sort_list", "description": "y", "parameters": {"type": "object", "properties": {
        "reverse": {"type": "boolean", "enum": [True, False]},
        "numbers": {"type": "array", "items": {"type": "integer"}}}}}
    assert structure_key(python_style) == structure_key(json_style)
    assert structure_key(json_style) != structure_key({**json_style, "parameters": {"properties": {
        "reverse": {"type": "boolean"}, "numbers": {"type": "array", "items": {"type": "number"}}}}})
    assert normalise_type("Tuple[float, float]") == {"type": "array", "items": {"type": "number"}}
    assert normalise_type("tuple") == normalise_type("list") == {"type": "array"}
    assert normalise_type(["string", "null"]) == {"type": [{"type": "null"}, {"type": "string"}]}
    assert normalise_type("Optional[str]") == normalise_type("str") == {"type": "string"}
    assert normalise_type("Any") == {"type": "any"} and normalise_type("dict") == {"type": "object"}
    assert normalise_type("float") == normalise_type("number")


def test_a_schema_without_a_required_list_matches_either_way():
    rlla = {"name": "f", "parameters": {"properties": {"a": {"type": "str"}}}}
    bfcl = {"name": "f", "parameters": {"type": "dict", "properties": {"a": {"type": "string"}}, "required": ["a"]}}
    assert overlap([TaskRecord("t", "q", (rlla,))], [TaskRecord("e", "r", (bfcl,))])["structures"].matched == 1
    assert overlap([TaskRecord("t", "q", (bfcl,))], [TaskRecord("e", "r", (rlla,))])["structures"].matched == 1
    other = {**bfcl, "parameters": {**bfcl["parameters"], "required": []}}
    assert overlap([TaskRecord("t", "q", (bfcl,))], [TaskRecord("e", "r", (other,))])["structures"].matched == 1


def test_description_texts_identical_and_long_runs():
    assert description_texts(_field("int"))[1] == ("parameter charge", "charge in coulombs producing the electric field")
    train = [TaskRecord("t", "q", ({"name": "a", "description": "Returns the list of the five largest files in "
                                    "a folder, sorted by size.", "parameters": {"properties": {
                                        "city": {"type": "string", "description": "The city."}}}},))]
    longer = {"name": "b", "description": "Lists files. Returns the list of the five largest files in a folder, "
              "sorted by size, with their owners.", "parameters": {"properties": {
                  "town": {"type": "string", "description": "the  CITY."}}}}
    m = overlap(train, [TaskRecord("e", "r", (longer,))])
    # "the city" is shorter than 5 words: too generic to count when identical; the long run counts
    assert (m["description_identical"].matched, m["description_ngram"].matched) == (0, 1)
    assert "five largest files" in m["description_ngram"].examples[0]["words"]
    m = overlap(train, [TaskRecord("e", "r", ({**longer, "description": "returns the LIST of the five largest "
                                               "files in a folder -- sorted by size"},))])
    assert (m["description_identical"].matched, m["description_ngram"].matched) == (1, 1)


def test_answer_key_canonical():
    assert answer_key([call("f", a=1.0, b=[2.0])]) == answer_key([call("f", b=[2], a=1)])
    assert answer_key([call("f", a=1), call("g")]) == answer_key([call("g"), call("f", a=1)])
    assert answer_key([call("f", a="X")]) != answer_key([call("f", a="x")])
    assert answer_key([]) is None


def test_question_normalisation_and_shingles():
    assert question_words("**Dialogue Records History**\n<user>Hi, THERE!</user>") == ["hi", "there"]
    assert shingles(["a", "b"]) == frozenset(["a b"])
    assert len(shingles(list("abcdefg"))) == 3
    assert shingles([]) == frozenset()
    assert overlap(TRAIN, [TaskRecord("e", "  ", (), ())])["questions_near"].matched == 0


def test_near_threshold_is_checked():
    with pytest.raises(ValueError, match="near"):
        overlap(TRAIN, EVAL, near=0.0)


def _near_duplicates(n: int) -> tuple[list[TaskRecord], list[TaskRecord]]:
    """``n`` training and ``n`` evaluation questions, each pair sharing 4 of its 5 shingles."""
    train = [TaskRecord(f"t/{i}", f"question number {i} about topic {i * 7} with detail {i * 13}") for i in range(n)]
    evals = [TaskRecord(f"e/{i}", f"question number {i} about topic {i * 7} with detail {i * 13 + 1}")
             for i in range(n)]
    return train, evals


def test_index_scales_without_all_pairs():
    # 3000 x 3000 distinct questions: the inverted index looks only at shared shingles
    train, evals = _near_duplicates(3000)
    m, large_s = least_cpu_seconds(lambda: None, lambda: overlap(train, evals))
    assert m["questions_exact"].matched == 0
    # 9 words -> 5 shingles, 4 shared: Jaccard 4/6, below 0.8; at 0.6 every one is near
    assert m["questions_near"].matched == 0
    assert overlap(train, evals, near=0.6)["questions_near"].matched == 3000
    # 4x the questions cost about 4x through the index (4.5x measured quiet, 8 ms then 37 ms),
    # 16x when every pair is compared, and far more in absolute terms: 562k pairs at 750 alone
    small = _near_duplicates(750)
    _, small_s = least_cpu_seconds(lambda: None, lambda: overlap(*small), tries=5)
    print(f"overlap of 750 x 750 questions: {small_s * 1000:.1f} ms of CPU, 3000 x 3000: {large_s * 1000:.1f} ms")
    # 10x and 50 ms: a timer tick and a cold cache on the small figure cannot reach it; all pairs do
    assert large_s < 10 * small_s + 0.05, (small_s, large_s)


def test_command_refuses_a_config_without_a_toolcall_env(tmp_path, capsys):
    bad = tmp_path / "x.yaml"
    bad.write_text("env: {id: corrgrpo/Code-v0}\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="not the tool-calling env"):
        main(["--train", str(bad), "--eval", "generated"])
    files = tmp_path / "sft.yaml"
    files.write_text("env: {id: corrgrpo/ToolCall-v0}\ndata: {source: file, files: [a.json]}\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="only data.source=env is read"):
        main(["--train", str(files), "--eval", "generated"])
    with pytest.raises(SystemExit, match="N must be a whole number"):
        main(["--train", "env_configs/sft_toolcall_tiny.yaml", "--eval", "generated=x"])


def test_command_on_the_generator(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["--train", "env_configs/sft_toolcall_tiny.yaml", "--eval", "generated=50", "--json", str(out),
                 "--no-examples"]) == 0
    report = json.loads(out.read_text(encoding="utf-8"))["eval"]["generated"]
    assert report["tasks"] == 50
    assert report["names"]["matched"] == report["names"]["total"] > 0  # the generator has one tool set
    assert "questions, near" in capsys.readouterr().out


@pytest.mark.skipif(shared_data_dir() is None or not (shared_data_dir() / "api_bank").is_dir(),
                    reason="reference data (rlla_4k/, api_bank/) not found: set CORRGRPO_DATA")
def test_real_data_stage_two_against_api_bank_level_one(tmp_path):
    out = tmp_path / "r.json"
    assert main(["--train", "studies/configs/rlla_smollm2_rl_grpo.yaml", "--eval", "api_bank_l1=100",
                 "--eval", "rlla_test", "--json", str(out), "--no-examples"]) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["train_tasks"] == 497
    api_bank, rlla = report["eval"]["api_bank_l1"], report["eval"]["rlla_test"]
    assert (api_bank["answers"]["matched"], api_bank["answers"]["total"]) == (15, 100)
    assert (rlla["renamed"]["matched"], rlla["renamed_same_schema"]["matched"]) == (29, 28)
    assert rlla["questions_near"]["matched"] == 0
    # normalised: the same names with the same parameters, and description texts copied
    assert (api_bank["structures"]["matched"], api_bank["structures"]["total"]) == (23, 39)
    assert (rlla["structures"]["matched"], rlla["description_identical"]["matched"]) == (23, 75)
