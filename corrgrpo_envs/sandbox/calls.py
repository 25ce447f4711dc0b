"""Calls into a sandboxed program, and their results as plain data.

A judged program can ask the runner to call one of its functions on given
inputs instead of judging itself: the host puts a *calls directive* on the
program's first line (:func:`calls_program`), and after the program's module
code has run the runner evaluates the entry expression once, calls it on every
input in order and writes one record per call to its status channel:

* ``<token> R <i> <nodes>``: call ``i`` returned this value (plain data, below);
* ``<token> X <i> <ExceptionName>``: call ``i`` raised (the runner stops there);
* ``<token> P <i> <TypeName>``: call ``i`` returned something that is not plain data.

Plain data is ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes`` and
``list``/``tuple``/``dict``/``set``/``frozenset`` of plain data (exact types:
subclasses are not plain), plus instances of the few classes the task's own
prompt defines (LeetCode's ``ListNode``/``TreeNode``), carried as their class
name and attribute values. A value travels as a flat JSON list of nodes, each
child before its parent and referenced by its index, the root last
(``["I", "0x2a"]``, ``["L", [0, 1]]``, ``["O", "ListNode", [["val", 0]]]``...):
deep structures (a linked list of 10^5 nodes) need no recursion, shared
objects stay shared, and cycles are not plain.

The records are not trusted: the program can write any record it likes. The
host only ever parses them as data (``json.loads`` and :func:`decode`, no
``eval``, no pickle, bounded sizes), so a forged record is worth exactly what
an honest program returning that value would get. The size that bounds a
record is that of its value with shared nodes expanded, not its text's: a
hash, a comparison or a walk of the value costs that (see :data:`MAX_EXPANDED`).

The codec is one source text (:data:`PLAIN_SOURCE`): the runner carries it into
the sandbox (whose interpreter cannot import this package) and this module
executes the same text for the host.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

__all__ = [
    "CALLS_DIRECTIVE",
    "PLAIN_SOURCE",
    "CallRecord",
    "NotPlain",
    "OverBound",
    "calls_program",
    "channel_text",
    "decode",
    "encode",
    "parse_channel",
]

#: First-line prefix of a program that asks the runner to call its entry.
CALLS_DIRECTIVE = "#corrgrpo-calls "

#: Most nodes one value may have (bounds both sides' work on a forged record).
MAX_NODES = 1_000_000

#: Most nodes a decoded value may have with its shared nodes expanded (a string counts one
#: node per 16 characters), and the most expanded nodes hashed while building it (set items,
#: dict keys). Linear work on a value of this size takes ~0.1 s; an honest 1000 x 1000 grid
#: whose rows are one list is 10^6.
MAX_EXPANDED = 4_000_000

#: Most items of one container in a decoded value.
MAX_ITEMS = 1_000_000

#: Most items of one decoded set or dict that share one hash (an honest set has about one:
#: distinct values colliding by chance; a forged one has thousands, and building it is
#: quadratic in their number).
MAX_SAME_HASH = 8

PLAIN_SOURCE = r'''
class _PlainError(Exception):
    """The value is not plain data (the message names the offending type)."""

class _PlainBound(_PlainError):
    """The record is over a bound of the decode (its value would cost too much to build or use)."""

def _plain_encode(value, classes=(), max_nodes=1000000):
    # Iterative post-order walk: children get their node index before their parent.
    nodes = []
    index = {}
    active = set()
    stack = [(value, False)]
    while stack:
        obj, ready = stack.pop()
        key = id(obj)
        if not ready and key in index:
            continue
        kind = type(obj)
        if obj is None:
            node = ["N"]
        elif kind is bool:
            node = ["B", 1 if obj else 0]
        elif kind is int:
            node = ["I", int.__format__(obj, "#x")]
        elif kind is float:
            node = ["F", float.__repr__(obj)]
        elif kind is str:
            node = ["S", obj]
        elif kind is bytes:
            node = ["Y", bytes.hex(obj)]
        else:
            if kind is list or kind is tuple:
                children = list(obj)
            elif kind is set or kind is frozenset:
                children = list(obj)
            elif kind is dict:
                children = [x for pair in dict.items(obj) for x in pair]
            elif getattr(kind, "__name__", None) in classes:
                attrs = object.__getattribute__(obj, "__dict__")
                if type(attrs) is not dict or any(type(k) is not str for k in attrs):
                    raise _PlainError(kind.__name__)
                children = list(dict.values(attrs))
            else:
                raise _PlainError(getattr(kind, "__name__", "?"))
            if not ready:
                if key in active:
                    raise _PlainError("cycle")
                active.add(key)
                stack.append((obj, True))
                for child in reversed(children):
                    if id(child) in active:
                        raise _PlainError("cycle")
                    stack.append((child, False))
                continue
            active.discard(key)
            ids = [index[id(c)] for c in children]
            if kind is list:
                node = ["L", ids]
            elif kind is tuple:
                node = ["T", ids]
            elif kind is set:
                node = ["E", ids]
            elif kind is frozenset:
                node = ["Z", ids]
            elif kind is dict:
                node = ["D", ids]
            else:
                node = ["O", kind.__name__, [[k, i] for k, i in zip(attrs, ids)]]
        # Every object walked is reachable from ``value``, so no id() is reused meanwhile.
        index[key] = len(nodes)
        nodes.append(node)
        if len(nodes) > max_nodes:
            raise _PlainError("too large")
    return nodes

def _plain_decode(nodes, classes=None, max_nodes=1000000, bounds=None):
    # ``classes``: name -> class for "O" nodes (None: objects are not accepted).
    # ``bounds``: None (trusted input), or (max_expanded, max_items, max_same_hash): the most
    # nodes the value (and, together, every set item and dict key hashed while building it)
    # would have with shared nodes expanded, a string counting one node per 16 characters;
    # the most items of one container; the most items of one set or dict with one hash.
    # Everything a check does to a value (==, hash, repr, a walk) costs its expanded size, not
    # its text's: a tuple referencing one node twice, 64 levels deep, is 64 nodes of text
    # and 2**64 to hash.
    if type(nodes) is not list or not nodes or len(nodes) > max_nodes:
        raise _PlainError("malformed")
    if bounds is not None:
        max_expanded, max_items, max_same_hash = bounds
        weight = []
        hashed = 0
    built = []
    for node in nodes:
        if type(node) is not list or not node or type(node[0]) is not str:
            raise _PlainError("malformed")
        tag, n = node[0], len(node)
        if tag == "N" and n == 1:
            built.append(None)
            if bounds is not None:
                weight.append(1)
            continue
        if n < 2:
            raise _PlainError("malformed")
        arg = node[1]
        if tag == "B" and n == 2 and arg in (0, 1) and type(arg) is int:
            built.append(arg == 1)
        elif tag == "I" and n == 2 and type(arg) is str and len(arg) <= 100000:
            built.append(int(arg, 16))
        elif tag == "F" and n == 2 and type(arg) is str and len(arg) <= 40:
            built.append(float(arg))
        elif tag == "S" and n == 2 and type(arg) is str:
            built.append(arg)
        elif tag == "Y" and n == 2 and type(arg) is str:
            built.append(bytes.fromhex(arg))
        elif tag in "LTEZD" and n == 2 and len(tag) == 1 and type(arg) is list:
            here = len(built)
            for i in arg:
                if type(i) is not int or not 0 <= i < here:
                    raise _PlainError("malformed")
            items = [built[i] for i in arg]
            if bounds is not None:
                if len(arg) > max_items:
                    raise _PlainBound("container of %d items" % len(arg))
                size = 1
                for i in arg:
                    size += weight[i]
                weight.append(size if size <= max_expanded else max_expanded + 1)
                if tag in "EZD":
                    keys = arg if tag != "D" else arg[0::2]
                    for i in keys:
                        hashed += weight[i]
                    if hashed > max_expanded:
                        raise _PlainBound("hashing %d+ expanded nodes" % hashed)
                    same = {}
                    for item in (items if tag != "D" else items[0::2]):
                        h = hash(item)
                        count = same.get(h, 0) + 1
                        if count > max_same_hash:
                            raise _PlainBound("more than %d keys with one hash" % max_same_hash)
                        same[h] = count
            if tag == "L":
                built.append(items)
            elif tag == "T":
                built.append(tuple(items))
            elif tag == "E":
                built.append(set(items))
            elif tag == "Z":
                built.append(frozenset(items))
            else:
                if len(items) % 2:
                    raise _PlainError("malformed")
                built.append(dict(zip(items[0::2], items[1::2])))
            continue
        elif tag == "O" and n == 3 and classes is not None and arg in classes \
                and type(node[2]) is list:
            cls = classes[arg]
            obj = cls.__new__(cls)
            here = len(built)
            size = 1
            for pair in node[2]:
                if (type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str
                        or type(pair[1]) is not int or not 0 <= pair[1] < here):
                    raise _PlainError("malformed")
                obj.__dict__[pair[0]] = built[pair[1]]
                if bounds is not None:
                    size += weight[pair[1]]
            if bounds is not None:
                if len(node[2]) > max_items:
                    raise _PlainBound("object of %d attributes" % len(node[2]))
                weight.append(size if size <= max_expanded else max_expanded + 1)
            built.append(obj)
            continue
        else:
            raise _PlainError("malformed")
        if bounds is not None:  # an atom: one node, and one per 16 characters of its text
            weight.append(1 + (len(arg) >> 4 if type(arg) is str else 0))
    if bounds is not None and weight[-1] > max_expanded:
        raise _PlainBound("%d+ nodes with shared nodes expanded" % weight[-1])
    return built[-1]
'''

_CODEC: dict[str, Any] = {"__name__": "corrgrpo_envs.sandbox.calls.codec"}
exec(compile(PLAIN_SOURCE, "<plain codec>", "exec"), _CODEC)

#: Raised by :func:`encode`/:func:`decode` for values that are not plain data.
NotPlain: type[Exception] = _CODEC["_PlainError"]

#: Raised by :func:`decode` for a record over its bounds (a subclass of :data:`NotPlain`).
OverBound: type[Exception] = _CODEC["_PlainBound"]


def encode(value: Any, classes: Sequence[str] = ()) -> list:
    """``value`` as a node list (raises :class:`NotPlain`); objects only of the named classes."""
    return _CODEC["_plain_encode"](value, tuple(classes), MAX_NODES)


def decode(nodes: Any, classes: dict[str, type] | None = None, bounded: bool = True) -> Any:
    """The value of a node list (raises :class:`NotPlain` on anything malformed).

    ``classes`` maps the names allowed in ``"O"`` nodes to the (trusted) classes
    that are instantiated for them, without calling their ``__init__``. ``bounded``
    (the default; off only for trusted input): raise :class:`OverBound` for a value
    over :data:`MAX_EXPANDED`, :data:`MAX_ITEMS` or :data:`MAX_SAME_HASH`, checked
    in time linear in the node list before any set or dict is built.
    """
    bounds = (MAX_EXPANDED, MAX_ITEMS, MAX_SAME_HASH) if bounded else None
    try:
        return _CODEC["_plain_decode"](nodes, classes, MAX_NODES, bounds)
    except NotPlain:
        raise
    except MemoryError:
        raise OverBound("out of memory") from None
    except (TypeError, ValueError, AttributeError, OverflowError, RecursionError) as exc:
        # unhashable dict keys or set items, bad hex, a float that is not one
        raise NotPlain(f"malformed ({type(exc).__name__})") from None


def calls_program(source: str, entry: str, inputs: Sequence[str], classes: Sequence[str] = ()) -> str:
    """``source`` with a first-line directive: call ``entry`` on each input.

    ``inputs`` are JSON texts of ``encode((args, kwargs))``; ``classes`` names the
    classes whose instances count as plain data. The program's line numbers stay
    the same (the directive takes the place of nothing: ``source`` starts on line 2).
    """
    directive = {"entry": entry, "inputs": list(inputs), "classes": list(classes)}
    return CALLS_DIRECTIVE + json.dumps(directive) + "\n" + source


class CallRecord:
    """What the channel said about one call: ``kind`` R (returned), X (raised) or P (not plain)."""

    __slots__ = ("kind", "detail")

    def __init__(self, kind: str, detail: str):
        self.kind = kind
        self.detail = detail

    def __repr__(self) -> str:
        return f"CallRecord({self.kind!r}, {self.detail[:40]!r})"


def channel_text(raw: str, token: str) -> str:
    """The lines of a status channel that carry the run's token, without it."""
    prefix = token + " "
    return "".join(line[len(prefix):] + "\n" for line in raw.split("\n") if line.startswith(prefix))


def parse_channel(text: str) -> tuple[str | None, float, dict[int, CallRecord] | None]:
    """``(status, seconds, records)`` from :attr:`RunResult.channel` (see :func:`channel_text`).

    ``status`` is the runner's final line (``None`` when absent); ``records`` maps
    call index to its record, or is ``None`` when the channel holds two records
    for the same call (only a program that writes its own records does that).
    """
    status: str | None = None
    seconds = 0.0
    records: dict[int, CallRecord] | None = {}
    for line in text.split("\n"):
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0] in ("R", "X", "P"):
            try:
                i = int(parts[1])
            except ValueError:
                continue
            if records is not None:
                if i in records:
                    records = None
                else:
                    records[i] = CallRecord(parts[0], parts[2])
        elif len(parts) == 2 and status is None:
            status = parts[0]
            try:
                seconds = float(parts[1])
            except ValueError:
                seconds = 0.0
    return status, seconds, records
