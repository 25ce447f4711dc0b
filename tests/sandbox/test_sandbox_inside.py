"""The code that runs inside a sandbox (``corrgrpo_sandbox/inside``): real modules, sent as text.

Each module must run in a ``python -I -S`` interpreter that has only the standard library and
sees the modules joined into one program: no ``from __future__`` (it must open a file), no
import of a third-party package, and every name taken from an earlier module of the program
must be defined there. The joined programs compile, and no function is long.
"""

from __future__ import annotations

import ast
import sys

import pytest

from corrgrpo_sandbox import carryover, docker_relay, inside, runner

MODULES = ("plain", "boot", "server_state", "server", "relay", "carryover_probes")


def _tree(module: str) -> ast.Module:
    return ast.parse(inside.source(module), f"inside/{module}.py")


def _top_level_names(module: str) -> set[str]:
    names = set()
    for node in _tree(module).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        names.add(name.id)
    return names


@pytest.mark.parametrize("module", MODULES)
def test_a_module_imports_only_the_standard_library(module):
    tree = _tree(module)
    guarded = set()
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            guarded.update(id(n) for n in ast.walk(node))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            pytest.fail(f"{module}: from __future__ cannot sit in the middle of a joined program")
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in guarded:
            tops = [a.name.split(".")[0] for a in node.names] if isinstance(node, ast.Import) \
                else [(node.module or "").split(".")[0]]
            assert all(t in sys.stdlib_module_names for t in tops), (module, tops)


@pytest.mark.parametrize("module", MODULES)
def test_what_a_module_takes_from_another_is_defined_there(module):
    for node in _tree(module).body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"):
            continue
        for imp in node.body:
            assert isinstance(imp, ast.ImportFrom) and imp.module.startswith(inside.__name__)
            other = imp.module.rsplit(".", 1)[1]
            assert MODULES.index(other) < MODULES.index(module), (module, other)
            missing = {a.name for a in imp.names} - _top_level_names(other)
            assert not missing, f"{module} takes {sorted(missing)} from {other}, which lacks them"


@pytest.mark.parametrize("module", MODULES)
def test_no_function_is_long(module):
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.FunctionDef):
            assert node.end_lineno - node.lineno < 60, (module, node.name)


def test_the_joined_programs_compile_and_start_as_before():
    programs = {
        "runner": runner.RUNNER_SOURCE, "server": runner.SERVER_SOURCE,
        "relay": docker_relay.RELAY_SOURCE,
        "server relay": docker_relay.relay_command("python3", {"mode": "server"})[4],
        "carry-over change": carryover.change_program(), "carry-over read": carryover.read_program(),
    }
    for name, text in programs.items():
        compile(text, name, "exec")
    assert runner.RUNNER_SOURCE.endswith("\n_corrgrpo_boot()\n")
    assert runner.SERVER_SOURCE.endswith("\n_corrgrpo_serve()\n")
    assert programs["server relay"].startswith(runner.SERVER_DEFINITIONS)
    assert programs["server relay"].endswith("\n_relay_main()\n")
    # the relay's own quit replaces the server's: it comes later in the program
    text = programs["server relay"]
    assert text.rindex("def _corrgrpo_quit(") > text.index("def _corrgrpo_quit(")
