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

The codec is one module (:mod:`corrgrpo_sandbox.inside.plain`): the runner carries its
source (:data:`PLAIN_SOURCE`) into the sandbox (whose interpreter cannot import this
package) and the host imports it. The directive's prefix (:data:`CALLS_DIRECTIVE`) lives
with the runner that reads it (:mod:`corrgrpo_sandbox.inside.boot`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from corrgrpo_sandbox.inside import plain as _codec
from corrgrpo_sandbox.inside import source
from corrgrpo_sandbox.inside.boot import CALLS_DIRECTIVE

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

#: The codec's source (:mod:`corrgrpo_sandbox.inside.plain`), for programs that carry it.
PLAIN_SOURCE = source("plain")

#: Raised by :func:`encode`/:func:`decode` for values that are not plain data.
NotPlain: type[Exception] = _codec._PlainError

#: Raised by :func:`decode` for a record over its bounds (a subclass of :data:`NotPlain`).
OverBound: type[Exception] = _codec._PlainBound


def encode(value: Any, classes: Sequence[str] = ()) -> list:
    """``value`` as a node list (raises :class:`NotPlain`); objects only of the named classes."""
    return _codec._plain_encode(value, tuple(classes), MAX_NODES)


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
        return _codec._plain_decode(nodes, classes, MAX_NODES, bounds)
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
