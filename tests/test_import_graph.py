"""No import cycle among the modules of each top-level package.

The graph is read from the source with ``ast`` (nothing is imported): an edge for every
``import`` and ``from ... import`` of a module of the same checkout, at module level or inside
a function, to the module itself (``from pkg import name`` goes to ``pkg.name`` when that is a
module, else to ``pkg``). Imports under ``if TYPE_CHECKING:`` are left out: they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Packages whose graphs must be acyclic (agents/ too: its one cycle is type-only).
PACKAGES = ("corrgrpo_sandbox", "corrgrpo_envs", "trainer", "corrgrpo_registry", "agents")
#: Folders imported under another name: the trainer and the agents are ``corrgrpo.trainer`` and
#: ``corrgrpo.agents`` (corrgrpo/ links to them).
IMPORT_NAMES = {"trainer": "corrgrpo.trainer", "agents": "corrgrpo.agents"}


def module_files(package: str) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` file of ``package`` (``__init__`` as the package)."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        parts[:1] = IMPORT_NAMES.get(parts[0], parts[0]).split(".")
        out[".".join(parts)] = path
    return out


def _runtime_nodes(tree: ast.AST):
    """Every node but those under ``if TYPE_CHECKING:`` (the ``else`` branch still counts)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that ``name`` (at ``path``) imports at run time."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join(here + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes (first == last), or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def import_graph(package: str) -> dict[str, set[str]]:
    """``{module: modules of the same package it imports}``."""
    modules = module_files(package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    graph = import_graph(package)
    assert len(graph) > 1, f"no modules found under {package}/"
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_check_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_sandbox_imports_no_other_package_of_the_checkout():
    others = ("corrgrpo", "corrgrpo_envs", "trainer", "agents", "corrgrpo_registry", "bench", "studies")
    for name, path in module_files("corrgrpo_sandbox").items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                targets = [a.name for a in node.names] if isinstance(node, ast.Import) \
                    else [node.module or ""]
                assert not any(t.split(".")[0] in others for t in targets), (name, targets)
