"""BFCL's verdict on an answer's tool calls, by the rules of its AST checker (bfcl-eval 2026.3.23).

The rules are written here from the checker's behaviour on BFCL's Python categories (every
category but ``simple_java`` and ``simple_javascript``, whose checker first converts string
arguments to Java or JavaScript values); ``tests/test_bfcl_agreement.py`` compares this verdict
with the checker itself on generated answers.

A BFCL task is its category, its function descriptions (JSON schemas in BFCL's spelling:
``integer``, ``float``, ``string``, ``boolean``, ``array``, ``tuple``, ``dict``, ``any``) and its
possible answer: one ``{function name: {parameter: [accepted values]}}`` per expected call,
where the accepted value ``""`` means the parameter may be left out.

Which calls are compared (by the category's name):

* ``parallel`` in it: as many calls as expected calls, in any order; each expected call in
  turn takes the first call not yet taken that passes it.
* else ``multiple`` in it: as many calls as expected calls; only the first call is checked,
  against the first expected call.
* else: exactly one call, checked against the task's first function.

A call passes an expected call when its name is the function's name, it gives every parameter
the function's schema lists as required, every parameter it gives is both in the schema and in
the possible answer, each given value passes (below), and every parameter of the possible
answer whose accepted values lack ``""`` is given.

A value, against the schema type ``T`` of its parameter and its accepted values:

* An integer given for a ``float`` parameter counts as that float. No other conversion: an
  integer parameter given ``5.0`` fails, a boolean is not an integer.
* Its type must be ``T`` exactly (``any`` means a string), or else the type of the first
  accepted value. For arrays and tuples the items are checked one level down the same way, and
  the check passes when some accepted value is not a list (for instance ``""``).
* When the first accepted value's type is not ``T`` (BFCL writes a variable's name as a
  string), the value must equal an accepted value (Python equality: ``1 == 1.0 == True``).
  Otherwise, by ``T``: a string must equal an accepted string after both are normalised (see
  :func:`normalise_string`); a list must equal an accepted list after its string items (not
  deeper ones) are normalised; a dict must match some accepted dict spec, which maps each key to
  its accepted values (normalised strings again, deeper values compared as they are; keys whose
  accepted values lack ``""`` must be present, no other key); an array of dicts must have as
  many dicts as some accepted list of specs, each matching its spec in order; anything else must
  equal an accepted value.

Where BFCL's checker raises an exception (an answer it cannot process, such as a non-dict item
where a list of dict specs is expected, or a schema without a known type), the run would stop;
the verdict here is "not accepted", with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["BFCL_VERSION", "normalise_string", "bfcl_verdict", "checks_python", "BfclFault"]

#: The bfcl-eval release whose checker these rules follow.
BFCL_VERSION = "2026.3.23"

#: BFCL's schema types and the JSON value types they stand for.
_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}
_SEQUENCE_TYPES = ("array", "tuple")
_IGNORED_IN_STRINGS = str.maketrans("", "", " ,./-_*^")


class BfclFault(Exception):
    """BFCL's checker would raise on this answer (the evaluation would stop); never accepted."""


def checks_python(category: str) -> bool:
    """Whether ``category`` is scored with the Python rules of this module."""
    return not category.endswith(("_java", "_javascript"))


def normalise_string(text: str) -> str:
    """A string as BFCL compares it: without spaces and ``, . / - _ * ^``, lower case, and
    single quotes written as double quotes."""
    return text.translate(_IGNORED_IN_STRINGS).lower().replace("'", '"')


def _normalised(value: Any) -> Any:
    return normalise_string(value) if type(value) is str else value


def _first_accepted_type(accepted: Any) -> type | None:
    return next((type(a) for a in accepted if a != ""), None)


def _positional(accepted: Any) -> list[Any]:
    """``accepted`` read item by item by position, as the checker reads it (a string by character)."""
    if isinstance(accepted, (list, str)):
        return list(accepted)
    if isinstance(accepted, dict) and not accepted:
        return []
    raise BfclFault(f"accepted value {accepted!r:.60} cannot be read by position")


def _contains(container: Any, item: Any) -> bool:
    if isinstance(container, (list, str, dict)):
        return item in container
    raise BfclFault(f"membership test on {type(container).__name__}")


# ------------------------------------------------------------------------------ values
def _items_have_types(value: list[Any], accepted: Sequence[Any], item_type: type) -> bool:
    for option in accepted:
        if type(option) is not list:
            return True
        option_type = _first_accepted_type(option)
        if all(
            type(x) is item_type or (option_type is not None and type(x) is option_type)
            for x in value
        ):
            return True
    return False


def _type_passes(
    value: Any, accepted: Sequence[Any], declared: type, item_type: type | None
) -> tuple[bool, bool]:
    """``(passes, as_literal)``; ``as_literal``: the value is compared by plain equality."""
    answer_type = _first_accepted_type(accepted)
    as_literal = answer_type is not None and answer_type is not declared
    if type(value) is declared:
        return item_type is None or _items_have_types(value, accepted, item_type), as_literal
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, as_literal


def _matches_spec(value: Any, spec: Any) -> bool:
    """A dict against one accepted dict spec ``{key: [accepted values]}``."""
    if not isinstance(value, dict):
        raise BfclFault(f"{type(value).__name__} where a dict is expected")
    passes = True
    for key, item in value.items():
        if not _contains(spec, key):
            passes = False
            break
        if not isinstance(spec, dict):
            raise BfclFault("dict checked against a spec that is not a dict")
        if _normalised(item) not in [_normalised(a) for a in _positional(spec[key])]:
            passes = False
            break
    if not isinstance(spec, dict):
        raise BfclFault("dict checked against a spec that is not a dict")
    for key, options in spec.items():
        if key not in value and not _contains(options, ""):
            return False
    return passes


def _matches_some_spec(value: Any, accepted: Sequence[Any]) -> bool:
    return any(_matches_spec(value, spec) for spec in accepted if spec != "")


def _matches_spec_list(value: list[Any], accepted: Sequence[Any]) -> bool:
    for option in accepted:
        if not isinstance(option, (list, str, dict)):
            raise BfclFault(f"length of {type(option).__name__}")
        if len(value) != len(option):
            continue
        specs = _positional(option)
        if all(spec != "" and _matches_spec(item, spec) for item, spec in zip(value, specs)):
            return True
    return False


def _matches_list(value: list[Any], accepted: Sequence[Any]) -> bool:
    options = [[_normalised(a) for a in _positional(option)] for option in accepted]
    return [_normalised(x) for x in value] in options


def _value_passes(
    param: str, value: Any, accepted: Sequence[Any], schema: Mapping[str, Any]
) -> bool:
    declared_name = schema.get("type") if isinstance(schema, Mapping) else None
    declared = _TYPES.get(declared_name) if isinstance(declared_name, str) else None
    if declared is None:
        raise BfclFault(f"parameter {param!r} has no known schema type ({declared_name!r})")
    item_type = None
    if declared_name in _SEQUENCE_TYPES:
        items = schema.get("items")
        item_name = items.get("type") if isinstance(items, Mapping) else None
        item_type = _TYPES.get(item_name) if isinstance(item_name, str) else None
        if item_type is None:
            raise BfclFault(f"parameter {param!r} has no known item type ({item_name!r})")
    if declared_name == "float" and type(value) is int:
        try:
            value = float(value)
        except OverflowError:
            raise BfclFault(f"integer for {param!r} too large for a float") from None
    passes, as_literal = _type_passes(value, accepted, declared, item_type)
    if not passes:
        return False
    if as_literal:
        return value in accepted
    if declared is dict:
        return _matches_some_spec(value, accepted)
    if declared is list and item_type is dict:
        return _matches_spec_list(value, accepted)
    if declared is str:
        return normalise_string(value) in [normalise_string(a) for a in accepted if type(a) is str]
    if declared is list:
        return _matches_list(value, accepted)
    return value in accepted


# ------------------------------------------------------------------------------- calls
def _call_passes(function: Any, call: Mapping[str, Any], expected: Mapping[str, Any]) -> bool:
    if not isinstance(function, Mapping):
        raise BfclFault("expected function has no description")
    try:
        name = function["name"]
        properties = function["parameters"]["properties"]
        required = function["parameters"]["required"]
        accepted_by_param = next(iter(expected.values()))
    except (KeyError, TypeError, StopIteration) as e:
        raise BfclFault(f"function description or answer lacks {e}") from None
    if call.get("name") != name:
        return False
    given = call.get("parameters") or {}
    if any(param not in given for param in required):
        return False
    for param, value in given.items():
        if param not in properties or param not in accepted_by_param:
            return False
        if not _value_passes(param, value, accepted_by_param[param], properties[param]):
            return False
    return all(
        param in given or _contains(accepted, "") for param, accepted in accepted_by_param.items()
    )


def _description(functions: Sequence[Any], expected: Mapping[str, Any]) -> Any:
    name = next(iter(expected), None)
    return next((f for f in functions if isinstance(f, Mapping) and f.get("name") == name), None)


def _verdict(
    calls: Sequence[Mapping[str, Any]],
    category: str,
    functions: Sequence[Any],
    answer: Sequence[Mapping[str, Any]],
) -> tuple[bool, str]:
    if "parallel" in category:
        if len(calls) != len(answer):
            return False, f"{len(calls)} calls for {len(answer)} expected"
        taken: set[int] = set()
        for i, expected in enumerate(answer):
            function = _description(functions, expected)
            match = next(
                (
                    j
                    for j in range(len(calls))
                    if j not in taken and _call_passes(function, calls[j], expected)
                ),
                None,
            )
            if match is None:
                return False, f"no call passes expected call {i} ({next(iter(expected), '')})"
            taken.add(match)
        return True, ""
    if "multiple" in category:
        if len(calls) != len(answer):
            return False, f"{len(calls)} calls for {len(answer)} expected"
        if not answer or not _call_passes(_description(functions, answer[0]), calls[0], answer[0]):
            return False, "the call does not pass the expected call"
        return True, ""
    if len(calls) != 1:
        return False, f"{len(calls)} calls for 1 expected"
    if not functions or not answer:
        raise BfclFault("task has no function or no answer")
    if not _call_passes(functions[0], calls[0], answer[0]):
        return False, "the call does not pass the expected call"
    return True, ""


def bfcl_verdict(
    calls: Sequence[Mapping[str, Any]] | None,
    category: str,
    functions: Sequence[Mapping[str, Any]],
    answer: Sequence[Mapping[str, Any]],
) -> tuple[bool, str]:
    """``(accepted, why not)`` for ``calls`` (``{"name", "parameters"}``; ``None``: the answer's
    calls could not be read) on a task of a Python ``category`` with its function descriptions
    and possible answer, as BFCL's AST checker decides. Never raises."""
    if calls is None:
        return False, "calls could not be read"
    try:
        return _verdict(calls, category, functions, answer)
    except BfclFault as e:
        return False, f"BFCL's checker cannot score this answer: {e}"
