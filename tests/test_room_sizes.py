"""Rooms stay readable: no module of the library over about 600 lines, no class over about 300.

A module or class that outgrows these is doing more than one thing; split it by concern (as the
OpenEnv client and the config were) rather than raising the bound.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("corrgrpo", "corrgrpo_envs", "corrgrpo_registry", "corrgrpo_sandbox", "agents", "trainer")
MAX_MODULE_LINES = 600
#: about 300: a class's body lines, docstrings included
MAX_CLASS_LINES = 320


def _modules() -> list[Path]:
    # corrgrpo/ holds links to agents/ and trainer/: count each file once
    return sorted({p.resolve() for package in LIBRARY for p in (ROOT / package).rglob("*.py")})


def test_no_module_is_over_about_600_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines()) for p in _modules()}
    assert len(sizes) > 100
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_no_class_is_over_about_300_lines():
    big = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                big[f"{path.relative_to(ROOT)}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert big == {}
