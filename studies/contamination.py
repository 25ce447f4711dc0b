"""How much of an evaluation set a training stage has already seen: a contamination report.

For a training config (RL: the ``env`` section's tasks on ``train.split``; SFT with
``data.source: env``: the tasks on ``data.train_split``, the first ``data.max_examples``) and
evaluation sets of the tool-calling study (the names of ``studies.learning_toolcall``'s
``--data``, read the same way, optionally a seeded sample ``NAME=N`` drawn as the study draws
it), the overlap of

* **function names**: eval tools whose name a training tool has;
* **descriptions**: eval tools whose description (lowercased, spaces collapsed) a training
  tool has; *renamed* when no training tool with that description has the eval tool's name;
* **schemas**: eval tools with at least one parameter whose parameter schema equals a training
  tool's, parameter names left out (a renamed tool's parameters are renamed too): each
  parameter's schema (texts normalised as descriptions are, ``dict`` read as ``object``) and
  whether it is required, as a sorted list; ``renamed_same_schema``: a renamed tool whose
  schema equals that of a training tool with its description. Types are compared as spelled
  (``int`` is not ``integer``): the *exact* schema measure;
* **structures**: eval tools whose name and parameters equal a training tool's after
  normalisation (:func:`structure_key`): names lowercased, type names mapped to one spelling
  (``int``/``integer``, ``float``/``number``, ``str``/``string``, ``bool``/``boolean``,
  ``dict``/``object``, ``list``/``tuple``/``array``, Python spellings such as ``List[int]`` or
  ``str, optional`` read as the JSON-schema type), only the structure kept (each parameter's
  name, type, ``items`` and nested ``properties``, and the ``required`` names as a set, where
  both tools give one: a tool without a ``required`` list, as RLLA's are, matches either way):
  descriptions, defaults, enums and the rest dropped, parameter order ignored;
* **description texts**: eval tools with a text (the function's description or a parameter's,
  nested ones included) that a training tool also has word for word: *identical*, the whole
  text, lowercased with punctuation read as spaces, equal to one of a training tool's texts
  (function or parameter) of at least ``DESCRIPTION_MIN_WORDS`` (5) words; *n-gram*, a run of
  ``DESCRIPTION_NGRAM`` (10) consecutive words shared with one (a long sentence copied into a
  longer description);
* **questions**: eval tasks whose user turns, normalised (dialogue tags and the history header
  dropped, lowercased, punctuation to spaces), equal a training task's (*exact*), or share word
  5-gram shingles with one at Jaccard >= ``--near`` (default 0.8; *near*, exact included; text
  shorter than 5 words is one shingle). Candidates come from an inverted shingle index, so the
  cost grows with the shingles shared, not with train x eval;
* **answers**: eval tasks that expect calls whose expected calls (name and arguments, as a
  sorted list of canonical JSON: keys sorted, integral floats as integers) equal a training
  task's.

Tools count once per distinct name (names), (name, description) (descriptions, renamed; empty
descriptions left out), (name, schema) (schemas), structure key (structures) or (name,
description texts) (description texts; tools without texts left out); questions are shares of the eval tasks,
answers of the eval tasks that expect calls. :func:`overlap` is the computation over two
lists of :class:`TaskRecord`; the command loads, prints counts, shares and examples, and
``--json`` writes the report::

    python -m studies.contamination --train studies/configs/sft_rlla_smollm2.yaml \\
        --eval bfcl --eval rlla_test --eval api_bank_l1=100
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

NEAR_JACCARD = 0.8
SHINGLE_WORDS = 5
#: shortest description text whose identical copy counts (shorter ones are generic: "The city.")
DESCRIPTION_MIN_WORDS = 5
#: consecutive words a description text must share with a training tool's to count as copied
DESCRIPTION_NGRAM = 10
EXAMPLES = 3
_HISTORY_HEADER = "**Dialogue Records History**"
_TAG = re.compile(r"</?[a-z_]{1,20}>", re.IGNORECASE)
_NON_WORD = re.compile(r"[^0-9a-z]+")


@dataclass(frozen=True)
class TaskRecord:
    """What the overlap reads of a task: its id, user text, tools and expected calls."""

    task_id: str
    question: str
    tools: tuple[Mapping[str, Any], ...] = ()
    """``{"name", "description", "parameters"}`` JSON schemas."""
    calls: tuple[Mapping[str, Any], ...] = ()
    """Expected calls ``{"name", "parameters"}`` (empty: a task answered in words)."""


@dataclass
class Measure:
    """One overlap measure: matched eval items out of ``total``, and examples."""

    matched: int
    total: int
    examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def share(self) -> float:
        return 100.0 * self.matched / self.total if self.total else 0.0


# ------------------------------------------------------------------------ normalisation
def normalise_text(text: str) -> str:
    """Lowercase with runs of whitespace as one space (descriptions, texts inside schemas)."""
    return " ".join(str(text).lower().split())


def question_words(text: str) -> list[str]:
    """A question's words: history header and dialogue tags dropped, lowercased, punctuation
    read as spaces."""
    text = _TAG.sub(" ", text.replace(_HISTORY_HEADER, " ")).lower()
    return _NON_WORD.sub(" ", text).split()


def shingles(words: Sequence[str], size: int = SHINGLE_WORDS) -> frozenset[str]:
    """Word ``size``-grams of ``words`` (the whole text as one when it is shorter)."""
    if len(words) <= size:
        return frozenset([" ".join(words)]) if words else frozenset()
    return frozenset(" ".join(words[i:i + size]) for i in range(len(words) - size + 1))


def _canonical_schema(node: Any, key: str | None = None) -> Any:
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        required = node.get("required") if isinstance(node.get("required"), list) else []
        for k, v in node.items():
            if k == "properties" and isinstance(v, Mapping):
                # parameter names dropped: each parameter's schema, with whether it is required, sorted
                out[k] = sorted((json.dumps([p in required, _canonical_schema(s)], sort_keys=True, default=str)
                                 for p, s in v.items()))
            elif k != "required":
                out[str(k)] = _canonical_schema(v, str(k))
        return out
    if isinstance(node, list):
        return [_canonical_schema(v) for v in node]
    if isinstance(node, str):
        return "object" if key == "type" and node == "dict" else normalise_text(node)
    return node


def schema_key(parameters: Any) -> str | None:
    """Canonical JSON of a tool's parameter schema with the parameter names left out (a renamed
    tool may have renamed parameters too): each parameter's schema and whether it is required,
    sorted. None when there are no parameters (an empty schema says nothing about a tool's
    origin)."""
    if not isinstance(parameters, Mapping) or not parameters.get("properties"):
        return None
    return json.dumps(_canonical_schema(parameters), sort_keys=True, default=str)


# one spelling per type: JSON schema's, for the spellings BFCL, RLLA and Python use
_TYPE_NAMES = {
    "int": "integer", "integer": "integer", "long": "integer", "float": "number", "double": "number",
    "number": "number", "str": "string", "string": "string", "bool": "boolean", "boolean": "boolean",
    "dict": "object", "object": "object", "mapping": "object", "list": "array", "array": "array",
    "tuple": "array", "sequence": "array", "set": "array", "any": "any", "none": "null", "null": "null",
}
_GENERIC = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*\[(.*)\]\s*$", re.DOTALL)


def _split_arguments(text: str) -> list[str]:
    """``"int, List[str]"`` -> ``["int", "List[str]"]`` (commas inside brackets kept)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def normalise_type(spec: Any) -> dict[str, Any]:
    """A type as written in a schema (``"int"``, ``"integer"``, ``"List[int]"``, ``"str, optional"``,
    ``["string", "null"]``) as ``{"type": ..., "items": ...}`` in JSON schema's spelling; a union
    is a sorted list of types; an unknown name is kept, lowercased."""
    if isinstance(spec, list):
        kinds = sorted({json.dumps(normalise_type(t), sort_keys=True) for t in spec})
        return json.loads(kinds[0]) if len(kinds) == 1 else {"type": [json.loads(k) for k in kinds]}
    text = str(spec).strip()
    if text.lower().endswith(", optional"):
        text = text[: -len(", optional")].strip()
    generic = _GENERIC.match(text)
    if generic:
        head, args = generic.group(1).split(".")[-1].lower(), _split_arguments(generic.group(2))
        if head == "optional" and len(args) == 1:
            return normalise_type(args[0])
        if head == "union":
            return normalise_type(args)
        kind = _TYPE_NAMES.get(head, head)
        if kind == "array" and args and all(a == args[0] for a in args if a != "..."):
            return {"type": "array", "items": normalise_type(args[0])}
        return {"type": kind}
    if "," in text:  # "int, float" written as a union
        return normalise_type(_split_arguments(text))
    lower = text.lower()
    return {"type": _TYPE_NAMES.get(lower, lower)}


def _structure(node: Any, top: bool = False, required: bool = True) -> dict[str, Any]:
    """A (parameter) schema's structure: its type in one spelling, its ``items``' and nested
    ``properties``' structure (names lowercased, order ignored), ``required`` as a sorted set of
    lowercased names. Descriptions, defaults, enums and every other key are left out. At the top
    (a tool's ``parameters``) the type is left out too: it is always an object. ``required=False``
    leaves the required lists out."""
    if not isinstance(node, Mapping):
        return {}
    out: dict[str, Any] = {} if top or "type" not in node else dict(normalise_type(node["type"]))
    items = node.get("items")
    if isinstance(items, Mapping):
        out["items"] = _structure(items, required=required)
    elif isinstance(items, list) and items:
        kinds = sorted({json.dumps(_structure(i, required=required), sort_keys=True) for i in items})
        out["items"] = json.loads(kinds[0]) if len(kinds) == 1 else [json.loads(k) for k in kinds]
    properties = node.get("properties")
    if isinstance(properties, Mapping) and properties:
        out["properties"] = {str(k).strip().lower(): _structure(v, required=required)
                             for k, v in properties.items()}
    names = node.get("required")
    if required and isinstance(names, list) and names:
        out["required"] = sorted({str(r).strip().lower() for r in names})
    return out


def structure_key(tool: Mapping[str, Any], required: bool = True) -> str:
    """Canonical JSON of a tool's lowercased name and its parameters' structure
    (:func:`_structure`): equal for the same function written with other type spellings,
    descriptions, defaults, parameter order or name case. ``required=False``: without the
    required lists."""
    return json.dumps([str(tool.get("name", "")).strip().lower(),
                       _structure(tool.get("parameters"), top=True, required=required)], sort_keys=True, default=str)


def states_required(tool: Mapping[str, Any]) -> bool:
    """Whether a tool's parameters give a non-empty ``required`` list (RLLA's tools give none:
    they say "optional" in a parameter's type, when they say anything)."""
    parameters = tool.get("parameters")
    return isinstance(parameters, Mapping) and bool(parameters.get("required"))


def description_texts(tool: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """A tool's description texts as (where, words joined by one space): the function's
    (``"function"``) and each parameter's (``"parameter <name>"``, nested ones too), lowercased
    with punctuation read as spaces; empty ones left out."""
    out: list[tuple[str, str]] = []

    def words(text: Any) -> str:
        return " ".join(_NON_WORD.sub(" ", str(text).lower()).split())

    def walk(node: Any, path: str) -> None:
        if not isinstance(node, Mapping):
            return
        properties = node.get("properties")
        if isinstance(properties, Mapping):
            for name, sub in properties.items():
                where = f"{path}.{name}" if path else str(name)
                if isinstance(sub, Mapping) and words(sub.get("description") or ""):
                    out.append((f"parameter {where}", words(sub["description"])))
                walk(sub, where)
        if isinstance(node.get("items"), Mapping):
            walk(node["items"], path)

    if words(tool.get("description") or ""):
        out.append(("function", words(tool["description"])))
    walk(tool.get("parameters"), "")
    return tuple(out)


def _ngrams(text: str, size: int) -> set[str]:
    words = text.split()
    return {" ".join(words[i:i + size]) for i in range(len(words) - size + 1)}


def _canonical_value(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): _canonical_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical_value(v) for v in value]
    return value


def answer_key(calls: Iterable[Mapping[str, Any]]) -> str | None:
    """Canonical JSON of the expected calls (their order ignored); None when there are none."""
    canon = sorted(json.dumps({"name": c.get("name"), "arguments": _canonical_value(c.get("parameters") or {})},
                              sort_keys=True, default=str) for c in calls)
    return json.dumps(canon) if canon else None


def _tool_id(tool: Mapping[str, Any]) -> tuple[str, str, str | None]:
    return (str(tool.get("name", "")), normalise_text(tool.get("description") or ""),
            schema_key(tool.get("parameters")))


# ----------------------------------------------------------------------------- overlap
def _tool_measures(train: Sequence[TaskRecord], evals: Sequence[TaskRecord]) -> dict[str, Measure]:
    train_tools = {_tool_id(t) for r in train for t in r.tools}
    names = {n for n, _, _ in train_tools}
    by_description: dict[str, set[str]] = defaultdict(set)
    schemas_of: dict[str, set[str]] = defaultdict(set)
    by_schema: dict[str, set[str]] = defaultdict(set)
    for name, desc, schema in train_tools:
        if desc:
            by_description[desc].add(name)
            schemas_of[desc].add(schema or "")
        if schema:
            by_schema[schema].add(name)
    eval_tools = [_tool_id(t) for r in evals for t in r.tools]
    eval_names = sorted({n for n, _, _ in eval_tools})
    described = sorted({(n, d) for n, d, _ in eval_tools if d})
    schemas_here: dict[tuple[str, str], set[str]] = defaultdict(set)
    for n, d, s in eval_tools:
        schemas_here[(n, d)].add(s or "")
    with_schema = sorted({(n, s) for n, _, s in eval_tools if s})
    out = {"names": Measure(0, len(eval_names)), "schemas": Measure(0, len(with_schema)),
           **{k: Measure(0, len(described)) for k in ("descriptions", "renamed", "renamed_same_schema")}}

    def hit(key: str, example: dict[str, Any]) -> None:
        out[key].matched += 1
        if len(out[key].examples) < EXAMPLES:
            out[key].examples.append(example)

    for name in eval_names:
        if name in names:
            hit("names", {"eval_name": name})
    for name, desc in described:
        train_names = by_description.get(desc)
        if not train_names:
            continue
        example = {"eval_name": name, "train_names": sorted(train_names)[:5], "description": desc[:120]}
        hit("descriptions", example)
        if name not in train_names:
            hit("renamed", example)
            if (schemas_here[(name, desc)] - {""}) & schemas_of[desc]:
                hit("renamed_same_schema", example)
    for name, schema in with_schema:
        if schema in by_schema:
            hit("schemas", {"eval_name": name, "train_names": sorted(by_schema[schema])[:5]})
    return out


def _normalised_measures(train: Sequence[TaskRecord], evals: Sequence[TaskRecord]) -> dict[str, Measure]:
    """``structures`` (same name and parameters after normalisation) and the description texts a
    training tool has word for word (``description_identical``, ``description_ngram``)."""
    train_tools = [t for r in train for t in r.tools]
    # a tool without a required list says nothing about which parameters are required: it
    # matches a tool with the same structure whatever the other's required list
    structures: dict[str, str] = {}
    loose: dict[str, str] = {}
    loose_unstated: dict[str, str] = {}
    for t in train_tools:
        name = str(t.get("name", ""))
        structures.setdefault(structure_key(t), name)
        loose.setdefault(structure_key(t, required=False), name)
        if not states_required(t):
            loose_unstated.setdefault(structure_key(t, required=False), name)
    whole: dict[str, tuple[str, str]] = {}
    grams: dict[str, tuple[str, str]] = {}
    for t in train_tools:
        for where, text in description_texts(t):
            if len(text.split()) >= DESCRIPTION_MIN_WORDS:
                whole.setdefault(text, (str(t.get("name", "")), where))
            for g in _ngrams(text, DESCRIPTION_NGRAM):
                grams.setdefault(g, (str(t.get("name", "")), where))
    eval_tools = [t for r in evals for t in r.tools]
    by_key: dict[str, tuple[str, str, bool]] = {}
    for t in sorted(eval_tools, key=lambda t: str(t.get("name", ""))):
        by_key.setdefault(structure_key(t), (str(t.get("name", "")), structure_key(t, required=False),
                                             states_required(t)))
    texts = {(str(t.get("name", "")), description_texts(t)) for t in eval_tools}
    texts = sorted(t for t in texts if t[1])
    out = {"structures": Measure(0, len(by_key)), "description_identical": Measure(0, len(texts)),
           "description_ngram": Measure(0, len(texts))}

    def hit(key: str, example: dict[str, Any]) -> None:
        out[key].matched += 1
        if len(out[key].examples) < EXAMPLES:
            out[key].examples.append(example)

    for key, (name, key_loose, stated) in sorted(by_key.items(), key=lambda kv: kv[1][0]):
        train_name = structures.get(key) or loose_unstated.get(key_loose) or (None if stated else loose.get(key_loose))
        if train_name is not None:
            hit("structures", {"eval_name": name, "train_name": train_name})
    for name, tool_texts in texts:
        same = next(((w, x) for w, x in tool_texts if x in whole), None)
        if same is not None:
            hit("description_identical", {"eval_name": name, "eval_text": same[0], "train": list(whole[same[1]]),
                                          "text": same[1][:120]})
        shared = next(((w, g) for w, x in tool_texts for g in sorted(_ngrams(x, DESCRIPTION_NGRAM)) if g in grams),
                      None)
        if shared is not None:
            hit("description_ngram", {"eval_name": name, "eval_text": shared[0], "train": list(grams[shared[1]]),
                                      "words": shared[1]})
    return out


def _question_measures(train: Sequence[TaskRecord], evals: Sequence[TaskRecord],
                       near: float) -> dict[str, Measure]:
    train_words = [question_words(r.question) for r in train]
    exact_index = {" ".join(w): i for i, w in enumerate(train_words) if w}
    train_shingles = [shingles(w) for w in train_words]
    index: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(train_shingles):
        for g in s:
            index[g].append(i)
    exact, close = Measure(0, len(evals)), Measure(0, len(evals))
    for r in evals:
        words = question_words(r.question)
        own = shingles(words)
        if not own:
            continue
        shared = Counter(i for g in own for i in index.get(g, ()))
        best, best_j = None, 0.0
        for i, n in shared.items():
            jaccard = n / (len(own) + len(train_shingles[i]) - n)
            if jaccard > best_j:
                best, best_j = i, jaccard
        j = exact_index.get(" ".join(words))
        if j is not None:
            best, best_j = j, 1.0
            exact.matched += 1
            if len(exact.examples) < EXAMPLES:
                exact.examples.append({"eval_id": r.task_id, "train_id": train[j].task_id,
                                       "question": " ".join(words)[:160]})
        if best is not None and best_j >= near:
            close.matched += 1
            if len(close.examples) < EXAMPLES:
                close.examples.append({"eval_id": r.task_id, "train_id": train[best].task_id,
                                       "jaccard": round(best_j, 3), "eval": " ".join(words)[:160],
                                       "train": " ".join(train_words[best])[:160]})
    return {"questions_exact": exact, "questions_near": close}


def _answer_measure(train: Sequence[TaskRecord], evals: Sequence[TaskRecord]) -> Measure:
    seen: dict[str, str] = {}
    for r in train:
        key = answer_key(r.calls)
        if key is not None:
            seen.setdefault(key, r.task_id)
    with_calls = [r for r in evals if r.calls]
    out = Measure(0, len(with_calls))
    for r in with_calls:
        train_id = seen.get(answer_key(r.calls) or "")
        if train_id is not None:
            out.matched += 1
            if len(out.examples) < EXAMPLES:
                out.examples.append({"eval_id": r.task_id, "train_id": train_id,
                                     "calls": json.loads(answer_key(r.calls) or "[]")})
    return out


def overlap(train: Sequence[TaskRecord], evals: Sequence[TaskRecord],
            near: float = NEAR_JACCARD) -> dict[str, Measure]:
    """The overlap of ``evals`` with ``train``: tool ``names``, ``descriptions`` (``renamed``:
    a shared description under a name no training tool with it has; ``renamed_same_schema``:
    such a tool whose schema also equals that training tool's), ``schemas`` (exact spelling),
    ``structures`` (name and parameters after normalisation), ``description_identical`` and
    ``description_ngram`` (description texts shared word for word), ``questions_exact``, ``questions_near`` (Jaccard of word 5-gram shingles >= ``near``) and
    ``answers`` (identical expected calls), each a :class:`Measure` (see the module doc)."""
    if not 0.0 < near <= 1.0:
        raise ValueError(f"near must be in (0, 1], got {near}")
    return {**_tool_measures(train, evals), **_normalised_measures(train, evals),
            **_question_measures(train, evals, near),
            "answers": _answer_measure(train, evals)}


# ------------------------------------------------------------------------------ loading
def task_record(task: Any) -> TaskRecord:
    """A tool-calling env task (:mod:`corrgrpo_envs.toolcall.datasets`) as a :class:`TaskRecord`."""
    users = [str(m.get("content") or "") for m in task.data.get("messages", []) if m.get("role") != "system"]
    return TaskRecord(task.id, "\n".join(users), tuple(task.data.get("tools") or ()),
                      tuple(task.data.get("expected_calls") or ()))


def _source_tasks(env: Any, split: str) -> list[Any]:
    """The tasks of the env settings ``env`` (a config's ``env``) on ``split``."""
    import corrgrpo_envs

    # each data set's own prompts: the user turns as shipped, whatever layout training used
    made = corrgrpo_envs.make(env, split=split, prompt_format="source")
    try:
        return list(made.unwrapped.tasks)
    finally:
        made.close()


def train_records(config: Path) -> tuple[list[TaskRecord], str]:
    """The tasks a training config's stage trains on, and a line saying which."""
    from corrgrpo_registry.yaml_files import load_yaml

    raw = load_yaml(config)
    if not isinstance(raw, dict) or not isinstance(raw.get("env"), dict) or "id" not in raw["env"]:
        raise SystemExit(f"--train {config}: no env section with an id (a tool-calling RL or SFT config)")
    if "ToolCall" not in str(raw["env"]["id"]):
        raise SystemExit(f"--train {config}: env.id {raw['env']['id']!r} is not the tool-calling env")
    data = raw.get("data")
    if isinstance(data, dict) and ({"source", "train_split", "files"} & set(data)):  # an SFT config
        from corrgrpo.trainer.sft import load_sft_config

        sft = load_sft_config(config)
        if sft.data.source != "env":
            raise SystemExit(f"--train {config}: data.source={sft.data.source!r}; only data.source=env is read")
        tasks = _source_tasks(sft.env, sft.data.train_split)[: sft.data.max_examples or None]
        what = f"SFT, env.dataset={sft.env.dataset!r} split {sft.data.train_split}"
    else:
        from corrgrpo.trainer.config import load_config

        cfg = load_config(config)
        tasks = _source_tasks(cfg.env, cfg.train.split)
        what = f"RL, env.dataset={cfg.env.dataset!r} split {cfg.train.split}"
    return [task_record(t) for t in tasks], f"{what}: {len(tasks)} tasks"


def eval_records(name: str, n: int | None, eval_config: Path, out: Path, seed: int = 0) -> list[TaskRecord]:
    """Evaluation set ``name`` as ``studies.learning_toolcall`` builds it, sampled as it samples."""
    from studies.learning_toolcall import data_config, data_env, sample_ids

    cfg, split = data_config(eval_config, name, out, ["env.prompt_format=source"])
    env = data_env(cfg, split)
    try:
        tasks = {t.id: t for t in env.tasks}
    finally:
        env.close()
    return [task_record(tasks[i]) for i in sample_ids(list(tasks), n, seed)]


# ------------------------------------------------------------------------------- report
LABELS = {
    "names": "function names shared", "descriptions": "descriptions shared",
    "renamed": "  of them renamed", "renamed_same_schema": "    renamed, identical schema",
    "schemas": "schemas shared (>= 1 parameter)",
    "structures": "name + parameters, normalised",
    "description_identical": f"description text identical (>= {DESCRIPTION_MIN_WORDS} w)",
    "description_ngram": f"description {DESCRIPTION_NGRAM}-word run shared",
    "questions_exact": "questions, exact",
    "questions_near": "questions, near (incl. exact)", "answers": "answers (expected calls) identical",
}
UNITS = {"names": "names", "descriptions": "tools", "renamed": "tools", "renamed_same_schema": "tools",
         "schemas": "tools", "structures": "tools", "description_identical": "tools",
         "description_ngram": "tools", "questions_exact": "tasks", "questions_near": "tasks", "answers": "call tasks"}


def format_report(name: str, measures: Mapping[str, Measure], seconds: float, examples: bool = True) -> str:
    lines = [f"{name}:"]
    for key, label in LABELS.items():
        m = measures[key]
        lines.append(f"  {label:<36} {m.matched:>5} / {m.total:<5} {UNITS[key]:<10} {m.share:5.1f} %")
        if examples:
            lines += [f"      e.g. {json.dumps(e, default=str)[:220]}" for e in m.examples]
    lines.append(f"  (overlap computed in {seconds:.2f} s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from studies.learning_toolcall import BFCL_SETS, DEFAULT_CONFIG, FIXED_SETS, name_value_pairs

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", type=Path, required=True, help="training config (RL or SFT, tool-calling env)")
    parser.add_argument("--eval", action="append", required=True, metavar="NAME[=N]",
                        help=f"evaluation set ({', '.join([*FIXED_SETS, *BFCL_SETS])}), "
                             "optionally N tasks sampled as the study samples them (0: all)")
    parser.add_argument("--eval-config", type=Path, default=DEFAULT_CONFIG,
                        help="config the evaluation sets are read with (the generator's options)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the eval samples (the study's --seed)")
    parser.add_argument("--near", type=float, default=NEAR_JACCARD, help="Jaccard threshold of a near question")
    parser.add_argument("--json", type=Path, default=None, help="write the report as JSON here")
    parser.add_argument("--no-examples", action="store_true", help="counts and shares only")
    args = parser.parse_args(argv)
    if not 0.0 < args.near <= 1.0:
        raise SystemExit(f"--near {args.near}: expected a number in (0, 1]")
    evals = []
    for value in args.eval:
        if "=" in value:
            (name, n), = name_value_pairs([value], "--eval")
            if not n.isdigit():
                raise SystemExit(f"--eval {value!r}: N must be a whole number")
            evals.append((name, int(n) or None))
        else:
            evals.append((value, None))
    train, what = train_records(args.train)
    print(f"train: {args.train} ({what})")
    report: dict[str, Any] = {"train": str(args.train), "train_tasks": len(train), "near_jaccard": args.near,
                              "eval": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, n in evals:
            try:
                records = eval_records(name, n, args.eval_config, Path(tmp), args.seed)
            except (ValueError, FileNotFoundError) as e:
                raise SystemExit(f"--eval {name}: {e}") from None
            t0 = time.perf_counter()
            measures = overlap(train, records, args.near)
            seconds = time.perf_counter() - t0
            label = f"{name} ({len(records)} tasks{'' if n is None else f', sample seed {args.seed}'})"
            print(format_report(label, measures, seconds, not args.no_examples), flush=True)
            report["eval"][name] = {"tasks": len(records), "sample": n, "seconds": seconds,
                                    **{k: {**asdict(m), "share": m.share} for k, m in measures.items()}}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
