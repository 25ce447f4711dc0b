"""The tool-call env's BFCL verdict (``info["exact"]``) equals BFCL's own AST checker.

Answers are generated from BFCL's question and answer files (six Python categories), with a
seed: correct answers (the first accepted values, and random accepted values), and answers
perturbed in their values, types, case and punctuation, parameters (missing, extra, empty
lists), functions (wrong names, calls dropped or repeated), order (parallel calls shuffled),
and dict specs written literally. Each answer is scored by the env and by BFCL's checker in
the bfcl-eval venv (``scripts/bfcl_venv.sh`` builds ``.venv-bfcl``; the checker runs in
``tests/bfcl_reference_checker.py``). The BFCL data files come from the bfcl-eval wheel
(``$BFCL_WHEEL_DIR``, default ``.cache/bfcl``; ``scripts/test.sh`` downloads it). Without the
wheel or the venv these tests skip with one message saying how to get both; under ``CI=true``
they fail with it instead (:mod:`tests.ci`).
"""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
import time
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.ci import unavailable

ROOT = Path(__file__).resolve().parents[1]
BFCL_PYTHON = ROOT / ".venv-bfcl" / "bin" / "python"
CHECKER = ROOT / "tests" / "bfcl_reference_checker.py"
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple")
SEED = 37
#: perturbed answers per task, besides the one with the first accepted values
KINDS_PER_TASK = 4
COMBINED_PER_TASK = 1

Call = dict[str, Any]
_OMIT = object()


def _wheel() -> Path | None:
    wheels = sorted(Path(os.environ.get("BFCL_WHEEL_DIR", ROOT / ".cache" / "bfcl")).glob("bfcl_eval-*.whl"))
    return wheels[-1] if wheels else None


INSTALL = ("pip download --no-deps bfcl-eval==2026.3.23 -d .cache/bfcl, then bash scripts/bfcl_venv.sh "
           "(scripts/test.sh does both)")


def _skip_reason(venv: bool = True) -> str | None:
    """What is missing of the BFCL wheel and (``venv``) BFCL's checker venv, and how to get both;
    None when nothing is."""
    missing = []
    if _wheel() is None:
        missing.append(f"the bfcl-eval wheel in {os.environ.get('BFCL_WHEEL_DIR', '.cache/bfcl')}")
    if venv and not BFCL_PYTHON.exists():
        missing.append(f"BFCL's checker venv {BFCL_PYTHON.parent.parent}")
    return f"missing {' and '.join(missing)}; to install: {INSTALL}" if missing else None


def require_bfcl(venv: bool = True) -> None:
    """Skip when the wheel or (``venv``) the checker venv is missing; fail under CI."""
    reason = _skip_reason(venv)
    if reason is not None:
        unavailable(reason)


# ----------------------------------------------------------------------------- BFCL data
def extract_bfcl(target: Path, categories: tuple[str, ...] = CATEGORIES) -> Path:
    """The categories' question files and possible answers, out of the wheel into ``target``."""
    wheel = _wheel()
    assert wheel is not None
    with zipfile.ZipFile(wheel) as zf:
        for category in categories:
            for sub in ("", "possible_answer/"):
                dest = target / sub / f"BFCL_v4_{category}.json"
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(zf.read(f"bfcl_eval/data/{sub}BFCL_v4_{category}.json"))
    return target


def read_bfcl(folder: Path, category: str) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(question, ground truth) pairs of one category, in file order."""
    def rows(path: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    truth = {r["id"]: r["ground_truth"] for r in rows(folder / "possible_answer" / f"BFCL_v4_{category}.json")}
    return [(q, truth[q["id"]]) for q in rows(folder / f"BFCL_v4_{category}.json")]


# ------------------------------------------------------------------------- answer generation
def _schema(functions: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next((f for f in functions if f["name"] == name), {"parameters": {"properties": {}}})


def _properties(functions: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return _schema(functions, name)["parameters"].get("properties", {})


def _accepted(rng: random.Random, options: list[Any], prop: dict[str, Any], first: bool) -> Any:
    """An accepted value of a parameter (BFCL's dict specs resolved), or _OMIT."""
    choices = [o for o in options if o != ""]
    if not choices or ("" in options and (first or rng.random() < 0.5)):
        return _OMIT
    value = copy.deepcopy(choices[0] if first else rng.choice(choices))
    if prop.get("type") == "dict" and isinstance(value, dict):
        return _resolve_spec(rng, value, first)
    if prop.get("type") == "array" and prop.get("items", {}).get("type") == "dict" and isinstance(value, list):
        return [_resolve_spec(rng, d, first) if isinstance(d, dict) else d for d in value]
    return value


def _resolve_spec(rng: random.Random, spec: dict[str, Any], first: bool) -> dict[str, Any]:
    out = {}
    for key, options in spec.items():
        value = _accepted(rng, options if isinstance(options, list) else [options], {}, first)
        if value is not _OMIT:
            out[key] = value
    return out


def correct_calls(rng: random.Random, functions: list[dict[str, Any]], truth: list[dict[str, Any]],
                  first: bool) -> list[Call]:
    """The calls of the ground truth with accepted values: the first ones (optional parameters
    left out) or random ones (optional parameters given half the time)."""
    calls = []
    for entry in truth:
        ((name, params),) = entry.items()
        props = _properties(functions, name)
        args = {}
        for key, options in params.items():
            value = _accepted(rng, options, props.get(key, {}), first)
            if value is not _OMIT:
                args[key] = value
        calls.append({"name": name, "parameters": args})
    return calls


def _leaves(value: Any, path: tuple = ()) -> list[tuple]:
    """Paths to every value inside ``value`` (itself included)."""
    out = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _leaves(v, (*path, i))
    return out


def _get(value: Any, path: tuple) -> Any:
    for step in path:
        value = value[step]
    return value


def _set(root: dict[str, Any], path: tuple, new: Any) -> None:
    target = root
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = new


def _string_variant(rng: random.Random, s: str) -> str:
    """The same string in other case, spacing or punctuation (BFCL ignores some of these)."""
    pos = rng.randint(0, len(s))
    return rng.choice([
        s.upper(), s.lower(), s.title(), s.swapcase(),
        s[:pos] + rng.choice(" ,./-_*^") + s[pos:],
        s[:pos] + rng.choice("!;:?()#+") + s[pos:],
        s.replace(" ", ""), s.replace(" ", rng.choice("_-")),
        s.replace("'", '"'), s.replace('"', "'"), " " + s + " ", s.replace(",", ""),
    ])


def _value_variant(rng: random.Random, v: Any) -> Any:
    """Another value of the same type."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + rng.choice([1, -1, 10])
    if isinstance(v, float):
        return rng.choice([v + 0.5, v * 2 + 1, round(v + 0.01, 2)])
    if isinstance(v, str):
        return rng.choice([v + "x", "other", v[::-1], v[:-1]])
    if isinstance(v, list):
        return rng.choice([v[:-1], v + v[:1], v[::-1]]) if v else ["x"]
    if isinstance(v, dict):
        if not v:
            return {"x": 1}
        key = rng.choice(list(v))
        return rng.choice([{k: x for k, x in v.items() if k != key}, {**v, key: _value_variant(rng, v[key])},
                           {**v, "extra": 1}])
    return "None"


def _type_variant(rng: random.Random, v: Any) -> Any:
    """The value written as another type (an integer as a float, a number as a string, ...)."""
    if isinstance(v, bool):
        return rng.choice([int(v), str(v).lower(), str(v)])
    if isinstance(v, int):
        return rng.choice([float(v), float(v), str(v), [v]])
    if isinstance(v, float):
        return rng.choice([int(v), str(v), int(v) if v.is_integer() else v + 0.0])
    if isinstance(v, str):
        options: list[Any] = [[v], {"value": v}, 0]
        try:
            options.append(int(v))
        except ValueError:
            pass
        try:
            options.append(float(v))
        except ValueError:
            pass
        return rng.choice(options)
    if isinstance(v, list):
        if v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            return rng.choice([[float(x) for x in v], [str(x) for x in v]])
        if v and all(isinstance(x, float) for x in v):
            return rng.choice([[int(x) for x in v], [str(x) for x in v]])
        return rng.choice([v[0] if v else "", json.dumps(v), {"items": v}, [json.dumps(x) for x in v]])
    if isinstance(v, dict):
        return rng.choice([[v], json.dumps(v)])
    return 0


def _value_of_type(rng: random.Random, prop: dict[str, Any]) -> Any:
    return {"string": "extra", "integer": rng.randint(0, 9), "float": 1.5, "boolean": True, "array": [],
            "tuple": [], "dict": {}}.get(prop.get("type"), "x")


def _pick_param(rng: random.Random, calls: list[Call]) -> tuple[Call, str] | None:
    given = [(c, k) for c in calls for k in c["parameters"]]
    return rng.choice(given) if given else None


def _perturb_leaf(rng: random.Random, calls: list[Call], change: Callable[[random.Random, Any], Any],
                  strings_only: bool = False) -> list[Call] | None:
    """``change`` applied to a parameter's value, or to a value inside it (list item, dict entry)."""
    spots = [(c, (k, *p)) for c in calls for k, v in c["parameters"].items() for p in _leaves(v)]
    if strings_only:
        spots = [(c, p) for c, p in spots if isinstance(_get(c["parameters"], p), str)]
    if not spots:
        return None
    if rng.random() < 0.5:  # favour whole parameter values
        top = [(c, p) for c, p in spots if len(p) == 1]
        spots = top or spots
    call, path = rng.choice(spots)
    _set(call["parameters"], path, change(rng, _get(call["parameters"], path)))
    return calls


def _missing(rng, calls, functions, truth):
    picked = _pick_param(rng, calls)
    if picked is None:
        return None
    call, key = picked
    del call["parameters"][key]
    return calls


def _extra(rng, calls, functions, truth):
    call = rng.choice(calls)
    props = _properties(functions, call["name"])
    unused = [k for k in props if k not in call["parameters"]]
    if unused and rng.random() < 0.75:
        key = rng.choice(unused)
        call["parameters"][key] = _value_of_type(rng, props[key])
    else:
        call["parameters"]["unlisted_option"] = 1
    return calls


def _empty_list(rng, calls, functions, truth):
    spots = [(c, k) for c in calls for k, p in _properties(functions, c["name"]).items()
             if p.get("type") in ("array", "tuple")]
    if not spots:
        return None
    call, key = rng.choice(spots)
    call["parameters"][key] = []
    return calls


def _wrong_function(rng, calls, functions, truth):
    call = rng.choice(calls)
    others = [f["name"] for f in functions if f["name"] != call["name"]]
    names = [call["name"] + "_v2", call["name"].upper()] + others
    if "." in call["name"]:
        names.append(call["name"].replace(".", "_"))
    call["name"] = rng.choice(names)
    return calls


def _call_count(rng, calls, functions, truth):
    i = rng.randrange(len(calls))
    if rng.random() < 0.5:
        return calls[:i] + calls[i + 1:]
    return calls[:i + 1] + [copy.deepcopy(calls[i])] + calls[i + 1:]


def _reorder(rng, calls, functions, truth):
    if len(calls) < 2:
        return None
    order = list(range(len(calls)))
    while order == sorted(order):
        rng.shuffle(order)
    return [calls[i] for i in order]


def _spec_literal(rng, calls, functions, truth):
    """A dict or list-of-dicts parameter written as the answer file's spec (each key's list of
    accepted values) instead of a value."""
    spots = []
    for call, entry in zip(calls, truth):
        ((name, params),) = entry.items()
        props = _properties(functions, name)
        for key, options in params.items():
            prop = props.get(key, {})
            nested = prop.get("type") == "dict" or prop.get("items", {}).get("type") == "dict"
            literal = [o for o in options if o != ""]
            if nested and literal and isinstance(literal[0], (dict, list)):
                spots.append((call, key, literal[0]))
    if not spots:
        return None
    call, key, literal = rng.choice(spots)
    call["parameters"][key] = copy.deepcopy(literal)
    return calls


def _unreadable(rng, calls, functions, truth):
    return "unreadable"


PERTURBATIONS: dict[str, Callable[..., Any]] = {
    "correct_random": lambda rng, calls, functions, truth: calls,
    "value": lambda rng, calls, functions, truth: _perturb_leaf(rng, calls, _value_variant),
    "type": lambda rng, calls, functions, truth: _perturb_leaf(rng, calls, _type_variant),
    "case_punctuation": lambda rng, calls, functions, truth: _perturb_leaf(rng, calls, _string_variant, True),
    "missing_parameter": _missing,
    "extra_parameter": _extra,
    "empty_list": _empty_list,
    "wrong_function": _wrong_function,
    "call_count": _call_count,
    "reorder": _reorder,
    "spec_literal": _spec_literal,
    "unreadable": _unreadable,
}


def generate_answers(folder: Path, seed: int = SEED) -> list[dict[str, Any]]:
    """Every task of the six categories: its first accepted answer, ``KINDS_PER_TASK`` answers
    each changed one way (distinct kinds, among those that apply), and ``COMBINED_PER_TASK``
    changed two ways. Items: ``{key, category, task, kind, calls}`` (``calls`` None: unreadable)."""
    rng = random.Random(seed)
    items: list[dict[str, Any]] = []

    def add(category: str, task: str, kind: str, calls: list[Call] | None) -> None:
        items.append({"key": len(items), "category": category, "task": task, "kind": kind, "calls": calls})

    for category in CATEGORIES:
        for question, truth in read_bfcl(folder, category):
            functions = question["function"]
            add(category, question["id"], "correct_first", correct_calls(rng, functions, truth, first=True))
            applicable = []
            for kind, change in PERTURBATIONS.items():
                trial = change(random.Random(0), correct_calls(random.Random(0), functions, truth, False),
                               functions, truth)
                if trial is not None:
                    applicable.append(kind)
            kinds = rng.sample(applicable, min(KINDS_PER_TASK, len(applicable)))
            kinds += ["+".join(rng.sample(applicable, 2)) for _ in range(COMBINED_PER_TASK)]
            for kind in kinds:
                calls: Any = correct_calls(rng, functions, truth, first=False)
                for part in kind.split("+"):
                    if calls == "unreadable" or not calls:
                        break
                    changed = PERTURBATIONS[part](rng, calls, functions, truth)
                    calls = calls if changed is None else changed
                add(category, question["id"], kind, None if calls == "unreadable" else calls)
    return items


#: Tasks no answer passes under BFCL's checker, so neither does the env's reference answer.
UNSATISFIABLE = {
    "live_simple_106-63-0": "accepted values [] for auto_loan_payment_start and bank_hours_start",
    "live_simple_112-68-0": "accepted values [] for five parameters",
    "live_multiple_862-181-3": "the answer expects journey_start_time, which the schema does not have",
    "live_multiple_964-207-0": "the schema requires statement, which the answer does not list",
}


def reference_items(folder: Path, first_key: int) -> list[dict[str, Any]]:
    """The env's reference answer (``reference_action``, the SFT target) of every task."""
    from corrgrpo_envs.toolcall.answer_format import parse_answer
    from corrgrpo_envs.toolcall.env import ToolCallEnv

    env = ToolCallEnv(dataset=folder)
    items = []
    for task_id in env.task_ids:
        category, task = task_id[len("bfcl_"):].split("/", 1)
        (text,) = env.reference_action(task_id)
        items.append({"key": first_key + len(items), "category": category, "task": task, "kind": "reference",
                      "calls": parse_answer(text).tool_calls})
    env.close()
    return items


# ------------------------------------------------------------------------------ the verdicts
def bfcl_verdicts(items: list[dict[str, Any]], timeout: float = 300.0) -> dict[int, dict[str, Any]]:
    """BFCL's checker on every item, in the bfcl-eval venv."""
    fields = ("key", "category", "task", "functions", "answer", "calls")
    lines = "".join(json.dumps({k: it[k] for k in fields if k in it}) + "\n" for it in items)
    done = subprocess.run([str(BFCL_PYTHON), str(CHECKER)], input=lines, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"BFCL checker failed ({done.returncode}): {done.stderr[-2000:]}")
    out = {}
    for line in done.stdout.splitlines():
        verdict = json.loads(line)
        out[verdict["key"]] = verdict
    return out


def env_verdicts(folder: Path, items: list[dict[str, Any]]) -> dict[int, bool]:
    """The env's ``info["exact"]`` for every item, each answer rendered in the RLLA format."""
    from corrgrpo_envs.toolcall.answer_format import render_answer
    from corrgrpo_envs.toolcall.env import ToolCallEnv

    env = ToolCallEnv(dataset=folder)
    out = {}
    for it in items:
        env.reset(options={"task_id": f"bfcl_{it['category']}/{it['task']}"})
        text = "<think> t </think>\n<tool_call>\n{not json\n</tool_call>" if it["calls"] is None \
            else render_answer(it["calls"])
        *_, info = env.step(text)
        out[it["key"]] = bool(info["exact"])
    env.close()
    return out


def agreement(items: list[dict[str, Any]], ours: dict[int, bool],
              theirs: dict[int, dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Per category (and ``all``): (answers whose verdicts agree, answers)."""
    counts: dict[str, list[int]] = {}
    for it in items:
        same = ours[it["key"]] == theirs[it["key"]]["valid"]
        for name in (it["category"], "all"):
            c = counts.setdefault(name, [0, 0])
            c[0] += same
            c[1] += 1
    return {k: (v[0], v[1]) for k, v in counts.items()}


# ------------------------------------------------------------------------------------- test
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_env_verdict_equals_bfcl_checker_on_generated_answers(tmp_path):
    require_bfcl()
    folder = extract_bfcl(tmp_path / "bfcl")
    t0 = time.perf_counter()
    items = generate_answers(folder)
    assert items == generate_answers(folder)  # deterministic with its seed
    items += reference_items(folder, len(items))
    t1 = time.perf_counter()
    theirs = bfcl_verdicts(items)
    t2 = time.perf_counter()
    ours = env_verdicts(folder, items)
    t3 = time.perf_counter()
    assert len(items) >= 10_000 and set(theirs) == set(ours) == {it["key"] for it in items}
    by_category = agreement(items, ours, theirs)
    print(f"\n{len(items)} answers: generated {t1 - t0:.1f} s, BFCL {t2 - t1:.1f} s, env {t3 - t2:.1f} s")
    for name, (same, n) in sorted(by_category.items()):
        print(f"  {name}: {same} / {n} agree ({100.0 * same / n:.2f} %)")

    # the answers are not trivial: every kind has answers BFCL accepts and answers it rejects
    valid = Counter((it["kind"].split("+")[0], theirs[it["key"]]["valid"]) for it in items)
    print("  BFCL verdicts by kind:", dict(sorted(valid.items())))
    # the env's reference answers are right by BFCL's rules, where any answer is
    refused = {it["task"] for it in items if it["kind"] == "reference" and not theirs[it["key"]]["valid"]}
    assert refused == set(UNSATISFIABLE)
    for kind in ("correct_first", "correct_random", "value", "type", "case_punctuation", "missing_parameter",
                 "extra_parameter", "empty_list", "wrong_function", "call_count", "reorder", "spec_literal"):
        assert valid[(kind, True)] + valid[(kind, False)] > 0, kind
    for kind in ("correct_random", "type", "case_punctuation", "missing_parameter", "extra_parameter",
                 "empty_list", "reorder"):
        assert valid[(kind, True)] > 0 and valid[(kind, False)] > 0, (kind, valid)
    assert set(by_category) == {*CATEGORIES, "all"}

    differ = [it for it in items if ours[it["key"]] != theirs[it["key"]]["valid"]]
    shown = "\n".join(
        f"{it['category']}/{it['task']} {it['kind']}: env {ours[it['key']]}, BFCL "
        f"{theirs[it['key']]['valid']} ({theirs[it['key']]['error_type']}) {json.dumps(it['calls'])[:300]}"
        for it in differ[:15])
    assert not differ, f"{len(differ)} verdicts differ:\n{shown}"


def _fn(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"name": name, "description": "", "parameters": {"type": "dict", "properties": properties,
                                                             "required": required}}


def _call(name: str, **parameters: Any) -> Call:
    return {"name": name, "parameters": parameters}


STR, INT, FLT, BOOL = {"type": "string"}, {"type": "integer"}, {"type": "float"}, {"type": "boolean"}
CITY = _fn("weather", {"city": STR, "days": INT, "scale": FLT, "metric": BOOL}, ["city"])
CITY_ANSWER = [{"weather": {"city": ["New York, NY"], "days": [5, ""], "scale": [2.0, ""], "metric": ["", True]}}]
LISTS = _fn("stats", {"values": {"type": "array", "items": FLT}, "tags": {"type": "array", "items": STR},
                      "grid": {"type": "array", "items": {"type": "array"}}, "pair": {"type": "tuple", "items": FLT}},
            ["values"])
LISTS_ANSWER = [{"stats": {"values": [[1.0, 2.5]], "tags": [["Big Apple", "x"], ""], "grid": [[["A b"]], ""],
                           "pair": [[1.0, 2.0], ""]}}]
ROWS = _fn("query", {"conditions": {"type": "array", "items": {"type": "dict", "properties": {}}},
                     "options": {"type": "dict", "properties": {}}, "deck": {"type": "array", "items": {"type": "dict"}}},
           ["conditions"])
ROWS_ANSWER = [{"query": {"conditions": [[{"field": ["Age"], "op": [">"], "note": ["", "x"]}]],
                          "options": [{"mode": ["Fast"], "inner": [{"k": ["v"]}], "eco": ["", False]}, ""],
                          "deck": [[{"rank": ["A"]}], ""]}}]
ODD = _fn("odd", {"when": {"type": "date"}, "items": {"type": "array"}, "code": INT, "free": {"type": "any"}}, [])
ODD_ANSWER = [{"odd": {"when": ["", "today"], "items": ["", ["a"]], "code": ["X_CODE", ""], "free": ["", "Any Thing"]}}]
REQUIRED = _fn("book", {"origin": STR, "seats": INT, "tags": {"type": "array", "items": STR}}, ["origin", "seats"])
REQUIRED_ANSWER = [{"book": {"origin": [""], "seats": [2, ""], "tags": []}}]

T, X = True, False  # BFCL's checker accepts / rejects (or cannot score) the case
HAND_MADE: list[tuple[str, dict[str, Any], list[dict[str, Any]], list[Call], bool]] = [
    # strings: case, spaces and , . / - _ * ^ are ignored, other punctuation is not; ' reads as "
    *[("simple", CITY, CITY_ANSWER, [_call("weather", city=c)], ok) for c, ok in (
        ("New York, NY", T), ("new york ny", T), ("NEW-YORK_NY", T), ("N.e.w/York*NY^", T),
        ("New York, NY!", X), ("New  York;NY", X), ("Nueva York", X))],
    ("simple", _fn("say", {"text": STR}, ["text"]), [{"say": {"text": ["it's"]}}], [_call("say", text='IT"S')], T),
    # numbers: an integer for a float counts, a float for an integer does not, booleans are not numbers
    *[("simple", CITY, CITY_ANSWER, [_call("weather", city="New York, NY", **kw)], ok) for kw, ok in (
        ({"days": 5}, T), ({"days": 5.0}, X), ({"days": True}, X), ({"scale": 2}, T), ({"scale": 2.0}, T),
        ({"scale": "2.0"}, X), ({"metric": True}, T), ({"metric": 1}, X), ({"metric": "true"}, X),
        ({"days": 5, "scale": 2, "metric": True}, T))],
    # missing and unexpected parameters, a name in other case
    ("simple", CITY, CITY_ANSWER, [_call("weather")], X),
    ("simple", CITY, CITY_ANSWER, [_call("weather", city="New York, NY", unit="C")], X),
    ("simple", CITY, CITY_ANSWER, [_call("Weather", city="New York, NY")], X),
    # lists: items checked one level down; string items normalised, deeper ones not
    *[("simple", LISTS, LISTS_ANSWER, [_call("stats", **kw)], ok) for kw, ok in (
        ({"values": [1.0, 2.5]}, T), ({"values": [1, 2.5]}, X), ({"values": [2.5, 1.0]}, X), ({"values": []}, X),
        ({"values": "1.0, 2.5"}, X), ({"values": [1.0, 2.5], "tags": ["big apple", "X"]}, T),
        ({"values": [1.0, 2.5], "tags": []}, T), ({"values": [1.0, 2.5], "tags": ["Big Apple"]}, X),
        ({"values": [1.0, 2.5], "grid": [["A b"]]}, T), ({"values": [1.0, 2.5], "grid": [["ab"]]}, X),
        ({"values": [1.0, 2.5], "grid": []}, T), ({"values": [1.0, 2.5], "pair": [1, 2]}, T),
        ({"values": [1.0, 2.5], "pair": [1.0, 2.0]}, T), ({"values": [1.0, 2.5], "tags": [1, "x"]}, X))],
    # dicts and lists of dicts: specs one level deep (0 == False there); the spec written as a value fails
    *[("simple", ROWS, ROWS_ANSWER, [_call("query", conditions=[{"field": "Age", "op": ">"}], **kw)], ok)
      for kw, ok in (
        ({"options": {"mode": "FAST", "inner": {"k": ["v"]}}}, T), ({"options": {"mode": "fast", "inner": {"k": "v"}}}, X),
        ({"options": {"mode": "fast", "inner": {"k": ["v"]}, "eco": 0}}, T), ({"options": {}}, X),
        ({"deck": []}, T), ({"deck": [{"rank": "a"}]}, T), ({"deck": ["A"]}, X))],
    *[("simple", ROWS, ROWS_ANSWER, [_call("query", conditions=c)], ok) for c, ok in (
        ([{"field": "age", "op": ">"}], T), ([{"field": "Age", "op": ">", "note": "X"}], T),
        ([{"field": ["Age"], "op": [">"]}], X), ([{"field": "Age"}], X), ([{"field": "Age", "op": ">", "other": 1}], X),
        ([], X), (["Age"], X), ({"field": "Age"}, X))],
    # schemas BFCL's checker cannot read, a variable name in the answer, "any"
    *[("simple", ODD, ODD_ANSWER, [_call("odd", **kw)], ok) for kw, ok in (
        ({}, T), ({"when": "today"}, X), ({"items": ["a"]}, X), ({"code": "x code"}, X), ({"code": "X_CODE"}, T),
        ({"code": 3}, X), ({"free": "anything"}, T), ({"free": 3}, X),
        ({"code": ""}, T), ({"free": " - "}, T))],  # "" (the "may be left out" mark) is itself accepted
    # required by the schema though the answer lets it out; no accepted value at all
    *[("simple", REQUIRED, REQUIRED_ANSWER, [_call("book", **kw)], X) for kw in (
        {"origin": "", "seats": 2}, {"origin": " - ", "seats": 2}, {"seats": 2}, {"origin": "", "tags": []},
        {"origin": "", "seats": 2, "tags": []}, {"origin": "", "seats": 2, "tags": ["a"]})],
    ("simple", REQUIRED, [{"book": {"origin": [""], "seats": [2, ""]}}], [_call("book", origin=" - ", seats=2)], T),
    # an integer no float can hold, for a float parameter
    ("simple", CITY, CITY_ANSWER, [_call("weather", city="New York, NY", scale=10 ** 400)], X),
    # call counts and order by category
    ("multiple", CITY, CITY_ANSWER, [_call("weather", city="NYC"), _call("weather", city="New York, NY")], X),
    ("multiple", CITY, CITY_ANSWER, [_call("weather", city="new york, ny")], T),
    ("simple", CITY, CITY_ANSWER, [_call("weather", city="New York, NY")] * 2, X),
    ("simple", CITY, CITY_ANSWER, [], X),
    ("parallel", CITY, CITY_ANSWER * 2,
     [_call("weather", city="new york ny", days=5), _call("weather", city="New York, NY")], T),
    ("parallel", CITY, [{"weather": {"city": ["Paris"]}}, {"weather": {"city": ["Rome"]}}],
     [_call("weather", city="rome"), _call("weather", city="PARIS")], T),
    ("parallel_multiple", CITY, [{"weather": {"city": ["Paris"]}}, {"weather": {"city": ["Rome"]}}],
     [_call("weather", city="rome"), _call("weather", city="rome")], X),
    # the checker fails on an earlier candidate: the whole verdict fails, though a later call passes
    ("parallel", ODD, [{"odd": {"code": ["X_CODE"], "when": [""]}}, {"odd": {"code": ["Y"], "when": [""]}}],
     [_call("odd", code="Y", when="now"), _call("odd", code="X_CODE")], X),
    ("parallel", ODD, [{"odd": {"code": ["X_CODE"], "when": [""]}}, {"odd": {"code": ["Y"], "when": [""]}}],
     [_call("odd", code="X_CODE"), _call("odd", code="Y")], T),
    ("parallel", CITY, [{"missing_fn": {"city": ["Paris"]}}], [_call("weather", city="Paris")], X),
]


def test_hand_made_edge_cases_get_the_verdicts_bfcl_gave_them():
    """Each rule of corrgrpo_envs/toolcall/bfcl_verdict.py on hand-made cases, with the verdicts
    BFCL's checker gives them (the next test checks those against the checker itself)."""
    from corrgrpo_envs.toolcall.bfcl_verdict import bfcl_verdict

    for category, fn, answer, calls, accepted in HAND_MADE:
        ok, why = bfcl_verdict(calls, category, [fn], answer)
        assert ok is accepted and (ok or why), (category, calls, why)
    assert 20 <= sum(case[-1] for case in HAND_MADE) <= len(HAND_MADE) - 20


def test_hand_made_edge_cases_get_bfcl_checkers_verdict():
    """The recorded verdicts of the hand-made cases are BFCL's checker's, including the answers
    it cannot score (it raises; the env says why it does not accept them)."""
    require_bfcl()
    from corrgrpo_envs.toolcall.bfcl_verdict import bfcl_verdict

    items = [{"key": i, "category": c, "functions": [f], "answer": a, "calls": calls}
             for i, (c, f, a, calls, _) in enumerate(HAND_MADE)]
    theirs = bfcl_verdicts(items, timeout=60)
    assert [theirs[i]["valid"] for i in range(len(items))] == [case[-1] for case in HAND_MADE]
    crashed = [k for k, v in theirs.items() if v["error_type"].startswith("crash")]
    assert len(crashed) >= 4
    for k in crashed:
        it = items[k]
        assert bfcl_verdict(it["calls"], it["category"], it["functions"], it["answer"])[1].startswith(
            "BFCL's checker cannot score"), it


# ------------------------------------------------------- reference answers, schemas, prompts
MAXIMA = (0.5, 1.0, 1.5, 1.0)


def test_reference_answers_are_right_by_bfcl_rules_and_score_the_maxima(tmp_path):
    require_bfcl(venv=False)
    from corrgrpo_envs.toolcall.env import ToolCallEnv

    env = ToolCallEnv(dataset=extract_bfcl(tmp_path / "bfcl"))
    refused = []
    for task_id in env.task_ids:
        env.reset(options={"task_id": task_id})
        _, reward, *_, info = env.step(env.reference_action(task_id)[0])
        assert tuple(reward.tolist()) == MAXIMA, task_id
        if not info["exact"]:
            refused.append(task_id.split("/", 1)[1])
    env.close()
    assert len(env.task_ids) == 2311 and sorted(refused) == sorted(UNSATISFIABLE)


def _bfcl_folder(tmp_path: Path, category: str, fn: dict[str, Any], truth: list[dict[str, Any]]) -> Path:
    (tmp_path / "possible_answer").mkdir(parents=True, exist_ok=True)
    question = {"id": f"{category}_0", "question": [[{"role": "user", "content": "Go."}]], "function": [fn]}
    (tmp_path / f"BFCL_v4_{category}.json").write_text(json.dumps(question) + "\n")
    (tmp_path / "possible_answer" / f"BFCL_v4_{category}.json").write_text(
        json.dumps({"id": f"{category}_0", "ground_truth": truth}) + "\n")
    return tmp_path


def test_list_of_dicts_reference_is_the_dicts_not_the_spec(tmp_path):
    from corrgrpo_envs.toolcall.answer_format import render_answer
    from corrgrpo_envs.toolcall.env import ToolCallEnv

    env = ToolCallEnv(dataset=_bfcl_folder(tmp_path, "simple_python", ROWS, ROWS_ANSWER))
    task_id = "bfcl_simple_python/simple_python_0"
    (call,) = env.tasks.get(task_id)["expected_calls"]
    assert call["parameters"] == {"conditions": [{"field": "Age", "op": ">"}]}
    spec = ROWS_ANSWER[0]["query"]["conditions"][0]
    for params, exact, values in (
        ({"conditions": [{"field": "Age", "op": ">"}]}, True, 1.5),
        ({"conditions": [{"field": "Age", "op": ">", "note": "x"}]}, True, 1.5),
        ({"conditions": [{"field": "age", "op": ">"}]}, True, -1.5),  # BFCL ignores case, the reward does not
        ({"conditions": spec}, False, -1.5),  # the spec written as a value
        ({"conditions": [{"field": "Age"}]}, False, -1.5),
    ):
        env.reset(options={"task_id": task_id})
        _, reward, *_, info = env.step(render_answer([{"name": "query", "parameters": params}]))
        assert info["exact"] is exact and reward[2] == values, params


def test_parameters_the_schema_requires_are_expected_and_shown_in_the_prompt(tmp_path):
    from corrgrpo_envs.toolcall.answer_format import render_answer
    from corrgrpo_envs.toolcall.datasets import bfcl_expected_call
    from corrgrpo_envs.toolcall.env import ToolCallEnv
    from corrgrpo_envs.toolcall.generator import generate_task
    from corrgrpo_envs.toolcall.prompts import system_prompt, tools_from_system_prompt

    call = bfcl_expected_call("book", {"origin": [""], "seats": [2, ""], "class": ["", "eco"]}, ["origin", "seats"])
    assert call["parameters"] == {"origin": "", "seats": 2} and call["optional"] == ["class"]
    env = ToolCallEnv(dataset=_bfcl_folder(tmp_path, "simple_python", REQUIRED,
                                           [{"book": {"origin": [""], "seats": [2, ""]}}]))
    task_id = "bfcl_simple_python/simple_python_0"
    system = env.tasks.get(task_id)["messages"][0]["content"]
    assert '\nRequired: ["origin", "seats"]\n' in system
    assert tools_from_system_prompt(system)[0]["parameters"]["required"] == ["origin", "seats"]
    for params, exact in (({"origin": "", "seats": 2}, True), ({"origin": ""}, False)):
        env.reset(options={"task_id": task_id})
        *_, info = env.step(render_answer([{"name": "book", "parameters": params}]))
        assert info["exact"] is exact, params
    # a schema without required parameters gets no line; the generator's own prompts stay as recorded
    assert "Required:" not in system_prompt([{"name": "f", "parameters": {"type": "object", "properties": {}}}])
    assert all("\nRequired: [" not in generate_task(0, i)["messages"][0]["content"] for i in range(20))


def _nested(depth: int) -> Any:
    value: Any = "x"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


HOSTILE_VALUES = [10 ** 4000, -(10 ** 400), float("nan"), float("inf"), None, "x" * 200_000, _nested(60),
                  [None] * 1000, {"": [""]}, [{"field": ["Age"]}] * 50, [[[]]], {"k": {"k": {"k": 1}}}, True, 1e308]


@pytest.mark.parametrize("category", ["simple_python", "parallel"])
def test_hostile_values_never_raise_and_are_never_accepted(tmp_path, category):
    from corrgrpo_envs.toolcall.answer_format import render_answer
    from corrgrpo_envs.toolcall.bfcl_verdict import bfcl_verdict
    from corrgrpo_envs.toolcall.env import ToolCallEnv

    env = ToolCallEnv(dataset=_bfcl_folder(tmp_path, category, ROWS, ROWS_ANSWER))
    task_id = f"bfcl_{category}/{category}_0"
    for fn, answer in ((ROWS, ROWS_ANSWER), (LISTS, LISTS_ANSWER), (CITY, CITY_ANSWER), (ODD, ODD_ANSWER)):
        for key in fn["parameters"]["properties"]:
            for value in HOSTILE_VALUES:
                calls = [_call(fn["name"], **{key: value})]
                assert bfcl_verdict(calls, category, [fn], answer)[0] is False, (key, str(value)[:40])
                assert bfcl_verdict(calls * 3, category, [fn], answer * 3)[0] is False
    for value in HOSTILE_VALUES:
        env.reset(options={"task_id": task_id})
        *_, info = env.step(render_answer([_call("query", conditions=value)]))
        assert info.get("exact", False) is False  # (an answer over the env's length limit has no verdict)


def test_skip_reason_names_what_is_missing_and_how_to_build_it():
    """The skip reason names what is missing and how to build it."""
    reason = _skip_reason()
    if reason is None:
        assert BFCL_PYTHON.exists() and _wheel() is not None
    else:
        assert "bfcl" in reason.lower() and "scripts/bfcl_venv.sh" in reason and "pip download" in reason


@pytest.mark.parametrize("ci", ["true", ""])
def test_missing_wheel_or_venv_fails_under_ci_and_skips_outside(tmp_path, monkeypatch, ci):
    """Under CI=true a missing wheel or checker venv is a failure, not a skip; outside CI a skip,
    both with the one message saying how to install them."""
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(sys.modules[__name__], "BFCL_PYTHON", tmp_path / ".venv-bfcl" / "bin" / "python")
    monkeypatch.setenv("BFCL_WHEEL_DIR", str(tmp_path / "no-wheels"))
    outcome = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(outcome) as raised:
        require_bfcl()
    message = str(raised.value)
    assert "bfcl-eval wheel" in message and str(tmp_path / ".venv-bfcl") in message
    assert INSTALL in message and message.startswith("CI: " if ci else "missing")
    with pytest.raises(outcome, match="bfcl-eval wheel") as raised:
        require_bfcl(venv=False)  # the wheel alone is asked for
    assert ".venv-bfcl" not in str(raised.value)


if __name__ == "__main__":  # the agreement figures without pytest: python tests/test_bfcl_agreement.py DIR
    target = extract_bfcl(Path(sys.argv[1]))
    generated = generate_answers(target)
    generated += reference_items(target, len(generated))
    ref = bfcl_verdicts(generated)
    env_side = env_verdicts(target, generated)
    for cat, (agree, total) in sorted(agreement(generated, env_side, ref).items()):
        print(f"{cat}: {agree} / {total} agree ({100.0 * agree / total:.2f} %)")
    kinds = [{**it, "category": it["kind"].split("+")[0]} for it in generated]
    for kind, (agree, total) in sorted(agreement(kinds, env_side, ref).items()):
        print(f"  kind {kind}: {agree} / {total} agree ({100.0 * agree / total:.2f} %)")
