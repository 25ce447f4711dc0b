"""The seven rewards of the code domain, as pure functions.

``format``, ``syntax``, ``compile`` and ``ast_similarity`` look at text only;
``runtime``, ``correct`` and ``efficiency`` come from the verdict on the
candidate's values (:mod:`corrgrpo_envs.code.verdicts`). Every text scan here is
linear in the answer's length.
"""

from __future__ import annotations

import ast
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
    "efficiency",
]

#: Longest code block that is parsed and compared (5x the longest LeetCodeDataset solution).
MAX_CODE_CHARS = 20_000

#: ``ast_similarity`` is 0 where sizes alone keep the ratio below this (one sequence ~40x the other).
MIN_SIMILARITY_BOUND = 0.05

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


def ast_similarity(candidate: str | list[str] | None, reference: str | list[str] | None) -> float:
    """difflib ratio (autojunk off) of the two type sequences; 0 when either does not parse,
    or when their lengths alone keep the ratio below :data:`MIN_SIMILARITY_BOUND`."""
    a = ast_type_sequence(candidate) if isinstance(candidate, str) else candidate
    b = ast_type_sequence(reference) if isinstance(reference, str) else reference
    if not a or not b:
        return 0.0
    if 2 * min(len(a), len(b)) < MIN_SIMILARITY_BOUND * (len(a) + len(b)):
        # The ratio cannot reach MIN_SIMILARITY_BOUND (it is at most 2 min / (len a + len b)),
        # and difflib's time grows with the product of the lengths.
        return 0.0
    return float(difflib.SequenceMatcher(None, a, b, autojunk=False).ratio())


def efficiency(correct: bool, t_candidate: float, t_reference: float | None) -> float:
    """``clip(1 - t_candidate / t_reference, 0, 1)`` for a correct answer, else 0."""
    if not correct or t_reference is None or t_reference <= 0:
        return 0.0
    return float(min(1.0, max(0.0, 1.0 - t_candidate / t_reference)))
