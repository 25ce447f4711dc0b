"""The seven rewards of the code domain, as pure functions.

``format``, ``syntax``, ``compile`` and ``ast_similarity`` look at text only;
``runtime``, ``correct`` and ``efficiency`` come from running the judged
program (``prompt + code + test + check(entry_point)``) in a sandbox.
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass

__all__ = [
    "REWARD_NAMES",
    "DEFAULT_WEIGHTS",
    "CodeBlock",
    "fenced_blocks",
    "choose_block",
    "entry_pattern",
    "judged_program",
    "syntax_ok",
    "compiles",
    "ast_type_sequence",
    "ast_similarity",
    "efficiency",
]

REWARD_NAMES = ("format", "syntax", "compile", "runtime", "correct", "ast_similarity", "efficiency")
DEFAULT_WEIGHTS = (0.05, 0.05, 0.05, 0.25, 0.60, 0.30, 0.20)

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"python", "py", "python3", ""}


@dataclass(frozen=True)
class CodeBlock:
    language: str
    code: str


def fenced_blocks(text: str) -> list[CodeBlock]:
    """Every closed fenced block tagged ``python``, ``py``, ``python3`` or untagged."""
    return [
        CodeBlock(m.group(1).lower(), m.group(2))
        for m in _FENCE.finditer(text)
        if m.group(1).lower() in _PYTHON_TAGS
    ]


def entry_pattern(entry_point: str) -> re.Pattern[str]:
    """What the chosen block must define: ``class Solution`` for ``Solution().f``, else ``def f``."""
    if "(" in entry_point or "." in entry_point:
        cls = entry_point.split("(")[0].split(".")[0].strip()
        return re.compile(rf"^\s*class\s+{re.escape(cls)}\b", re.MULTILINE)
    return re.compile(rf"^\s*def\s+{re.escape(entry_point.strip())}\s*\(", re.MULTILINE)


def choose_block(text: str, entry_point: str) -> tuple[str | None, bool]:
    """``(code, has_entry)``: the longest block holding the entry, else the longest block."""
    blocks = fenced_blocks(text)
    if not blocks:
        return None, False
    pattern = entry_pattern(entry_point)
    holding = [b.code for b in blocks if pattern.search(b.code)]
    if holding:
        return max(holding, key=len), True
    return max((b.code for b in blocks), key=len), False


def judged_program(prompt: str, code: str, test: str, entry_point: str) -> str:
    """``prompt + code + test + check(entry_point)``, one piece per line."""
    return f"{prompt}\n{code}\n{test}\ncheck({entry_point})\n"


def syntax_ok(code: str) -> bool:
    """Non-empty and parses with ``ast.parse``."""
    if not code.strip():
        return False
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def compiles(program: str) -> bool:
    """The whole program compiles (``compile(..., "exec")``; nothing runs)."""
    try:
        compile(program, "<program>", "exec")
    except (SyntaxError, ValueError, OverflowError, MemoryError, RecursionError):
        return False
    return True


def ast_type_sequence(code: str) -> list[str] | None:
    """Pre-order AST node type names with a closing marker per node; ``None`` if unparseable."""
    try:
        tree = ast.parse(code)
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
    """difflib ratio (autojunk off) of the two type sequences; 0 when either does not parse."""
    a = ast_type_sequence(candidate) if isinstance(candidate, str) else candidate
    b = ast_type_sequence(reference) if isinstance(reference, str) else reference
    if not a or not b:
        return 0.0
    return float(difflib.SequenceMatcher(None, a, b, autojunk=False).ratio())


def efficiency(correct: bool, t_candidate: float, t_reference: float | None) -> float:
    """``clip(1 - t_candidate / t_reference, 0, 1)`` for a correct answer, else 0."""
    if not correct or t_reference is None or t_reference <= 0:
        return 0.0
    return float(min(1.0, max(0.0, 1.0 - t_candidate / t_reference)))
