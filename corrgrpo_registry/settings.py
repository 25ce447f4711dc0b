"""The one way settings are declared, read, checked and described (standard library only).

Every setting of every command is a field of a plain dataclass, with its type, default, an
attribute docstring (its description) and, for numbers and lists, the allowed range and
length in the field's metadata (:func:`num_field`). On top of that:

* :func:`build` turns a mapping (a parsed YAML file with overrides) into the dataclass:
  unknown keys, keys that moved elsewhere, values of the wrong type and values not among
  a ``Literal``'s choices are errors;
* :func:`validate` checks every field against its range and length, recursing into
  sections, then runs the class's cross-field rules (a ``check_rules(self)`` method);
* :func:`describe` lists every setting with its type, default and description (what
  ``corrgrpo train --help`` and ``corrgrpo sft --help`` print).

Every error is a :class:`ConfigError` that carries the dotted key; the reader that knows
where each key came from (a file and line, or a command-line override) adds that
(``corrgrpo.trainer.config.load_settings``). Only the standard library is imported here, and the module
sits below ``corrgrpo_envs`` and ``trainer``: the loss module (torch and numpy only otherwise)
declares its options the same way, and each env declares its settings with it
(``corrgrpo_envs.toy.settings``) without importing the trainer.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import textwrap
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "ConfigError",
    "ENV_SECTION_KEYS",
    "env_constructor_kwargs",
    "Range",
    "Setting",
    "build",
    "describe",
    "field_docs",
    "num_field",
    "read_field",
    "read_options",
    "type_name",
    "validate",
    "written",
]


class ConfigError(ValueError):
    """A configuration key or value is not allowed; ``key`` is its dotted name (when known)."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Range:
    """Allowed values of a number: ``low <= x`` (or ``<``), ``x <= high`` (or ``<``), finite."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    note: str = ""

    def contains(self, x: float) -> bool:
        if not math.isfinite(x):
            return False
        if self.low is not None and (x <= self.low if self.low_open else x < self.low):
            return False
        return not (self.high is not None and (x >= self.high if self.high_open else x > self.high))

    def describe(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        text = " and ".join(parts) or "a finite number"
        return f"{text} {self.note}".strip()


def num_field(default: Any, range_: Range | None = None, *, length: int | None = None,
              min_length: int | None = None, choices: tuple[Any, ...] | None = None) -> Any:
    """A field with its allowed range (numbers, or every number of a list), list length, or
    allowed values (``choices``, for a field whose type is not a ``Literal``)."""
    meta = {"range": range_, "length": length, "min_length": min_length, "choices": choices}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


# ---------------------------------------------------------------------- reading
def type_name(tp: Any) -> str:
    """A type annotation in words (``one of 'a', 'b'``, ``integer or null``)."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    names = {bool: "true/false", int: "integer", float: "number", str: "string", Any: "any value"}
    if tp in names:
        return names[tp]
    if origin is not None:
        return {list: "list", dict: "mapping", Mapping: "mapping"}.get(origin, getattr(origin, "__name__", str(tp)))
    return getattr(tp, "__name__", str(tp))


#: Types whose values are taken as they are: the test, and the type in words.
_PLAIN: dict[Any, tuple[Any, str]] = {
    type(None): (lambda v: v is None, "null"),
    bool: (lambda v: isinstance(v, bool), "true or false"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    str: (lambda v: isinstance(v, str), "a string"),
}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; ints are accepted for floats."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise ConfigError(f"{key}: {value!r} is not allowed; allowed values: {type_name(tp)}", key)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                continue
        literal = [a for a in typing.get_args(tp) if typing.get_origin(a) is Literal]
        if literal and value is not None:
            return _coerce(value, literal[0], key)  # the Literal's message lists the values
        raise ConfigError(f"{key}: expected {type_name(tp)}, got {value!r}", key)
    if tp in _PLAIN:
        accepts, words = _PLAIN[tp]
        if accepts(value):
            return value
        raise ConfigError(f"{key}: expected {words}, got {value!r}", key)
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}", key)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}", key)
        (item_tp,) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}", key)
        return dict(value)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if isinstance(tp, type):  # a class (a Path, a TaskSource): a Python caller passes an instance
        if isinstance(value, tp):
            return value
        raise ConfigError(f"{key}: expected {type_name(tp)}, got {value!r}", key)
    raise ConfigError(f"{key}: unsupported type {tp}", key)


def check_moved(key: str, moved: Mapping[str, str]) -> None:
    """A key written where it does not belong names its home."""
    if key in moved:
        raise ConfigError(f"{key}: this setting belongs in {moved[key]}; set it there", key)


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def build(cls: type, data: Any, prefix: str = "", base: Any = None, moved: Mapping[str, str] | None = None) -> Any:
    """``cls`` from a mapping, its keys set over the default (``base``, default: the class's).

    A section's keys are set over the section's default object, so a command's own defaults
    for a shared section (e.g. sft's ``optim.lr``) stay in force. ``moved`` maps dotted keys
    written in the wrong place to where they belong. A field whose metadata has ``read`` (a
    function ``(value, key, moved) -> object``, see :func:`read_field`) is built by it.
    """
    moved = moved or {}
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}", prefix or None)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        full = _join(prefix, str(key))
        check_moved(full, moved)
        if key not in fields:
            allowed = sorted(name for name in fields if _join(prefix, name) not in moved)
            raise ConfigError(f"unknown key {full!r}; allowed keys: {', '.join(allowed)}", full)
        reader = fields[key].metadata.get("read")
        if reader is not None:  # a value whose type its own reader chooses (an env's settings by id)
            kwargs[key] = reader(value, full, moved)
        elif dataclasses.is_dataclass(hints[key]):
            section_base = getattr(base, key) if base is not None else _default(fields[key])
            kwargs[key] = build(hints[key], value, full, base=section_base, moved=moved)
        else:
            kwargs[key] = _coerce(value, hints[key], full)
    return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)


# --------------------------------------------------------------------- checking
def read_field(reader: Any, default_factory: Any, doc_type: str = "mapping") -> Any:
    """A field whose value :func:`build` gets from ``reader(value, key, moved)`` instead of from its
    annotation: a section whose class depends on a key inside it (the ``env:`` section's class
    is the settings class of its ``id``). :func:`describe` lists it as one setting of type
    ``doc_type``, its default given by the value's ``section()`` when it has one."""
    return field(default_factory=default_factory, metadata={"read": reader, "doc_type": doc_type})


def read_options(cls: type, data: Mapping[str, Any] | None, prefix: str, base: Any = None,
                 moved: Mapping[str, str] | None = None) -> Any:
    """``cls`` built from the options ``data`` over ``base`` and checked (keys under ``prefix``),
    remembering which keys were written (:func:`written`)."""
    data = dict(data or {})
    obj = validate(build(cls, data, prefix, base=base, moved=moved), prefix)
    object.__setattr__(obj, "_written", tuple(data))  # not a field: frozen classes too
    return obj


def written(obj: Any) -> dict[str, Any]:
    """The options of a :func:`read_options` object that were written (every field otherwise)."""
    names = getattr(obj, "_written", None)
    if names is None:
        names = [f.name for f in dataclasses.fields(obj)]
    return {name: getattr(obj, name) for name in names}


def _check_field(f: dataclasses.Field, value: Any, key: str) -> None:
    range_: Range | None = f.metadata.get("range")
    length, min_length = f.metadata.get("length"), f.metadata.get("min_length")
    if value is None:
        return
    choices = f.metadata.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(f"{key}: {value!r} is not allowed; allowed values: {', '.join(map(str, choices))}", key)
    if isinstance(value, list):
        if length is not None and len(value) != length:
            raise ConfigError(f"{key}: {value!r} has {len(value)} entries; allowed: exactly {length}", key)
        if min_length is not None and len(value) < min_length:
            raise ConfigError(f"{key}: {value!r} has {len(value)} entries; allowed: at least {min_length}", key)
    if range_ is None:
        return
    items = value if isinstance(value, list) else [value]
    for i, x in enumerate(items):
        where = f"{key}[{i}]" if isinstance(value, list) else key
        number = isinstance(x, (int, float)) and not isinstance(x, bool)
        if not number or not range_.contains(float(x)):
            raise ConfigError(f"{where}: {x!r} is out of range; allowed: {range_.describe()}", where)


def validate(obj: Any, prefix: str = "") -> Any:
    """Check every field of ``obj`` (and of its sections) against its range and length, then
    the class's cross-field rules (``check_rules()``, sections before their parent). Returns ``obj``."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            validate(value, _join(prefix, f.name))
        else:
            _check_field(f, value, _join(prefix, f.name))
    rules = getattr(obj, "check_rules", None)
    if rules is not None:
        rules()
    return obj


# ------------------------------------------------------------------- describing
@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass's fields (its bases' too), by field name."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


@dataclass
class Setting:
    """One setting as ``--help`` shows it."""

    key: str
    type: str
    default: Any
    description: str
    allowed: str = ""


def describe(obj: Any, prefix: str = "") -> list[Setting]:
    """Every setting of the dataclass object ``obj`` (its values are the defaults shown), sections
    flattened to dotted keys, in declaration order."""
    cls = type(obj)
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    out: list[Setting] = []
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), _join(prefix, f.name)
        if "read" in f.metadata:  # one setting: its keys depend on its value (env: by its id)
            default = value.section() if hasattr(value, "section") else value
            out.append(Setting(key, f.metadata["doc_type"], default, docs.get(f.name, "")))
            continue
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.extend(describe(value, key))
            continue
        range_ = f.metadata.get("range")
        allowed = range_.describe() if range_ is not None else ""
        if f.metadata.get("length"):
            allowed = f"{f.metadata['length']} entries, each {allowed}".strip(", ")
        if f.metadata.get("choices"):
            allowed = ", ".join(map(str, f.metadata["choices"]))
        kind = f.metadata.get("doc_type") or type_name(hints[f.name])
        out.append(Setting(key, kind, value, docs.get(f.name, ""), allowed))
    return out


#: Keys of a YAML ``env:`` section that are not the env's keyword arguments: the env's id and
#: the modules to import before resolving it.
ENV_SECTION_KEYS = ("id", "import")


def env_constructor_kwargs(section: Mapping[str, Any]) -> dict[str, Any]:
    """An ``env:`` section's keyword arguments for the env (:data:`ENV_SECTION_KEYS` left out)."""
    return {k: v for k, v in section.items() if k not in ENV_SECTION_KEYS}
