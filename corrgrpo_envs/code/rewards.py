"""The seven rewards of the code domain, as pure functions.

``format``, ``syntax``, ``compile`` and ``ast_similarity`` look at text only;
``runtime``, ``correct`` and ``efficiency`` come from the verdict on the
candidate's values (:mod:`corrgrpo_envs.code.verdicts`). Every text scan here is
linear in the answer's length, and :func:`bounded_similarity` stops at a fixed amount
of work; ``compile`` runs CPython's compiler, whose constant folding and nested code
objects cost more than linear time, so the env runs :func:`compiles` in a judge worker
under a CPU deadline (:meth:`corrgrpo_envs.code.judge_pool.JudgePool.compiles`).
"""

from __future__ import annotations

import ast
import bisect
import difflib
import re
import threading
from dataclasses import dataclass

__all__ = [
    "REWARD_NAMES",
    "DEFAULT_WEIGHTS",
    "CodeBlock",
    "fenced_blocks",
    "choose_block",
    "entry_pattern",
    "judged_program",
    "parse_python",
    "parse_code",
    "syntax_ok",
    "compiles",
    "ast_type_sequence",
    "ast_similarity",
    "bounded_similarity",
    "efficiency",
]

#: Longest code block that is parsed and compared (5x the longest LeetCodeDataset solution).
MAX_CODE_CHARS = 20_000

#: ``ast_similarity`` is 0 where sizes alone keep the ratio below this (one sequence ~40x the other).
MIN_SIMILARITY_BOUND = 0.05

#: Steps of the longest-match searches one ``ast_similarity`` may take (one step: one candidate
#: node looked up, or one place in the reference where it occurs), about 0.3 s of CPU; past it
#: the similarity is 0. An honest answer takes far fewer: the largest measured, three long
#: LeetCode solutions in one answer against the longest reference shipped, 1.4 million.
SIMILARITY_WORK_LIMIT = 3_000_000

REWARD_NAMES = ("format", "syntax", "compile", "runtime", "correct", "ast_similarity", "efficiency")
DEFAULT_WEIGHTS = (0.05, 0.05, 0.05, 0.25, 0.60, 0.30, 0.20)

_PYTHON_TAGS = {"python", "py", "python3", ""}
_TAG_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+-")


@dataclass(frozen=True)
class CodeBlock:
    language: str
    code: str


def _fences(text: str):
    """``(tag, body)`` of every closed fenced block, in order, in one pass over ``text``.

    A block opens at three backticks, takes the rest of that line as its info
    string (the tag is its leading run of letters, digits, ``_+-`` after blanks)
    and closes at the next three backticks after the line break. Plain ``str.find``
    scans, each position visited a bounded number of times: linear time for any
    text (a regular expression here backtracks quadratically on long runs of
    backticks or of blank lines).
    """
    pos = 0
    while True:
        start = text.find("```", pos)
        if start < 0:
            return
        newline = text.find("\n", start + 3)
        if newline < 0:
            return  # no later fence can open either
        end = text.find("```", newline + 1)
        if end < 0:
            return  # nor close
        info = text[start + 3 : newline].lstrip(" \t")
        n = 0
        while n < len(info) and info[n] in _TAG_CHARS:
            n += 1
        yield info[:n], text[newline + 1 : end]
        pos = end + 3


def fenced_blocks(text: str) -> list[CodeBlock]:
    """Every closed fenced block tagged ``python``, ``py``, ``python3`` or untagged."""
    return [CodeBlock(tag.lower(), body) for tag, body in _fences(text) if tag.lower() in _PYTHON_TAGS]


def entry_pattern(entry_point: str) -> re.Pattern[str]:
    """What the chosen block must define: ``class Solution`` for ``Solution().f``, else ``def f``."""
    # Blanks are [ \t\f] only: ``\s`` would also match line breaks, and ``^\s*`` then backtracks
    # over every following blank line from every line start (quadratic on 10^5 blank lines).
    if "(" in entry_point or "." in entry_point:
        cls = entry_point.split("(")[0].split(".")[0].strip()
        return re.compile(rf"^[ \t\f]*class[ \t\f]+{re.escape(cls)}\b", re.MULTILINE)
    return re.compile(rf"^[ \t\f]*def[ \t\f]+{re.escape(entry_point.strip())}[ \t\f]*\(", re.MULTILINE)


def choose_block(text: str, entry_point: str) -> tuple[str | None, bool]:
    """``(code, has_entry)``: the longest block holding the entry, else the longest block
    (the first of equally long ones)."""
    pattern = entry_pattern(entry_point)
    longest: str | None = None
    holding: str | None = None
    for tag, body in _fences(text):
        if tag.lower() not in _PYTHON_TAGS:
            continue
        if longest is None or len(body) > len(longest):
            longest = body
        if (holding is None or len(body) > len(holding)) and pattern.search(body):
            holding = body
    if holding is not None:
        return holding, True
    return longest, False


def judged_program(prompt: str, code: str, test: str, entry_point: str) -> str:
    """``prompt + code + test + check(entry_point)``, one piece per line (what ``compile``
    compiles; it never runs as one program)."""
    return f"{prompt}\n{code}\n{test}\ncheck({entry_point})\n"


# CPython 3.11 keeps the depth counter of its AST-object builder in state shared by
# every thread, so two concurrent ``ast.parse`` calls (the env scores answers on a
# thread pool) can trip its consistency check with a spurious ``SystemError`` (CPython
# gh-106905, fixed in later releases). Parsing under one lock keeps threads apart; a
# re-entrant call in the same thread (a finalizer run by the garbage collector mid-
# parse) can still trip it, and one retry covers that.
_PARSE_LOCK = threading.RLock()
_DEPTH_MISMATCH = "recursion depth mismatch"


def parse_python(source: str) -> ast.Module:
    """``ast.parse(source)``, safe to call from several threads at once.

    Raises what ``ast.parse`` raises (``SyntaxError``, ``ValueError``, ``MemoryError``,
    ``RecursionError``), never the interpreter's spurious depth-mismatch ``SystemError``
    more than once in a row.
    """
    with _PARSE_LOCK:
        try:
            return ast.parse(source)
        except SystemError as error:
            if _DEPTH_MISMATCH not in str(error):
                raise
            return ast.parse(source)


def parse_code(code: str) -> ast.Module | None:
    """The block's syntax tree; ``None`` when it is blank, does not parse, or is longer
    than :data:`MAX_CODE_CHARS` (judged as not parseable: parsing and comparing
    such a block would cost more than any answer is worth)."""
    if len(code) > MAX_CODE_CHARS or not code.strip():
        return None
    try:
        return parse_python(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def syntax_ok(code: str) -> bool:
    """Non-empty, at most :data:`MAX_CODE_CHARS` characters, and parses with ``ast.parse``."""
    return parse_code(code) is not None


def compiles(program: str) -> bool:
    """The whole program compiles (``compile(..., "exec")``; nothing runs)."""
    try:
        compile(program, "<program>", "exec")
    except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError):
        return False
    return True


def ast_type_sequence(code: str | ast.AST) -> list[str] | None:
    """Pre-order AST node type names with a closing marker per node; ``None`` if unparseable."""
    if isinstance(code, ast.AST):
        tree: ast.AST = code
    else:
        try:
            tree = parse_python(code)
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            return None
    out: list[str] = []
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:  # iterative: deeply nested candidates must not overflow the host's stack
        node, closing = stack.pop()
        name = type(node).__name__
        if closing:
            out.append("/" + name)
            continue
        out.append(name)
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(list(ast.iter_child_nodes(node))))
    return out


class _WorkLimitReached(Exception):
    """A longest-match search would go past the matcher's work limit."""


class _BoundedMatcher(difflib.SequenceMatcher):
    """difflib's matcher (autojunk off, no junk) whose longest-match search counts its steps.

    difflib finds the longest match by scanning, for each element of ``a`` in range, every
    place of that element in ``b`` up to the end of the range (the places before its start
    too): the work of one search grows with ``len(a) * len(b)``, and the recursion of
    :meth:`get_matching_blocks` repeats it once per matching block, so an answer made of
    many short matches costs about the cube of the sizes. Here the search looks only at the
    places inside the range (found by bisection) and counts them; the result is difflib's
    exactly (the longest match, the earliest in ``a`` then in ``b`` among equally long ones:
    with no junk, difflib's extension loops never extend it), so :meth:`ratio` is difflib's.
    """

    def __init__(self, a: list[str], b: list[str], work_limit: int):
        self.work = 0
        self.work_limit = work_limit
        super().__init__(None, a, b, autojunk=False)
        places: dict[str, list[int]] = {}
        for j, item in enumerate(b):
            places.setdefault(item, []).append(j)
        self._places = places

    def find_longest_match(self, alo: int = 0, ahi: int | None = None, blo: int = 0,
                           bhi: int | None = None) -> difflib.Match:
        a, places, limit = self.a, self._places, self.work_limit
        ahi = len(a) if ahi is None else ahi
        bhi = len(self.b) if bhi is None else bhi
        work = self.work
        besti, bestj, bestsize = alo, blo, 0
        ending: dict[int, int] = {}  # j -> length of the match ending at (i - 1, j)
        for i in range(alo, ahi):
            where = places.get(a[i], ())
            first = bisect.bisect_left(where, blo)
            last = bisect.bisect_left(where, bhi, first)
            work += 1 + last - first
            if work > limit:
                self.work = work
                raise _WorkLimitReached
            longer: dict[int, int] = {}
            previous = ending.get
            for j in where[first:last]:
                k = longer[j] = previous(j - 1, 0) + 1
                if k > bestsize:
                    besti, bestj, bestsize = i - k + 1, j - k + 1, k
            ending = longer
        self.work = work
        return difflib.Match(besti, bestj, bestsize)


def _sequence(code: str | list[str] | None) -> list[str] | None:
    return ast_type_sequence(code) if isinstance(code, str) else code


def bounded_similarity(candidate: str | list[str] | None, reference: str | list[str] | None,
                       work_limit: int = SIMILARITY_WORK_LIMIT) -> float | None:
    """:func:`ast_similarity`, or ``None`` when computing it would take more than
    ``work_limit`` steps (:data:`SIMILARITY_WORK_LIMIT`): a deterministic bound, the same on
    every machine, on the host's CPU time (about 0.1 microsecond per step)."""
    a, b = _sequence(candidate), _sequence(reference)
    if not a or not b:
        return 0.0
    if 2 * min(len(a), len(b)) < MIN_SIMILARITY_BOUND * (len(a) + len(b)):
        # The ratio cannot reach MIN_SIMILARITY_BOUND (it is at most 2 min / (len a + len b)).
        return 0.0
    matcher = _BoundedMatcher(a, b, work_limit)
    try:
        return float(matcher.ratio())
    except _WorkLimitReached:
        return None


def ast_similarity(candidate: str | list[str] | None, reference: str | list[str] | None) -> float:
    """difflib ratio (autojunk off) of the two type sequences; 0 when either does not parse,
    when their lengths alone keep the ratio below :data:`MIN_SIMILARITY_BOUND`, or when it
    would take more than :data:`SIMILARITY_WORK_LIMIT` steps (:func:`bounded_similarity`)."""
    value = bounded_similarity(candidate, reference)
    return 0.0 if value is None else value


def efficiency(correct: bool, t_candidate: float, t_reference: float | None) -> float:
    """``clip(1 - t_candidate / t_reference, 0, 1)`` for a correct answer, else 0."""
    if not correct or t_reference is None or t_reference <= 0:
        return 0.0
    return float(min(1.0, max(0.0, 1.0 - t_candidate / t_reference)))
