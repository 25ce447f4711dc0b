"""Tool-calling data sets: ground truth scores the maxima everywhere; perturbations score by the rules."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest

from corrgrpo_envs.toolcall.answer_format import parse_answer, render_answer
from corrgrpo_envs.toolcall.datasets import DATASETS
from corrgrpo_envs.toolcall.env import ToolCallEnv
from corrgrpo_envs.toolcall.rewards import REWARD_NAMES, score_answer

SHARED = Path(os.environ.get("CORRGRPO_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
DATA = SHARED / "data"
needs_shared = pytest.mark.skipif(
    not (DATA / "rlla_4k").is_dir(), reason=f"shared reference data not found at {DATA}"
)
MAXIMA = (0.5, 1.0, 1.5, 1.0)


def rewards(answer: str, task) -> tuple:
    s = score_answer(answer, task["expected_calls"], task["expects_response"])
    return tuple(s.rewards[n] for n in REWARD_NAMES)


def approx(values) -> object:
    return pytest.approx(tuple(values), abs=1e-9)


@pytest.fixture(scope="module")
def rlla_test():
    return DATASETS.load(DATA / "rlla_4k" / "test.jsonl")


@needs_shared
def test_rlla_test_rows_score_the_maxima_with_their_own_ground_truth(rlla_test):
    assert len(rlla_test) == 80
    assert sum(1 for t in rlla_test if t["expected_calls"]) == 71
    for task in rlla_test:
        got = rewards(task["ground_truth"], task)
        if task["expected_calls"]:
            assert got == MAXIMA, task.id
        else:
            assert got == (0.0, 0.0, 0.0, 1.0), task.id


@needs_shared
def test_rlla_observation_uses_the_rows_own_messages(rlla_test):
    env = ToolCallEnv(dataset=DATA / "rlla_4k" / "test.jsonl")
    row = json.loads((DATA / "rlla_4k" / "test.jsonl").read_text().splitlines()[0])
    obs, info = env.reset(options={"task_id": "rlla_test/0"})
    assert obs["messages"] == row["prompt"]
    assert [t["name"] for t in obs["tools"]] == ["GetPowerBINews", "SingleOffer", "Domain WHOIS Lookup API", "GetNews"]
    assert obs["tools"][0]["parameters"]["properties"]["page"]["type"] == "int"
    assert env.observation_space.contains(obs)


@needs_shared
def test_parquet_and_jsonl_hold_the_same_tasks(rlla_test):
    pytest.importorskip("pyarrow")
    parquet = DATASETS.load(DATA / "rlla_4k" / "test.parquet")
    assert parquet.ids == rlla_test.ids
    for a, b in zip(parquet, rlla_test):
        assert a["expected_calls"] == b["expected_calls"] and a["messages"] == b["messages"]


def _first_unique_call(task) -> int | None:
    names = [c["name"] for c in task["expected_calls"]]
    for i, name in enumerate(names):
        if names.count(name) == 1 and task["expected_calls"][i]["parameters"]:
            return i
    return None


@needs_shared
def test_rlla_perturbations_score_what_the_rules_say(rlla_test):
    checked = 0
    for task in rlla_test:
        expected = task["expected_calls"]
        i = _first_unique_call(task)
        if i is None:
            continue
        checked += 1
        n_calls = len(expected)
        v_max = sum(len(c["parameters"]) for c in expected)
        target = expected[i]
        key = next(iter(target["parameters"]))
        k = len(target["parameters"])

        def with_call(new, i=i, expected=expected):
            return render_answer([new if j == i else c for j, c in enumerate(expected)])

        # a wrong value: one value of V_max lost
        wrong = {"name": target["name"], "parameters": {**target["parameters"], key: "__wrong__"}}
        assert rewards(with_call(wrong), task) == approx((0.5, 1.0, 3 * (v_max - 1) / v_max - 1.5, 1.0)), task.id
        # a missing parameter: that call's key-Jaccard (k-1)/k, one value lost
        params = dict(target["parameters"])
        del params[key]
        missing = {"name": target["name"], "parameters": params}
        p = n_calls - 1 + (k - 1) / k
        assert rewards(with_call(missing), task) == approx(
            (0.5, 2 * p / n_calls - 1, 3 * (v_max - 1) / v_max - 1.5, 1.0)
        ), task.id
        # a wrong name: names (P-1)/(P+1), that call unmatched
        renamed = {"name": target["name"] + "_x", "parameters": target["parameters"]}
        assert rewards(with_call(renamed), task) == approx(
            (
                (n_calls - 1) / (n_calls + 1) - 0.5,
                2 * (n_calls - 1) / n_calls - 1,
                3 * (v_max - k) / v_max - 1.5,
                1.0,
            )
        ), task.id
        # an extra call: names P/(P+1), the rest perfect
        extra = render_answer([*expected, {"name": "__extra__", "parameters": {}}])
        assert rewards(extra, task) == approx((n_calls / (n_calls + 1) - 0.5, 1.0, 1.5, 1.0)), task.id
        # a broken tag: unparseable, the minima and no format
        broken = task["ground_truth"].replace("</tool_call>", "")
        s = score_answer(broken, expected, task["expects_response"])
        assert tuple(s.rewards[n] for n in REWARD_NAMES) == (-0.5, -1.0, -1.5, 0.0) and s.error
    assert checked >= 60


@needs_shared
def test_rlla_sft_ground_truth_scores_the_maxima():
    sft = DATASETS.load(DATA / "rlla_4k" / "rlla_sft.json")
    assert len(sft) == 400
    for task in sft:
        got = rewards(task["ground_truth"], task)
        want = MAXIMA if task["expected_calls"] else (0.0, 0.0, 0.0, 1.0)
        assert got == want, task.id


@needs_shared
@pytest.mark.parametrize(("level", "rows"), [(1, 399), (2, 67), (3, 131)])
def test_api_bank_reference_answers_score_the_maxima(level, rows):
    env = ToolCallEnv(dataset=f"api_bank_l{level}")
    assert len(env.task_ids) == rows
    for tid in env.task_ids:
        env.reset(options={"task_id": tid})
        _, reward, *_ , info = env.step(env.reference_action(tid)[0])
        assert tuple(reward.tolist()) == MAXIMA and info["exact"], tid
    obs, _ = env.reset(options={"task_id": env.task_ids[0]})
    assert obs["tools"] and all(t["name"] for t in obs["tools"])


@needs_shared
def test_reference_action_scores_the_maxima_on_every_shipped_set():
    for name in ("rlla_test", "rlla_sft"):
        env = ToolCallEnv(dataset=name)
        for tid in env.task_ids:
            env.reset(options={"task_id": tid})
            _, reward, *_ , info = env.step(env.reference_action(tid)[0])
            want = MAXIMA if info["expects_calls"] else (0.0, 0.0, 0.0, 1.0)
            assert tuple(reward.tolist()) == want, tid


@needs_shared
def test_builtin_names_and_detection_agree():
    assert DATASETS.load("rlla_test").ids == DATASETS.load(DATA / "rlla_4k" / "test.jsonl").ids
    assert len(DATASETS.load("api_bank")) == 399 + 67 + 131
    assert DATASETS.load(DATA / "api_bank" / "level-2-api_processed.json").name == "api_bank_l2"


# -------------------------------------------------------------------- BFCL
def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def bfcl_dir(tmp_path: Path) -> Path:
    fn = {
        "name": "area.triangle",
        "description": "Area of a triangle.",
        "parameters": {
            "type": "dict",
            "properties": {"base": {"type": "integer"}, "height": {"type": "integer"}, "unit": {"type": "string"}},
            "required": ["base", "height"],
        },
    }
    _write_jsonl(
        tmp_path / "BFCL_v4_simple.json",
        [
            {"id": "simple_0", "question": [[{"role": "user", "content": "Base 10, height 5."}]], "function": [fn]},
            {"id": "simple_1", "question": [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Two triangles."}]], "function": [fn]},
            {"id": "simple_2", "question": [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]], "function": [fn]},
        ],
    )
    (tmp_path / "possible_answer").mkdir()
    _write_jsonl(
        tmp_path / "possible_answer" / "BFCL_v4_simple.json",
        [
            {"id": "simple_0", "ground_truth": [{"area.triangle": {"base": [10], "height": [5, 5.0], "unit": ["", "units"]}}]},
            {"id": "simple_1", "ground_truth": [{"area.triangle": {"base": [1], "height": [2]}}, {"area.triangle": {"base": [3], "height": [4]}}]},
            {"id": "simple_2", "ground_truth": [["area.triangle(base=1)"]]},
        ],
    )
    _write_jsonl(
        tmp_path / "BFCL_v4_irrelevance.json",
        [{"id": "irrelevance_0", "question": [[{"role": "user", "content": "Sing a song."}]], "function": [fn]}],
    )
    _write_jsonl(tmp_path / "BFCL_v4_unanswered.json", [{"id": "u_0", "question": [[{"role": "user", "content": "?"}]], "function": [fn]}])
    return tmp_path


def test_bfcl_folder_layout(bfcl_dir):
    env = ToolCallEnv(dataset=bfcl_dir)
    assert env.task_ids == ["bfcl_irrelevance/irrelevance_0", "bfcl_simple/simple_0", "bfcl_simple/simple_1"]
    obs, _ = env.reset(options={"task_id": "bfcl_simple/simple_1"})
    assert obs["tools"][0]["parameters"]["type"] == "object"
    assert "Be brief." in obs["messages"][0]["content"] and "area.triangle" in obs["messages"][0]["content"]
    assert [m["role"] for m in obs["messages"]] == ["system", "user"]
    for tid in env.task_ids:
        env.reset(options={"task_id": tid})
        _, reward, *_ , info = env.step(env.reference_action(tid)[0])
        assert tuple(reward.tolist()) == (MAXIMA if info["expects_calls"] else (0.0, 0.0, 0.0, 1.0))
    task = env.tasks.get("bfcl_simple/simple_0")
    # any accepted value matches; the optional unit may be left out or given
    assert rewards(render_answer([{"name": "area.triangle", "parameters": {"base": 10, "height": 5.0, "unit": "units"}}]), task) == MAXIMA
    # a value outside the accepted list: 1 of 2 values
    assert rewards(render_answer([{"name": "area.triangle", "parameters": {"base": 11, "height": 5}}]), task) == approx((0.5, 1.0, 0.0, 1.0))
    # one question file on its own, and format= naming
    assert len(DATASETS.load(bfcl_dir / "BFCL_v4_simple.json")) == 2
    assert len(DATASETS.load(bfcl_dir, format="bfcl", categories=["simple"])) == 2


def test_bfcl_folder_without_answers_is_rejected(tmp_path):
    (tmp_path / "possible_answer").mkdir()
    with pytest.raises(ValueError, match="no BFCL question file"):
        DATASETS.load(tmp_path)


def _bfcl_wheel() -> Path | None:
    wheels = sorted(Path(os.environ.get("BFCL_WHEEL_DIR", "/tmp/bfcl")).glob("bfcl_eval-*.whl"))
    return wheels[-1] if wheels else None


@pytest.mark.skipif(_bfcl_wheel() is None, reason="bfcl-eval wheel not downloaded (pip download --no-deps bfcl-eval -d /tmp/bfcl)")
def test_bfcl_wheel_data_reference_answers_score_the_maxima(tmp_path):
    with zipfile.ZipFile(_bfcl_wheel()) as zf:
        for name in zf.namelist():
            if name.startswith("bfcl_eval/data/") and name.count("/") <= 3 and name.endswith(".json"):
                if "/unused_datasets/" not in name and "/multi_turn_func_doc/" not in name:
                    zf.extract(name, tmp_path)
    data = tmp_path / "bfcl_eval" / "data"
    source = DATASETS.load(data)
    assert len(source) > 1000
    for task in source:
        calls = task["expected_calls"]
        answer = render_answer(calls) if calls else render_answer(response="No tool fits.")
        want = MAXIMA if calls else (0.0, 0.0, 0.0, 1.0)
        assert rewards(answer, task) == want, task.id
    assert parse_answer(render_answer(source[0]["expected_calls"])).errors == []


def test_bfcl_parallel_calls_count_in_any_order_as_bfcl_checks_them(tmp_path):
    """BFCL's parallel checker takes, for each expected call in turn, the first unused predicted
    call that passes it; the order of the calls does not matter. Other categories keep the order
    (``multiple``: as many calls as expected, the first checked against the first)."""
    fn = {"name": "stock.price", "description": "A price.", "parameters": {
        "type": "dict", "properties": {"ticker": {"type": "string"}, "market": {"type": "string"}},
        "required": ["ticker"]}}
    truth = [{"stock.price": {"ticker": ["ACME"], "market": ["", "NYSE"]}},
             {"stock.price": {"ticker": ["ACME"], "market": ["", "LSE"]}}]
    for category in ("parallel", "multiple"):
        _write_jsonl(tmp_path / f"BFCL_v4_{category}.json",
                     [{"id": f"{category}_0", "question": [[{"role": "user", "content": "ACME twice."}]], "function": [fn]}])
        (tmp_path / "possible_answer").mkdir(exist_ok=True)
        _write_jsonl(tmp_path / "possible_answer" / f"BFCL_v4_{category}.json", [{"id": f"{category}_0", "ground_truth": truth}])
    env = ToolCallEnv(dataset=tmp_path)
    in_order = [{"name": "stock.price", "parameters": {"ticker": "ACME"}},
                {"name": "stock.price", "parameters": {"ticker": "ACME", "market": "LSE"}}]
    swapped = in_order[::-1]
    # swapped: the first expected call (market NYSE or none) fails on the LSE call and passes on
    # the one without a market; the rewards' best-score matching alone pairs it with the LSE
    # call (a tie, the earlier call wins), so without BFCL's rule the answer is not exact
    parallel, multiple = env.tasks.get("bfcl_parallel/parallel_0"), env.tasks.get("bfcl_multiple/multiple_0")
    assert parallel["calls_in_any_order"] and not multiple["calls_in_any_order"]
    for task_id, want_swapped in (("bfcl_parallel/parallel_0", True), ("bfcl_multiple/multiple_0", False)):
        for calls, want in ((in_order, True), (swapped, want_swapped)):
            env.reset(options={"task_id": task_id})
            _, reward, *_, info = env.step(render_answer(calls))
            assert info["exact"] is want, (task_id, calls)
            assert (tuple(reward.tolist()) == MAXIMA) is want
    # the same answer scored directly: ordered by default
    expected = parallel["expected_calls"]
    assert not score_answer(render_answer(swapped), expected, False).exact
    assert score_answer(render_answer(swapped), expected, False, ordered=False).exact
    # an answer with a call BFCL would not accept stays wrong in any order
    wrong = [{"name": "stock.price", "parameters": {"ticker": "ACME", "market": "TSE"}}, in_order[0]]
    assert not score_answer(render_answer(wrong), expected, False, ordered=False).exact
